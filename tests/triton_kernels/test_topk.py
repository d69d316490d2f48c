"""topk_triton against topk_positions_torch / positions_to_slots_torch: exactly equal (ties to
the lower position, -0.0 = +0.0, -1 padding), under Triton's interpreter on the CPU and on a
GPU at real sizes (k = 2048, rows up to 1M)."""

import pytest
import torch

from atomk31.ops.topk import positions_to_slots_torch, topk_positions_torch

KERNEL_MODULE = "atomk31.triton_kernels.topk"


def make_scores(num_rows, length, levels, seed, device="cpu"):
    """levels 0: distinct normal scores; levels n: integers in [-1, n-1) (many ties), with some
    -0.0, +0.0 and -inf sprinkled in."""
    generator = torch.Generator().manual_seed(seed)
    if levels == 0:
        scores = torch.randn(num_rows, length, generator=generator)
    else:
        scores = torch.randint(0, levels, (num_rows, length), generator=generator).float() - 1.0
    if length > 8:
        scores[:, 1::7] = -0.0
        scores[:, 2::11] = 0.0
        scores[:, 3::13] = -torch.inf
    return scores.to(device)


CASES = {
    # name: (Nq, L, k, levels, lengths)
    "ties_L300_k40": (4, 300, 40, 3, [300, 1, 170, 0]),
    "distinct_L700_k64": (3, 700, 64, 0, [700, 64, 65]),
    "k_above_L_k50_L33": (3, 33, 50, 4, [33, 17, 1]),
    "k1_L1": (1, 1, 1, 2, [1]),
    "all_equal_L500_k100": (2, 500, 100, 1, [500, 99]),
    "just_over_k_L129_k128": (2, 129, 128, 0, [129, 128]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_topk_triton_interpreter_matches_torch(interpreted, case):
    num_rows, length, k, levels, lengths = CASES[case]
    scores = make_scores(num_rows, length, levels, seed=len(case))
    lengths = torch.tensor(lengths, dtype=torch.int64)
    # Three programs per row share each row's histograms.
    got = interpreted.topk_triton(scores, k, lengths, programs_per_row=3)
    assert got.dtype == torch.int32
    assert torch.equal(got, topk_positions_torch(scores, k, lengths))


@pytest.mark.parametrize("levels", [0, 3], ids=["distinct", "ties"])
def test_topk_triton_interpreter_groups_of_positions(interpreted, levels):
    # At most 16 group maxima per row: groups of 32 positions, the last one partial.
    scores = make_scores(3, 300, levels, seed=6)
    lengths = torch.tensor([300, 250, 31])
    got = interpreted.topk_triton(scores, 20, lengths, max_groups=16, programs_per_row=2)
    assert torch.equal(got, topk_positions_torch(scores, 20, lengths))


def test_topk_triton_interpreter_candidate_overflow_rescans_row(interpreted):
    # Hundreds of equal scores pass the threshold and 8 fit in the buffer: the finisher
    # rescans the row for each bisection step instead.
    scores = make_scores(2, 400, 1, seed=5)
    lengths = torch.tensor([400, 333])
    got = interpreted.topk_triton(scores, 5, lengths, candidate_capacity=8, programs_per_row=2)
    assert torch.equal(got, topk_positions_torch(scores, 5, lengths))


def test_topk_triton_interpreter_writes_slots(interpreted):
    generator = torch.Generator().manual_seed(9)
    block_size, num_rows, length, k = 16, 3, 90, 20
    scores = make_scores(num_rows, length, 0, seed=9)
    lengths = torch.tensor([90, 40, 5])
    block_table = torch.randperm(24, generator=generator)[:18].view(3, 6).int()
    block_table[2, 1:] = -1
    row_request = torch.tensor([1, 0, 2], dtype=torch.int32)
    got = interpreted.topk_triton(scores, k, lengths, block_table, row_request, block_size)
    want = positions_to_slots_torch(topk_positions_torch(scores, k, lengths), block_table,
                                    row_request, block_size)
    assert torch.equal(got, want)


def test_topk_triton_interpreter_empty(interpreted):
    assert interpreted.topk_triton(torch.zeros(0, 5), 3, torch.zeros(0)).shape == (0, 3)
    assert interpreted.topk_triton(torch.zeros(2, 5), 0, torch.tensor([5, 5])).shape == (2, 0)


def test_topk_triton_rejects_k_beyond_limit(interpreted):
    with pytest.raises(ValueError, match=r"0 <= k <= 4096, got k=5000"):
        interpreted.topk_triton(torch.zeros(1, 5), 5000, torch.tensor([5]))


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 2049, 131072, 1 << 20], ids=lambda n: f"L{n}")
def test_topk_triton_gpu_matches_torch(length):
    from atomk31.triton_kernels.topk import topk_triton

    # Mixed lengths in one batch: the full row, a row just over k, a short row, an empty row.
    scores = make_scores(8, length, 0, seed=length, device="cuda")
    scores[1, : length // 2] = scores[1, 0]  # a long run of ties
    lengths = torch.tensor([length, min(length, 2049), min(length, 100), 0, length, length,
                            max(0, length - 1), length], device="cuda")
    got = topk_triton(scores, 2048, lengths)
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))
