"""topk_positions / positions_to_slots (torch): exact against a naive sort
(§4.6, §8 #6, §9 #6); the selected positions come in ascending order."""

import pytest
import torch

from atomk31.ops.topk import (
    check_paged_rows,
    positions_to_slots_torch,
    topk_positions_torch,
)


def naive_topk(scores: torch.Tensor, k: int, lengths: torch.Tensor) -> torch.Tensor:
    """Per row: rank candidates by (higher score, lower position), keep k, list them in
    position order, pad with -1."""
    out = []
    for row, length in zip(scores.tolist(), lengths.tolist()):
        # + 0.0 turns -0.0 into +0.0; Python compares them equal anyway.
        ranked = sorted(range(length), key=lambda p: (-(row[p] + 0.0), p))[:k]
        out.append(sorted(ranked) + [-1] * (k - len(ranked)))
    return torch.tensor(out, dtype=torch.int32).reshape(len(out), k)


def naive_slots(positions, block_table, row_request, block_size):
    out = []
    for row, request in zip(positions.tolist(), row_request.tolist()):
        slots = []
        for p in row:
            block = block_table[request, p // block_size].item() if p >= 0 else -1
            slots.append(block * block_size + p % block_size if block >= 0 else -1)
        out.append(slots)
    return torch.tensor(out, dtype=torch.int32)


CASES = {
    # name: (Nq, L, k, score levels (few = many ties), lengths)
    "ties_L37_k8": (5, 37, 8, 3, [37, 1, 20, 9, 0]),
    "k_above_L_k50_L33": (3, 33, 50, 4, [33, 17, 1]),
    "k1_L1": (1, 1, 1, 2, [1]),
    "k0_L5": (2, 5, 0, 2, [5, 3]),
    "no_rows_L4_k3": (0, 4, 3, 2, []),
    "all_equal_L200_k64": (3, 200, 64, 1, [200, 63, 130]),
    "distinct_L300_k64": (4, 300, 64, 0, [300, 64, 65, 1]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_topk_positions_torch_matches_naive_sort(case):
    num_rows, length, k, levels, lengths = CASES[case]
    generator = torch.Generator().manual_seed(len(case))
    if levels == 0:
        scores = torch.randn(num_rows, length, generator=generator)
    else:
        scores = torch.randint(0, levels, (num_rows, length), generator=generator).float() - 1.0
    lengths = torch.tensor(lengths, dtype=torch.int32)
    got = topk_positions_torch(scores, k, lengths)
    assert got.dtype == torch.int32 and got.shape == (num_rows, k)
    assert torch.equal(got, naive_topk(scores, k, lengths))


def test_topk_positions_torch_negative_zero_ties_with_positive_zero():
    # Position order must decide among -0.0 and +0.0 (the lower positions 0, 2, 3 win over
    # 5); -1 and -inf rank below both. The output lists the set in position order.
    scores = torch.tensor([[-0.0, -1.0, 0.0, -0.0, 2.0, 0.0, -torch.inf]])
    got = topk_positions_torch(scores, 4, torch.tensor([7]))
    assert got.tolist() == [[0, 2, 3, 4]]
    got = topk_positions_torch(scores, 7, torch.tensor([7]))
    assert got.tolist() == [[0, 1, 2, 3, 4, 5, 6]]


def test_topk_positions_torch_ascending_not_best_first():
    # The contract's order: ascending positions, not the ranking (3 is best, 0 second).
    scores = torch.tensor([[5.0, 1.0, -2.0, 9.0, 0.5]])
    assert topk_positions_torch(scores, 3, torch.tensor([5])).tolist() == [[0, 1, 3]]


def test_topk_positions_torch_ignores_scores_beyond_length():
    scores = torch.tensor([[1.0, 5.0, 3.0, 100.0, 100.0]])
    assert topk_positions_torch(scores, 4, torch.tensor([3])).tolist() == [[0, 1, 2, -1]]


def test_topk_positions_torch_rejects_length_beyond_scores():
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, L=4\], got \[2, 5\]"):
        topk_positions_torch(torch.zeros(2, 4), 2, torch.tensor([2, 5]))


@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_positions_to_slots_torch_matches_naive(block_size):
    generator = torch.Generator().manual_seed(block_size)
    num_requests, max_blocks, num_blocks = 3, 4, 12
    # Non-contiguous, out-of-order blocks; the last request has only two blocks (-1 padded).
    block_table = torch.randperm(num_blocks, generator=generator)[: num_requests * max_blocks]
    block_table = block_table.view(num_requests, max_blocks).to(torch.int32)
    block_table[2, 2:] = -1
    row_request = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int32)
    positions = torch.randint(0, max_blocks * block_size, (5, 9), generator=generator)
    positions[:, -2:] = -1
    positions[1, 0] = 3 * block_size  # block table holds -1 there: slot -1
    got = positions_to_slots_torch(positions, block_table, row_request, block_size)
    assert got.dtype == torch.int32
    assert torch.equal(got, naive_slots(positions, block_table, row_request, block_size))
    assert got[1, 0].item() == -1


def test_check_paged_rows_rejects_position_beyond_block_table():
    with pytest.raises(ValueError, match=r"position 40 needs block 2 but the block table has 2"):
        check_paged_rows(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0]),
                         torch.tensor([40]), 16)


def test_check_paged_rows_rejects_block_size_not_power_of_two():
    with pytest.raises(ValueError, match=r"block_size must be a power of two, got 96"):
        check_paged_rows(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0]),
                         torch.tensor([4]), 96)


def test_check_topk_refuses_slots_of_a_block_size_not_a_power_of_two():
    """The op's host check of topk_slots, run before every kernel."""
    from atomk31.ops.topk import check_topk

    args = (torch.zeros(1, 5), 2, torch.tensor([5]), torch.zeros(1, 1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block_size must be a power of two, got 96"):
        check_topk(*args, 96)
    with pytest.raises(ValueError, match=r"expected block_table \[N, max_blocks\] and "
                                         r"row_request \[Nq=1\]"):
        check_topk(torch.zeros(1, 5), 2, torch.tensor([5]), torch.zeros(1, 1, dtype=torch.int32),
                   torch.zeros(2, dtype=torch.int32), 64)
    check_topk(*args, 64)
    check_topk(torch.zeros(1, 5), 2, torch.tensor([5]))
