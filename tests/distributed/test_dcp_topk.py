"""The DCP top-k (atomk31/distributed/dcp_topk.py) selects exactly the single-device top-k.

Scores are built to tie: small integers, so many keys of a row share the threshold score, on
several ranks at once; -0.0 next to +0.0; rows whose position leaves some ranks without keys;
rows with fewer candidates than k. Each rank sees the columns it would hold under the
round-robin layout (global position p on rank p % W at local position p // W); the union of
the ranks' selections must be `topk_positions_torch` of the whole matrix, exactly.
"""

import pytest
import torch

from atomk31.distributed.dcp_topk import dcp_topk_positions
from atomk31.ops.topk import topk_positions_torch
from thread_ranks import run_ranks


def tied_scores(num_rows: int, length: int, num_values: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, num_values, (num_rows, length), generator=g).float()
    negative_zero = (scores == 0) & (torch.rand(num_rows, length, generator=g) < 0.5)
    return torch.where(negative_zero, -0.0, scores)


def dcp_selection(scores: torch.Tensor, positions: torch.Tensor, k: int, world: int,
                  exchanges: list | None = None) -> torch.Tensor:
    """[Nq, k] global positions selected by `world` ranks (ascending, -1 padded)."""
    def rank_body(comm):
        if exchanges is not None:
            original = comm.all_gather

            def counted(x):
                exchanges.append(comm.rank)
                return original(x)
            comm.all_gather = counted
        local = scores[:, comm.rank::world]
        chosen = dcp_topk_positions(local, k, positions, comm)
        return torch.where(chosen >= 0, chosen * world + comm.rank, -1)

    picked = torch.cat(run_ranks(world, rank_body), dim=1)
    picked = torch.sort(torch.where(picked >= 0, picked, scores.shape[1] + 1), dim=1).values
    picked = torch.where(picked <= scores.shape[1], picked, -1)[:, :k]
    return picked


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("k,num_values", [(1, 3), (5, 2), (16, 4), (7, 40)],
                         ids=["k1-3values", "k5-2values", "k16-4values", "k7-40values"])
def test_dcp_topk_equals_single_device_topk_with_ties(world, k, num_values):
    length = 50
    scores = tied_scores(24, length, num_values, seed=world * 100 + k)
    # rows at every kind of position: before some ranks have a key, within k, far beyond
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 15, 16, 17, 20, 25, 31, 33,
                              40, 44, 45, 47, 48, 49, 49])
    expected = topk_positions_torch(scores, k, positions + 1).long()
    got = dcp_selection(scores, positions, k, world)
    assert torch.equal(got, expected), (got - expected).abs().sum(1)


def test_all_equal_scores_take_the_lowest_positions_across_ranks():
    """Every key of a row ties: the selection is decided by position alone, across ranks."""
    scores = torch.full((3, 30), 2.5)
    positions = torch.tensor([29, 10, 3])
    exchanges: list = []
    got = dcp_selection(scores, positions, 8, 4, exchanges)
    assert torch.equal(got, topk_positions_torch(scores, 8, positions + 1).long())
    assert got[0].tolist() == list(range(8))
    assert len(exchanges) == 2 * 4, "a straddling tie needs the positions exchange"


def test_distinct_scores_exchange_scores_only():
    """Without a tie at the threshold one exchange (the candidate scores) suffices."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(6, 40, generator=g)
    positions = torch.tensor([39, 39, 20, 8, 2, 35])
    exchanges: list = []
    got = dcp_selection(scores, positions, 6, 2, exchanges)
    assert torch.equal(got, topk_positions_torch(scores, 6, positions + 1).long())
    assert len(exchanges) == 2, "one all-gather per rank"
