"""The Hopper Gluon indexer (gluon_kernels/hopper/indexer_score*.py) on an sm_90 GPU (``-m gpu``)
against indexer_score_torch: awkward shapes (one row of one head over one key, lengths off the
64-key tile, mixed requests, 1 / 4 / 8 rows a request in any order, block sizes 64 and 128, a
strided engine cache view, 16 and 17 decode rows) within the op's tolerance. No GPU:
test_indexer_score_kernel.py (refusals, shared memory, the offline sm_90 compile) and
test_indexer_score_query_prep.py.
"""

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch

IS_HOPPER = torch.cuda.is_available() and torch.version.hip is None and \
    torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not IS_HOPPER, reason="needs an NVIDIA sm_90 GPU (wgmma, TMA)")
DEVICE = "cuda"
NUM_HEADS = 32  # K3.1's H_I


def build_cache(lengths, block_size, seed, engine_view=False):
    """Keys of each request (kv_write_torch) in shuffled pages on the GPU; engine_view: pages
    of an engine pool (atomk31/cache/layout.py: layer 1's index pages, strided by the row)."""
    generator = torch.Generator().manual_seed(seed)
    pages = [-(-n // block_size) for n in lengths]
    num_blocks = sum(pages) + 3
    free = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(lengths), max(pages) + 1), -1, dtype=torch.int32)
    for request, count in enumerate(pages):
        for column in range(count):
            block_table[request, column] = free.pop()
    if engine_view:
        layout = PackedLayout(CacheLayoutSpec(block_size=block_size, num_mla_layers=2))
        pool = layout.allocate(num_blocks, "cpu")
        view = layout.layer_view(pool, 1)
        values, scales = view.index_values, view.index_scales
    else:
        values = torch.zeros(num_blocks, block_size, 128, dtype=torch.float8_e4m3fn)
        scales = torch.zeros(num_blocks, block_size)
    latent = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    for request, length in enumerate(lengths):
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        keys = torch.randn(length, 128, generator=generator) * 2.0
        kv_write_torch(torch.zeros(length, 576), keys, slots, latent, 1.0, values, scales,
                       "fp8", "e4m3fn")
    if engine_view:  # the same pool on the GPU, viewed the same way
        gpu_view = layout.layer_view(pool.to(DEVICE), 1)
        return block_table, values, scales, gpu_view.index_values, gpu_view.index_scales
    return block_table, values, scales, values.to(DEVICE), scales.to(DEVICE)


def make_rows(rows, seed, num_heads=NUM_HEADS):
    """(row_request, row_position, q, head_weights) for [(request, position), ...]."""
    generator = torch.Generator().manual_seed(seed)
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64)
    q = torch.randn(len(rows), num_heads, 128, generator=generator).to(torch.bfloat16)
    head_weights = torch.randn(len(rows), num_heads, generator=generator)
    head_weights *= num_heads**-0.5 * 128**-0.5  # mixed signs: scores can be negative
    return row_request, row_position, q, head_weights


def verification_rows(lengths, rows_per_request, seed):
    """rows_per_request rows at each request's last positions, all rows shuffled."""
    rows = [(r, max(0, n - 1 - k)) for r, n in enumerate(lengths)
            for k in range(rows_per_request)]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    return [rows[i] for i in order]


def run_both(lengths, rows, block_size, seed=5, engine_view=False, num_heads=NUM_HEADS,
             **options):
    """(kernel scores, torch reference on the CPU, the inputs) for these rows."""
    from gluon_kernels.hopper.indexer_score import indexer_score_hopper

    block_table, values, scales, gpu_values, gpu_scales = build_cache(lengths, block_size,
                                                                      seed, engine_view)
    row_request, row_position, q, weights = make_rows(rows, seed + 1, num_heads)
    got = indexer_score_hopper(q.to(DEVICE), weights.to(DEVICE), gpu_values, gpu_scales, "fp8",
                               "e4m3fn", block_table.to(DEVICE), row_request.to(DEVICE),
                               row_position.to(DEVICE), block_size, **options)
    want = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                               row_request, row_position, block_size)
    return got.cpu(), want, (q, weights, values, scales, block_table, row_request, row_position)


def error_ratio(got, want):
    """Worst error / bound over finite scores: the op's tolerance 1e-5 |score| + 1e-5 x the
    batch's max |score| (tensor-core sums are not IEEE-sequential: tests/triton_kernels)."""
    finite = torch.isfinite(want)
    magnitude = torch.where(finite, want.abs(), 0.0)
    bound = 1e-5 * magnitude + 1e-5 * magnitude.max()
    error = torch.where(finite, (got - want).abs(), 0.0)
    if not want.numel():
        return 0.0
    # an exact zero against a zero bound (every score 0, as one head over one key can give)
    # is no error; any error against a zero bound is infinitely over it
    ratio = torch.where(error == 0, 0.0, error / bound)
    return ratio.max().item()


def assert_scores_close(name, got, want):
    """Same shape and -inf pattern, no NaN, error_ratio <= 1."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN (an unwritten score?)"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: -inf mask differs"
    worst = error_ratio(got, want)
    assert worst <= 1.0, f"{name}: the error is {worst:.2f}x the bound"


# ---- GPU ---------------------------------------------------------------------------------

MIXED_LENGTHS = [1, 70, 300, 129]
# a length-1 row, verification rows off the tile, prefill rows at page and tile edges,
# requests interleaved
MIXED_ROWS = [(2, 299), (1, 33), (0, 0), (1, 69), (2, 0), (1, 35), (2, 64), (3, 128),
              (2, 127), (3, 63), (2, 191), (3, 64)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"bs{b}")
def test_exact_mixed_rows(block_size):
    got, want, _ = run_both(MIXED_LENGTHS, MIXED_ROWS, block_size)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("rows_per_request", [1, 4, 8], ids=lambda r: f"rows{r}")
def test_exact_verification_rows_in_any_order(rows_per_request):
    lengths = [257, 1, 1000, 64, 65]
    rows = verification_rows(lengths, rows_per_request, seed=rows_per_request)
    got, want, _ = run_both(lengths, rows, 128, seed=rows_per_request)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
def test_exact_engine_cache_view_and_wider_num_positions():
    lengths = [300, 129, 2]
    rows = verification_rows(lengths, 4, seed=11)
    got, want, _ = run_both(lengths, rows, 128, seed=11, engine_view=True, num_positions=310)
    assert torch.isinf(got[:, 300:]).all()
    assert_scores_close("scores", got[:, :300], want)


@pytest.mark.gpu
@hopper
def test_exact_many_row_tiles_share_the_sms():
    # More (row tile, key tile) pairs than SMs: ranges cross row tiles (segments).
    lengths = [4000 + 37 * r for r in range(12)]
    rows = verification_rows(lengths, 4, seed=13)
    got, want, _ = run_both(lengths, rows, 128, seed=13)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("num_requests, context, num_heads", [(1, 1, 1), (16, 256, 32),
                                                              (17, 33, 32)],
                         ids=["one-row-one-head-one-key", "sixteen", "odd"])
def test_exact_decode_batches_of_size_one_sixteen_and_odd(num_requests, context, num_heads):
    """Decode steps as graphs capture them (one row per request at its last position, the
    engine's pool view, L from the host): with one row of one head over one key every size
    argument is 1, which Triton passes as a constant (issue 16's crash)."""
    lengths = [context] * num_requests
    rows = [(r, context - 1) for r in range(num_requests)]
    got, want, _ = run_both(lengths, rows, 64, seed=context, engine_view=True,
                            num_heads=num_heads, num_positions=context)
    assert_scores_close("scores", got, want)
