"""sparse_mla_triton against sparse_mla_torch (§4.5 weight absorption, §4.6 "Effect on MLA"):
under Triton's interpreter (fp32 products: rtol/atol 1e-5) on the CPU, and on a GPU at real
sizes (H = 96, k = 2048; bf16 products: relative error of the output <= 1e-2)."""

import pytest
import torch

from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.triton_kernels.mla_tiles import MLATileConfig

KERNEL_MODULE = "atomk31.triton_kernels.sparse_mla"
SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def make_latent_cache(num_blocks, block_size, dtype, seed, device="cpu"):
    """A strided latent cache view (gaps between rows) of random rows of `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(num_blocks, block_size, 600, generator=generator)
    if dtype in FP8_MAX:
        rows = (rows / LATENT_SCALE).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
    return rows.to(dtype).to(device)[:, :, 10:586]


def make_slots(num_rows, k, num_slots, masked_fraction, seed):
    generator = torch.Generator().manual_seed(seed)
    slots = torch.stack([torch.randperm(num_slots, generator=generator)[:k]
                         for _ in range(num_rows)]).to(torch.int32)
    slots[torch.rand(num_rows, k, generator=generator) < masked_fraction] = -1
    slots[-1] = -1  # a row with no valid slot: out 0, lse -inf
    slots[0, 0] = slots[0, 0].clamp_min(0)
    return slots


def assert_close(name, got, want, rtol, atol):
    assert got.dtype == torch.float32 and got.shape == want.shape, f"{name}: {got.shape}"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: inf pattern differs"
    finite = torch.isfinite(want)
    error = (got - want).abs().masked_fill(~finite, 0)
    assert torch.allclose(got.masked_fill(~finite, 0), want.masked_fill(~finite, 0), rtol=rtol,
                          atol=atol), f"{name}: max abs error {error.max().item():.3e}"


def relative_error(got, want):
    finite = torch.isfinite(want)
    diff = (got.double() - want.double()).masked_fill(~finite, 0)
    return (diff.norm() / want.double().masked_fill(~finite, 0).norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
def test_sparse_mla_triton_interpreter_matches_torch(interpreted, num_splits, latent_dtype):
    # 5 heads (a masked head block), k = 37 (not a multiple of the 16-key tile), masked slots.
    num_rows, num_heads, k, block_size = 4, 5, 37, 16
    cache = make_latent_cache(6, block_size, latent_dtype, seed=k)
    slots = make_slots(num_rows, k, 6 * block_size, 0.3, seed=1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(2))
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE,
                                                     MLATileConfig(num_splits=num_splits))
    want_out, want_lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-5, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)
    assert bool((got_out[-1] == 0).all()) and bool(torch.isneginf(got_lse[-1]).all())


@pytest.mark.parametrize("scores_via_memory, value_splits, block_h",
                         [(True, 1, None), (False, 2, None), (True, 2, None)],
                         ids=["via-memory", "value-halves", "via-memory-value-halves"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
def test_sparse_mla_triton_interpreter_variants_match_torch(interpreted, num_splits,
                                                            scores_via_memory, value_splits,
                                                            block_h):
    num_rows, num_heads, k, block_size = 4, 5, 37, 16
    cache = make_latent_cache(6, block_size, torch.float8_e4m3fn, seed=k)
    slots = make_slots(num_rows, k, 6 * block_size, 0.3, seed=1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(2))
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE, MLATileConfig(
                                                         num_splits=num_splits,
                                                         scores_via_memory=scores_via_memory,
                                                         value_splits=value_splits,
                                                         block_h=block_h))
    want_out, want_lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-5, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)


@pytest.mark.parametrize("prefetch, value_splits, num_splits", [(1, 1, 1), (1, 2, 3)],
                         ids=["prefetch1", "prefetch1-value-halves-splits3"])
def test_sparse_mla_triton_interpreter_prefetch_matches_torch(interpreted, num_splits, prefetch,
                                                              value_splits):
    # k = 37 over 16-key tiles: the last tile's prefetch runs past the selection (masked).
    num_rows, num_heads, k, block_size = 3, 5, 37, 16
    cache = make_latent_cache(6, block_size, torch.float8_e4m3fn, seed=k)
    slots = make_slots(num_rows, k, 6 * block_size, 0.3, seed=1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(2))
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE, MLATileConfig(
                                                         num_splits=num_splits,
                                                         prefetch=prefetch,
                                                         value_splits=value_splits))
    want_out, want_lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-5, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)


def test_sparse_mla_triton_interpreter_gapped_blocks_match_torch(interpreted):
    """Blocks not back to back (every other block of a buffer): slots split into (block,
    offset) instead of the flat slot x row stride offset the other tests take."""
    num_rows, num_heads, k, block_size = 3, 5, 37, 16
    cache = make_latent_cache(12, block_size, torch.float8_e4m3fn, seed=k)[::2]
    assert cache.stride(0) != block_size * cache.stride(1)
    slots = make_slots(num_rows, k, 6 * block_size, 0.3, seed=1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(2))
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE,
                                                     MLATileConfig(num_splits=2, value_splits=2))
    want_out, want_lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-5, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)


def test_sparse_mla_triton_interpreter_fp16_operands_match_torch(interpreted):
    """FP16 products over an FP8 latent: queries far outside FP16's range (2^40, 2^-40) are
    scaled into it; operands stay exact, only the probabilities round (to FP16)."""
    num_rows, num_heads, k, block_size = 3, 4, 37, 16
    cache = make_latent_cache(6, block_size, torch.float8_e4m3fn, seed=k)
    slots = make_slots(num_rows, k, 6 * block_size, 0.3, seed=1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(2))
    q[:, 1] *= 2.0**40 / 1e12  # huge scores: one key dominates
    q[:, 2] *= 2.0**-40
    q = q.to(torch.bfloat16)
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE, MLATileConfig(
                                                         num_splits=2, fp16_operands=True,
                                                         value_splits=2))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 2e-3, 2e-3)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)


def test_mla_fp16_query_is_exact_for_bf16(interpreted):
    from atomk31.triton_kernels.mla_fp16_query import mla_fp16_query

    q = torch.randn(2, 3, 576, generator=torch.Generator().manual_seed(3))
    q[0, 0] *= 2.0**100
    q[0, 1] *= 2.0**-100
    q[1, 0] = 0.0
    q = q.to(torch.bfloat16)
    q16, unscale = mla_fp16_query(q)
    assert q16.dtype == torch.float16 and bool(torch.isfinite(q16).all())
    assert torch.equal(q16.float() * unscale[..., None], q.float())
    assert float(q16.float().abs().amax(-1)[0, 2]) >= 2.0**14


def test_sparse_mla_triton_interpreter_single_slot_and_no_rows(interpreted):
    cache = make_latent_cache(2, 16, torch.bfloat16, seed=3)
    q = torch.randn(1, 2, 576, generator=torch.Generator().manual_seed(4))
    slots = torch.tensor([[17]], dtype=torch.int32)
    got = interpreted.sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE)
    want = sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    assert_close("out", got[0], want[0], 1e-5, 1e-5)
    assert_close("lse", got[1], want[1], 1e-5, 1e-5)
    empty = interpreted.sparse_mla_triton(torch.zeros(0, 2, 576), cache, 1.0,
                                          torch.zeros(0, 8, dtype=torch.int32), SOFTMAX_SCALE)
    assert empty[0].shape == (0, 2, 512) and empty[1].shape == (0, 2)


@pytest.mark.parametrize("num_rows, num_heads, k", [(1, 1, 1), (16, 16, 256), (17, 3, 33)],
                         ids=["one-row-one-head-one-slot", "sixteen", "odd"])
def test_sparse_mla_triton_interpreter_size_one_and_odd_sizes(interpreted, num_rows,
                                                              num_heads, k):
    """Every size at 1 (Triton passes such arguments as constants), at multiples of 16 and
    odd, over an engine pool's strided latent view."""
    from atomk31.cache.layout import CacheLayoutSpec, PackedLayout

    layout = PackedLayout(CacheLayoutSpec(block_size=16, num_mla_layers=2))
    cache = layout.layer_view(layout.allocate(20, "cpu"), 1).latent
    cache.copy_(make_latent_cache(20, 16, torch.float8_e4m3fn, seed=k))
    slots = make_slots(num_rows, k, 20 * 16, 0.2, seed=3) if num_rows > 1 else \
        torch.tensor([[5]], dtype=torch.int32)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(4))
    got_out, got_lse = interpreted.sparse_mla_triton(q, cache, LATENT_SCALE, slots,
                                                     SOFTMAX_SCALE)
    want_out, want_lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-5, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)


def test_sparse_mla_triton_refuses_a_cache_with_a_strided_last_dim(interpreted):
    cache = make_latent_cache(2, 16, torch.float32, seed=6)
    with pytest.raises(ValueError, match=r"with a contiguous last dim"):
        interpreted.sparse_mla_triton(torch.zeros(1, 4, 576), cache.transpose(0, 2)
                                      .contiguous().transpose(0, 2), 1.0,
                                      torch.zeros(1, 4, dtype=torch.int32), SOFTMAX_SCALE)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 64], ids=lambda n: f"Nq{n}")
@pytest.mark.parametrize("block_h", [32, 64], ids=lambda b: f"bh{b}")
def test_sparse_mla_triton_gpu_decode(num_rows, block_h):
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_blocks, block_size, k = 160, 128, 2048
    cache = make_latent_cache(num_blocks, block_size, torch.float8_e4m3fn, seed=5,
                              device="cuda")
    slots = make_slots(num_rows, k, num_blocks * block_size, 0.05, seed=6).cuda()
    if num_rows > 1:
        slots[1, 100:] = -1  # a short selection
    q = torch.randn(num_rows, 96, 576, generator=torch.Generator().manual_seed(7))
    q = q.to(torch.bfloat16).cuda()
    got_out, got_lse = sparse_mla_triton(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE,
                                         MLATileConfig(block_h=block_h))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.parametrize("num_programs, max_splits, want", [
    (0, 8, 1), (128, 8, 1), (32, 8, 4), (96, 8, 4), (16, 2, 2), (200, 8, 3)])
def test_fewest_splits_filling_waves_on_132_multiprocessors(num_programs, max_splits, want):
    from atomk31.triton_kernels.mla_splits import fewest_splits_filling_waves

    assert fewest_splits_filling_waves(num_programs, 132, max_splits) == want


# (rows a program, programs' row groups, keys, sparse) -> (block_h, block_n, splits, warps,
# stages, value splits, scores via memory, prefetch, fp16 operands) of the fastest tiles
# measured for 96 heads on CUDA (mla_tiles.py's `_cuda_many_heads_tiles`).
CUDA_96_HEAD_TILES = [
    # 16 sparse rows: one split here (a CPU tensor: one multiprocessor); 4 on an H200
    ((1, 16, 2048, True), (128, 64, 1, 8, 1, 2, False, 1, True)),
    ((1, 64, 2048, True), (128, 64, 1, 8, 1, 2, False, 0, True)),  # sparse, 64 rows
    ((1, 16, 2048, False), (64, 64, 16, 8, 1, 1, True, 0, False)),  # dense, short context
    ((1, 16, 131072, False), (128, 64, 1, 8, 1, 2, False, 0, False)),  # dense, 1 row a request
    ((4, 16, 16384, False), (32, 64, 1, 8, 1, 2, False, 0, False)),  # dense, 4 rows a request
    ((2, 16, 16384, False), (32, 64, 1, 8, 2, 1, False, 0, False)),  # 2 rows: two stages
]


@pytest.mark.parametrize("shape, want", CUDA_96_HEAD_TILES,
                         ids=["sparse16", "sparse64", "dense-short", "dense1", "dense4",
                              "dense2"])
def test_choose_tiles_cuda_defaults_for_96_heads(monkeypatch, shape, want):
    from types import SimpleNamespace

    from atomk31.triton_kernels import mla_tiles

    target = SimpleNamespace(backend="cuda", arch=90, warp_size=32)
    monkeypatch.setattr(mla_tiles, "driver", SimpleNamespace(
        active=SimpleNamespace(get_current_target=lambda: target)))
    rows_per_program, num_groups, max_keys, is_sparse = shape
    q = torch.empty(0, 96, 576)  # a CPU tensor: one multiprocessor, so one split by waves
    tiles = mla_tiles.choose_tiles(q, False, False, num_groups, max_keys, rows_per_program,
                                   is_sparse=is_sparse)
    assert (tiles.block_h, tiles.block_n, tiles.num_splits, tiles.num_warps, tiles.num_stages,
            tiles.value_splits, tiles.scores_via_memory, tiles.prefetch,
            tiles.fp16_operands) == want
    # A caller's tile knob keeps the generic rule for the rest (value_splits default 1).
    fixed = mla_tiles.choose_tiles(q, False, False, num_groups, max_keys, rows_per_program,
                                   MLATileConfig(block_h=64 // rows_per_program))
    assert fixed.value_splits == 1
    # float32 products keep the small tiles.
    assert mla_tiles.choose_tiles(q, True, False, num_groups, max_keys,
                                  rows_per_program).block_n == 16
    with pytest.raises(ValueError, match="prefetch must be 0 or 1, got 2"):
        mla_tiles.choose_tiles(q, False, False, num_groups, max_keys, rows_per_program,
                               MLATileConfig(prefetch=2))


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [16, 64], ids=lambda n: f"Nq{n}")
def test_sparse_mla_triton_gpu_default_tiles(num_rows):
    """The launcher's defaults at the benchmark's shapes (H = 96, k = 2048, fp8 latent)."""
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_blocks, block_size, k = 160, 128, 2048
    cache = make_latent_cache(num_blocks, block_size, torch.float8_e4m3fn, seed=5,
                              device="cuda")
    slots = make_slots(num_rows, k, num_blocks * block_size, 0.05, seed=6).cuda()
    slots[1, 100:] = -1  # a short selection
    q = torch.randn(num_rows, 96, 576, generator=torch.Generator().manual_seed(7))
    q = q.to(torch.bfloat16).cuda()
    got_out, got_lse = sparse_mla_triton(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "block_h, block_n, num_warps, num_stages, scores_via_memory, value_splits, prefetch, fp16",
    [(64, 64, 4, 1, False, 1, 0, False), (64, 128, 8, 1, False, 1, 0, False),
     (64, 64, 8, 3, False, 1, 0, False), (64, 64, 8, 1, True, 1, 0, False),
     (64, 64, 4, 1, False, 2, 0, False), (64, 128, 4, 1, False, 2, 0, False),
     (128, 64, 8, 1, False, 2, 0, False), (64, 64, 8, 1, True, 2, 0, False),
     (128, 64, 8, 1, False, 2, 1, False), (128, 32, 8, 2, False, 2, 1, False),
     (128, 64, 8, 1, False, 2, 1, True), (128, 64, 8, 1, False, 2, 0, True),
     (64, 64, 8, 1, True, 1, 1, True)],
    ids=["w4s1", "bn128-w8s1", "w8s3", "w8-via-memory", "w4-value-halves",
         "bn128-w4-value-halves", "bh128-w8-value-halves", "w8-via-memory-value-halves",
         "bh128-prefetch1", "bh128-bn32-s2-prefetch1", "bh128-prefetch1-fp16", "bh128-fp16",
         "via-memory-prefetch1-fp16"])
def test_sparse_mla_triton_gpu_tile_variants(block_h, block_n, num_warps, num_stages,
                                             scores_via_memory, value_splits, prefetch, fp16):
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_blocks, block_size, k = 40, 128, 2048
    cache = make_latent_cache(num_blocks, block_size, torch.float8_e4m3fn, seed=5,
                              device="cuda")
    slots = make_slots(16, k, num_blocks * block_size, 0.05, seed=6).cuda()
    q = torch.randn(16, 96, 576, generator=torch.Generator().manual_seed(7))
    q = q.to(torch.bfloat16).cuda()
    got_out, got_lse = sparse_mla_triton(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE,
                                         MLATileConfig(block_h=block_h, block_n=block_n,
                                                       num_warps=num_warps,
                                                       num_stages=num_stages,
                                                       scores_via_memory=scores_via_memory,
                                                       value_splits=value_splits,
                                                       prefetch=prefetch, fp16_operands=fp16))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype, latent_dtype", [(torch.float32, torch.float32),
                                                   (torch.float32, torch.float8_e4m3fn),
                                                   (torch.bfloat16, torch.float32)],
                         ids=["fp32-fp32", "fp32-fp8", "bf16-fp32"])
def test_sparse_mla_triton_gpu_float32_is_exact(q_dtype, latent_dtype):
    """A float32 side makes every product float32 (the engine's float32 mode)."""
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_blocks, block_size, k = 20, 64, 300
    cache = make_latent_cache(num_blocks, block_size, latent_dtype, seed=8, device="cuda")
    slots = make_slots(6, k, num_blocks * block_size, 0.2, seed=9).cuda()
    q = torch.randn(6, 96, 576, generator=torch.Generator().manual_seed(10)).to(q_dtype).cuda()
    got_out, got_lse = sparse_mla_triton(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("out", got_out, want_out, 1e-4, 1e-5)
    assert_close("lse", got_lse, want_lse, 1e-5, 1e-5)
