"""Gluon multi-workgroup radix top-k against the op's torch implementation (exact).

On a GPU (``-m gpu``): ties broken by lower position, -0.0 == +0.0, -inf candidates, short
rows, k > L, k = 0, rows long enough to be split over several workgroups. On the CPU: the
ranking key's order, which is the whole correctness argument of the radix select.
"""

import pytest
import torch

from atomk31.ops.topk import topk_positions_torch


def ranking_keys(scores: torch.Tensor) -> torch.Tensor:
    """The kernel's 64-bit ranking key in torch (gluon_kernels/amd/radix_topk.py docstring)."""
    scores = torch.where(scores == 0, 0.0, scores.float())
    bits = scores.view(torch.int32).long() & 0xFFFFFFFF
    ordered = torch.where(bits >= 1 << 31, bits ^ 0xFFFFFFFF, bits | (1 << 31))
    positions = torch.arange(scores.shape[-1])
    return ordered * (1 << 32) + (0xFFFFFFFF - positions)  # may wrap to negative int64


def test_ranking_key_order_is_score_then_lower_position():
    scores = torch.tensor([1.0, -0.0, 0.0, -torch.inf, 3.5, 1.0, -2.0, torch.inf, -1e-30, 1e-30])
    keys = ranking_keys(scores)
    unsigned = keys.double() + torch.where(keys < 0, 2.0**64, 0.0)  # order as uint64
    order = torch.sort(unsigned, descending=True, stable=True).indices
    # The ranking itself (topk_positions returns its sets in position order): higher score,
    # then lower position, -0.0 equal to +0.0.
    expected = sorted(range(len(scores)), key=lambda p: (-(scores[p].item() + 0.0), p))
    assert order.tolist() == expected
    assert len(set(keys.tolist())) == len(scores), "ranking keys must be distinct"


def test_positions_of_selected_keys_sorts_positions_and_pads():
    """The launcher's final order of the k winners (pure torch): ascending positions, whatever
    order the gather's atomics left the keys in (keys of positive and negative scores, whose
    top bits differ), then -1 for the unused entries."""
    from gluon_kernels.amd.radix_topk import positions_of_selected_keys

    scores = torch.tensor([[2.0, -1.0, 0.5, -3.0, 7.0]])
    keys = ranking_keys(scores[0])
    shuffled = keys[[3, 0, 4, 1, 2]]
    selected = torch.cat([shuffled, torch.full((2,), 12345)])[None]  # two unused slots
    positions = positions_of_selected_keys(selected, torch.tensor([5]))
    assert positions.tolist() == [[0, 1, 2, 3, 4, -1, -1]]
    assert positions.dtype == torch.int32
    assert positions_of_selected_keys(selected[:, [4, 1, 2, 0]], torch.tensor([3])).tolist() \
        == [[0, 2, 4, -1]]
    assert positions_of_selected_keys(selected, torch.tensor([0])).tolist() == [[-1] * 7]


def make_scores(num_rows, length, seed, num_levels=None):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_rows, length, generator=generator)
    if num_levels is not None:  # few distinct values: many ties at the threshold
        scores = torch.round(scores * num_levels) / num_levels
    return scores


CASES = [
    pytest.param(4, 5000, 2048, "full", None, id="N4-L5000-k2048"),
    pytest.param(3, 300000, 2048, "full", 3, id="N3-L300000-k2048-ties-multi-workgroup"),
    pytest.param(5, 100, 2048, "ragged", None, id="N5-L100-k2048-short-rows"),
    pytest.param(2, 777, 64, "ragged", 1, id="N2-L777-k64-heavy-ties"),
    pytest.param(1, 1, 1, "full", None, id="N1-L1-k1"),
    pytest.param(3, 50, 0, "full", None, id="N3-L50-k0"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows,length,k,lengths_kind,num_levels", CASES)
def test_topk_positions_gluon_matches_torch(num_rows, length, k, lengths_kind, num_levels):
    check_topk_positions_gluon(num_rows, length, k, lengths_kind, num_levels)


@pytest.mark.amd
@pytest.mark.parametrize("num_rows,length,k,lengths_kind,num_levels", CASES)
def test_topk_positions_gluon_matches_torch_on_rocm(num_rows, length, k, lengths_kind,
                                                    num_levels):
    check_topk_positions_gluon(num_rows, length, k, lengths_kind, num_levels)


def check_topk_positions_gluon(num_rows, length, k, lengths_kind, num_levels):
    from gluon_kernels.amd.radix_topk import topk_positions_gluon

    scores = make_scores(num_rows, length, seed=length + k, num_levels=num_levels)
    if length > 4:
        scores[0, 1], scores[0, 2] = -0.0, 0.0
        scores[-1, 3] = -torch.inf
    if lengths_kind == "full":
        lengths = torch.full((num_rows,), length)
    else:
        lengths = torch.randint(0, length + 1, (num_rows,),
                                generator=torch.Generator().manual_seed(3))
        lengths[0] = length
    expected = topk_positions_torch(scores, k, lengths)
    actual = topk_positions_gluon(scores.cuda(), k, lengths.cuda()).cpu()
    assert torch.equal(expected, actual), (
        f"first mismatch at {torch.nonzero(expected != actual)[:3].tolist()}")
