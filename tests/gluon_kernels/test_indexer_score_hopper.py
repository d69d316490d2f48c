"""The Hopper Gluon indexer (gluon_kernels/indexer_score_hopper*.py) on an sm_90 GPU (``-m gpu``)
against indexer_score_torch: awkward shapes (length 1, lengths off the 64-key tile, mixed
requests, 1 / 4 / 8 rows a request in any order, block sizes 64 and 128, a strided engine cache
view) within the op's tolerance for both exact products ("fp16": keys converted in registers;
"fp16_ss": converted into shared memory by the converter warpgroup); the fp8 products within a
bound derived from how Hopper accumulates them (`fp8_error_bound`), their top-k overlap with the
exact scores printed. No GPU: test_indexer_score_hopper_offline.py (refusals, shared memory,
the offline sm_90 compile) and test_indexer_score_hopper_query_prep.py.
"""

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch, quantize_index_keys

IS_HOPPER = torch.cuda.is_available() and torch.version.hip is None and \
    torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not IS_HOPPER, reason="needs an NVIDIA sm_90 GPU (wgmma, TMA)")
DEVICE = "cuda"
NUM_HEADS = 32  # K3.1's H_I
# Hopper's FP8 wgmma aligns the products of a K = 32 step (and the running sum it adds them to)
# to the largest exponent and keeps ~14 significant bits (DeepSeek-V3 report, §3.3.2): each
# term loses < 2^-13 of the largest term's magnitude.
FP8_KEPT_BITS = 13


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


def make_rows(rows, seed):
    """(row_request, row_position, q, head_weights) for [(request, position), ...]."""
    generator = torch.Generator().manual_seed(seed)
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64)
    q = torch.randn(len(rows), NUM_HEADS, 128, generator=generator).to(torch.bfloat16)
    head_weights = torch.randn(len(rows), NUM_HEADS, generator=generator)
    head_weights *= NUM_HEADS**-0.5 * 128**-0.5  # mixed signs: scores can be negative
    return row_request, row_position, q, head_weights


def verification_rows(lengths, rows_per_request, seed):
    """rows_per_request rows at each request's last positions, all rows shuffled."""
    rows = [(r, max(0, n - 1 - k)) for r, n in enumerate(lengths)
            for k in range(rows_per_request)]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    return [rows[i] for i in order]


def run_both(lengths, rows, block_size, seed=5, engine_view=False, **options):
    """(kernel scores, torch reference on the CPU, the inputs) for these rows."""
    from gluon_kernels.indexer_score_hopper_launch import indexer_score_hopper

    block_table, values, scales, gpu_values, gpu_scales = build_cache(lengths, block_size,
                                                                      seed, engine_view)
    row_request, row_position, q, weights = make_rows(rows, seed + 1)
    got = indexer_score_hopper(q.to(DEVICE), weights.to(DEVICE), gpu_values, gpu_scales, "fp8",
                               "e4m3fn", block_table.to(DEVICE), row_request.to(DEVICE),
                               row_position.to(DEVICE), block_size, **options)
    want = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                               row_request, row_position, block_size)
    return got.cpu(), want, (q, weights, values, scales, block_table, row_request, row_position)


def error_ratio(got, want, extra_bound=None):
    """Worst error / bound over finite scores: the op's tolerance 1e-5 |score| + 1e-5 x the
    batch's max |score| (tensor-core sums are not IEEE-sequential: tests/triton_kernels),
    plus extra_bound (the fp8 products' bound)."""
    finite = torch.isfinite(want)
    magnitude = torch.where(finite, want.abs(), 0.0)
    bound = 1e-5 * magnitude + 1e-5 * magnitude.max()
    if extra_bound is not None:
        bound = bound + extra_bound
    error = torch.where(finite, (got - want).abs(), 0.0)
    return (error / bound).max().item() if want.numel() else 0.0


def assert_scores_close(name, got, want, extra_bound=None):
    """Same shape and -inf pattern, no NaN, error_ratio <= 1. Returns the ratio."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN (an unwritten score?)"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: -inf mask differs"
    worst = error_ratio(got, want, extra_bound)
    assert worst <= 1.0, f"{name}: the error is {worst:.2f}x the bound"
    return worst


def fp8_error_bound(inputs, block_size, promoted):
    """|fp8 score - exact| <= s_k sum_h |w_h s_q,h| |D~_h - D_h| (relu is 1-Lipschitz), with
    D_h = sum_d q_d k_d over the e4m3 codes (every product exact in fp32). Per K = 32 wgmma
    step, each of its terms loses < 2^-13 x the step's largest term (FP8_KEPT_BITS):
      promoted (fp8_acc32): a fresh sum per step, added in fp32: sum over the 4 steps of
        32 x 2^-13 x max_step |q_d k_d|;
      not promoted (fp8): one chain, the running sum a 33rd term of each step: sum over the 4
        steps of 33 x 2^-13 x max(|running sum entering it|, max_step |q_d k_d|).
    Returns [Nq, L] float64 (0 at masked positions)."""
    q, weights, values, scales, block_table, row_request, row_position = inputs
    q_codes, q_scales = quantize_index_keys(q, "fp8", "e4m3fn")
    length = int(row_position.max()) + 1
    bound = torch.zeros(q.shape[0], length, dtype=torch.float64)
    unit = 2.0 ** -FP8_KEPT_BITS
    for i in range(q.shape[0]):
        request, position = int(row_request[i]), int(row_position[i])
        slots = torch.arange(position + 1)
        blocks = block_table[request, slots // block_size].long()
        codes = values[blocks, slots % block_size].double()  # [S, 128]
        key_scale = scales[blocks, slots % block_size].double()
        products = q_codes[i].double()[:, None, :] * codes[None]  # [H, S, 128]
        steps = products.view(NUM_HEADS, -1, 4, 32)
        step_max = steps.abs().amax(dim=3)  # [H, S, 4]
        if promoted:
            head_error = (32 * unit * step_max).sum(dim=2)
        else:
            running = torch.cumsum(steps.sum(dim=3), dim=2) - steps.sum(dim=3)  # entering
            head_error = (33 * unit * torch.maximum(running.abs(), step_max)).sum(dim=2)
        w = (weights[i].double() * q_scales[i].double()).abs()
        bound[i, :position + 1] = key_scale * (w[:, None] * head_error).sum(dim=0)
    return bound


def top_k_overlap(got, want, k):
    """Mean over rows of |top-k(got) & top-k(want)| / k (rows with at least k keys)."""
    overlaps = []
    for row_got, row_want in zip(got, want):
        count = int(torch.isfinite(row_want).sum())
        if count < k:
            continue
        a = set(torch.topk(row_got, k).indices.tolist())
        b = set(torch.topk(row_want, k).indices.tolist())
        overlaps.append(len(a & b) / k)
    return sum(overlaps) / len(overlaps) if overlaps else float("nan")


# ---- GPU ---------------------------------------------------------------------------------

MIXED_LENGTHS = [1, 70, 300, 129]
# a length-1 row, verification rows off the tile, prefill rows at page and tile edges,
# requests interleaved
MIXED_ROWS = [(2, 299), (1, 33), (0, 0), (1, 69), (2, 0), (1, 35), (2, 64), (3, 128),
              (2, 127), (3, 63), (2, 191), (3, 64)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("product", ["fp16", "fp16_ss"])
def test_exact_mixed_rows(block_size, product):
    got, want, _ = run_both(MIXED_LENGTHS, MIXED_ROWS, block_size, product=product)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("rows_per_request", [1, 4, 8], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("product", ["fp16", "fp16_ss"])
def test_exact_verification_rows_in_any_order(rows_per_request, product):
    lengths = [257, 1, 1000, 64, 65]
    rows = verification_rows(lengths, rows_per_request, seed=rows_per_request)
    got, want, _ = run_both(lengths, rows, 128, seed=rows_per_request, product=product)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("product", ["fp16", "fp16_ss"])
def test_exact_engine_cache_view_and_wider_num_positions(product):
    lengths = [300, 129, 2]
    rows = verification_rows(lengths, 4, seed=11)
    got, want, _ = run_both(lengths, rows, 128, seed=11, engine_view=True, num_positions=310,
                            product=product)
    assert torch.isinf(got[:, 300:]).all()
    assert_scores_close("scores", got[:, :300], want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("product", ["fp16", "fp16_ss"])
def test_exact_many_row_tiles_share_the_sms(product):
    # More (row tile, key tile) pairs than SMs: ranges cross row tiles (segments).
    lengths = [4000 + 37 * r for r in range(12)]
    rows = verification_rows(lengths, 4, seed=13)
    got, want, _ = run_both(lengths, rows, 128, seed=13, product=product)
    assert_scores_close("scores", got, want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kernel", ["gluon_hopper", "gluon_hopper_ss"])
def test_through_the_triton_launcher(kernel):
    from atomk31.triton_kernels.indexer_score import indexer_score_triton

    block_table, values, scales, gpu_values, gpu_scales = build_cache([90, 7], 64, seed=17)
    row_request, row_position, q, weights = make_rows([(0, 89), (1, 6), (0, 88)], seed=18)
    got = indexer_score_triton(q.cuda(), weights.cuda(), gpu_values, gpu_scales, "fp8",
                               "e4m3fn", block_table.cuda(), row_request.cuda(),
                               row_position.cuda(), 64, kernel=kernel)
    want = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                               row_request, row_position, 64)
    assert_scores_close("scores", got.cpu(), want)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("product", ["fp8_acc32", "fp8"])
def test_fp8_products_within_the_derived_bound(product):
    lengths = [4096, 3000]
    rows = verification_rows(lengths, 4, seed=19)
    got, want, inputs = run_both(lengths, rows, 128, seed=19, product=product)
    bound = fp8_error_bound(inputs, 128, promoted=product == "fp8_acc32")
    worst = assert_scores_close(product, got, want, extra_bound=bound.float())
    print(f"{product}: error / derived bound {worst:.3f}, / the op's tolerance "
          f"{error_ratio(got, want):.2f}; top-256 overlap with the exact scores "
          f"{top_k_overlap(got, want, 256):.4f}")
