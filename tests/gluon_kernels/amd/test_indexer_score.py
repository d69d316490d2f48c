"""Gluon indexer scoring against the op's torch implementation (§4.6 "Quantized evaluation").

On a GPU (``-m gpu``): the Gluon kernel's instantiation for the visible GPU (NVIDIA mma.sync
here, scaled MFMA on gfx950) at K3.1's 32 heads and the tiny config's 4, both key formats,
paged caches with shuffled blocks, verification groups, decode and prefill rows, one row of
one head over one key. On the CPU: the host-side grouping of query rows (sized on the host,
no device read, so a graph captures it). The gfx950/gfx942 compiles with the engine's tensors
and their ISA: tests/amd_compile/test_gluon_launches.py.
"""

import pytest
import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch
from gluon_kernels.amd.indexer_score import ROWS, group_query_rows, max_row_groups


def test_group_query_rows_cuts_each_request_into_position_ordered_groups():
    row_request = torch.tensor([1, 0, 1, 1, 0, 2, 1, 1, 1, 1, 1, 1, 1], dtype=torch.int32)
    row_position = torch.tensor([30, 5, 10, 11, 4, 0, 12, 13, 14, 15, 16, 17, 18])
    num_groups = max_row_groups(13, 3, rows_per_group=4)
    assert num_groups == 13 // 4 + 3 - 1  # (13 + 3 x 3) // 4 = 5 here: the bound is exact
    group_rows, group_max = group_query_rows(row_request, row_position, num_groups,
                                             rows_per_group=4)
    groups = [[int(r) for r in g if r >= 0] for g in group_rows]
    assert sorted(r for g in groups for r in g) == list(range(13))
    for rows, max_position in zip(groups, group_max.tolist()):
        assert len({int(row_request[r]) for r in rows}) == 1, "a group mixes requests"
        positions = [int(row_position[r]) for r in rows]
        assert positions == sorted(positions) and max(positions) == max_position
    assert [len(g) for g in groups] == [2, 4, 4, 2, 1]  # request 1 has 10 rows


@pytest.mark.parametrize("rows_per_request", [[1] * 17, [4] * 5, [1, 9, 16, 3], [33], [8, 8]],
                         ids=["decode17", "verify4x5", "mixed", "prefill33", "two-groups"])
def test_max_row_groups_bounds_the_groups_and_the_rest_stay_empty(rows_per_request):
    """The host's bound (row and request counts only) is at least the groups there are; the
    groups past them are empty (-1 rows, max position -1: their programs return at once)."""
    row_request = torch.cat([torch.full((n,), r, dtype=torch.int32)
                             for r, n in enumerate(rows_per_request)])
    row_position = torch.cat([torch.arange(n) for n in rows_per_request])
    num_groups = max_row_groups(row_request.numel(), len(rows_per_request))
    actual = sum(-(-n // ROWS) for n in rows_per_request)
    assert actual <= num_groups <= row_request.numel()
    group_rows, group_max = group_query_rows(row_request, row_position, num_groups)
    assert group_rows.shape == (num_groups, ROWS)
    assert bool((group_rows[actual:] == -1).all()) and bool((group_max[actual:] == -1).all())
    assert sorted(group_rows[group_rows >= 0].tolist()) == list(range(row_request.numel()))


def test_decode_rows_make_one_group_a_request():
    assert max_row_groups(16, 16) == 16
    assert max_row_groups(1, 1) == 1


def test_group_query_rows_does_not_read_the_device(monkeypatch):
    """No device value reaches the host (graph steps capture the launch)."""
    row_request = torch.tensor([2, 0, 0, 1, 0], dtype=torch.int32)
    row_position = torch.tensor([7, 3, 4, 0, 5])

    def forbidden(*_args, **_kwargs):
        raise AssertionError("host sync")

    for name in ("tolist", "item", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    group_rows, group_max = group_query_rows(row_request, row_position,
                                             max_row_groups(5, 3))
    monkeypatch.undo()
    assert group_rows.shape == (3, ROWS)  # (5 rows + 7 x 3 requests) // 8
    assert group_max.tolist() == [5, 0, 7]


def test_group_query_rows_of_no_rows_is_empty():
    group_rows, group_max = group_query_rows(torch.zeros(0, dtype=torch.int32),
                                             torch.zeros(0, dtype=torch.int64), 0)
    assert group_rows.shape == (0, ROWS) and group_max.shape == (0,)


def build_cache(request_lengths, block_size, index_format, device, seed, fp8_variant="e4m3fn"):
    """Keys of each request written through kv_write into shuffled blocks of one paged cache."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in request_lengths]
    num_blocks = sum(blocks_needed) + 2
    free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(request_lengths), max(blocks_needed) + 1), -1, dtype=torch.int32)
    for request, count in enumerate(blocks_needed):
        for column in range(count):
            block_table[request, column] = free_blocks.pop()
    if index_format == "fp8":
        fp8 = getattr(torch, f"float8_{fp8_variant}")
        values = torch.zeros(num_blocks, block_size, 128, dtype=fp8)
        scales = torch.zeros(num_blocks, block_size)
    else:
        values = torch.zeros(num_blocks, block_size, 64, dtype=torch.uint8)
        scales = torch.zeros(num_blocks, block_size, 4, dtype=torch.uint8)
    latent = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    for request, length in enumerate(request_lengths):
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        keys = torch.randn(length, 128, generator=generator) * 2.0
        kv_write_torch(torch.zeros(length, 576), keys, slots, latent, 1.0, values, scales,
                       index_format, fp8_variant)
    return block_table.to(device), values.to(device), scales.to(device)


def assert_scores_close(name, expected, actual):
    assert expected.shape == actual.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert torch.equal(torch.isinf(expected), torch.isinf(actual)), f"{name}: -inf mask differs"
    finite = torch.isfinite(expected)
    row_max = expected.masked_fill(~finite, 0).abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    error = (expected - actual).abs().masked_fill(~finite, 0)
    bound = 1e-5 * expected.abs().masked_fill(~finite, 0) + 1e-5 * row_max
    worst = float((error / bound).max()) if error.numel() else 0.0
    assert worst <= 1.0, f"{name}: error {worst:.2f}x the tolerance (rtol 1e-5, atol 1e-5*rowmax)"


CASES = [
    # (heads, block_size, request lengths, rows as (request, position))
    pytest.param(32, 128, [300, 5000, 1],
                 [(1, p) for p in range(4990, 4998)] + [(0, 299), (2, 0), (0, 64)],
                 id="H32-bs128-verify8-decode"),
    pytest.param(4, 16, [1000, 77], [(0, p) for p in range(0, 1000, 37)] + [(1, 76)],
                 id="H4-bs16-prefill"),
    pytest.param(32, 64, [65], [(0, 64)], id="H32-bs64-one-row-L65"),
    pytest.param(1, 64, [1], [(0, 0)], id="H1-bs64-one-row-L1"),
    pytest.param(32, 64, [33] * 17, [(r, 32) for r in range(17)], id="H32-decode17-L33"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("index_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("num_heads,block_size,request_lengths,rows", CASES)
def test_indexer_score_gluon_matches_torch(index_format, num_heads, block_size, request_lengths,
                                           rows):
    check_indexer_score_gluon(index_format, num_heads, block_size, request_lengths, rows)


@pytest.mark.amd
@pytest.mark.parametrize("index_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("num_heads,block_size,request_lengths,rows", CASES)
def test_indexer_score_gluon_matches_torch_on_rocm(index_format, num_heads, block_size,
                                                   request_lengths, rows):
    """The same cases on gfx950 (scaled MFMA) or gfx942 (FP8 only, e4m3fnuz keys)."""
    from gluon_kernels.targets import active_target

    if index_format == "mxfp4" and not active_target().has_fp4:
        pytest.skip("MXFP4 index keys are not available on gfx942 (MODEL_SPEC §4.6.1)")
    check_indexer_score_gluon(index_format, num_heads, block_size, request_lengths, rows)


def check_indexer_score_gluon(index_format, num_heads, block_size, request_lengths, rows):
    from gluon_kernels.amd.indexer_score import indexer_score_gluon
    from gluon_kernels.targets import active_target

    device = torch.device("cuda")
    fp8_variant = active_target().fp8_variant
    block_table, values, scales = build_cache(request_lengths, block_size, index_format, device,
                                              seed=7, fp8_variant=fp8_variant)
    generator = torch.Generator().manual_seed(11)
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32, device=device)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64, device=device)
    q = torch.randn(len(rows), num_heads, 128, generator=generator).to(device)
    head_weights = torch.randn(len(rows), num_heads, generator=generator).to(device) * 0.1
    args = (q, head_weights, values, scales, index_format, fp8_variant, block_table,
            row_request, row_position, block_size)
    expected = indexer_score_torch(*args)
    actual = indexer_score_gluon(*args, num_positions=expected.shape[1])
    assert_scores_close(f"scores[{index_format}]", expected, actual)
