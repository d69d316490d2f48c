"""Partial attention over disjoint key sets, merged by log-sum-exp (lse_merge.py), equals the
softmax over all keys; each rank ends with its own heads."""

import pytest
import torch

from atomk31.distributed.lse_merge import combine, merge_partials
from atomk31.ops.sparse_mla import softmax_attend
from thread_ranks import run_ranks


def partials(scores: torch.Tensor, values: torch.Tensor, owner: torch.Tensor, world: int):
    """Per rank: softmax_attend over the keys it owns (owner[s] == rank)."""
    return [softmax_attend(scores.masked_fill((owner != r)[None, None, :], -torch.inf), values)
            for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_merged_partials_equal_attention_over_every_key(world):
    g = torch.Generator().manual_seed(world)
    rows, heads, keys = 5, 8, 23
    scores = torch.randn(rows, heads, keys, generator=g) * 3
    scores[0, :, 4:] = -torch.inf                         # a row with keys on a few ranks only
    values = torch.randn(keys, 16, generator=g)
    owner = torch.arange(keys) % world
    expected, _ = softmax_attend(scores, values)
    parts = partials(scores, values, owner, world)

    def rank_body(comm):
        out, lse = parts[comm.rank]
        return merge_partials(out, lse, comm)

    merged = run_ranks(world, rank_body)
    share = heads // world
    for rank, got in enumerate(merged):
        want = expected[:, rank * share:(rank + 1) * share]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_row_without_keys_anywhere_merges_to_zero():
    outs = torch.zeros(3, 2, 4, 8)
    lses = torch.full((3, 2, 4), -torch.inf)
    assert torch.equal(combine(outs, lses), torch.zeros(2, 4, 8))


def test_heads_that_do_not_split_are_refused():
    def rank_body(comm):
        return merge_partials(torch.zeros(1, 3, 4), torch.zeros(1, 3), comm)

    with pytest.raises(ValueError, match="3 heads do not split over 2 ranks"):
        run_ranks(2, rank_body)
