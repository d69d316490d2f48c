"""indexer_score_triton against indexer_score_torch (§4.6 "Quantized evaluation"): the same
-inf pattern, finite scores within rtol 1e-5 + 1e-5 x the row's max |score|; under Triton's
interpreter on the CPU and on a GPU at real sizes (H_I = 32, 128-token blocks)."""

import pytest
import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch

KERNEL_MODULES = ("atomk31.triton_kernels.kv_write", "atomk31.triton_kernels.indexer_score")
KEY_FORMATS = [("fp8", "e4m3fn"), ("fp8", "e4m3fnuz"), ("mxfp4", "e4m3fn")]
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


def build_cache(request_lengths, block_size, key_format, seed):
    """Keys of each request written (by kv_write_torch) into a paged cache whose blocks are
    handed out shuffled; the pages are strided views (latent-sized gaps between them)."""
    index_format, fp8_variant = key_format
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in request_lengths]
    num_blocks = sum(blocks_needed) + 2
    free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(request_lengths), max(blocks_needed) + 1), -1,
                             dtype=torch.int32)
    for request, count in enumerate(blocks_needed):
        for column in range(count):
            block_table[request, column] = free_blocks.pop()
    if index_format == "fp8":
        values = torch.zeros(num_blocks, block_size, 192, dtype=FP8_DTYPES[fp8_variant])
        values, scales = values[:, :, 32:160], torch.zeros(num_blocks, block_size)
    else:
        values = torch.zeros(num_blocks, block_size, 96, dtype=torch.uint8)[:, :, 16:80]
        scales = torch.zeros(num_blocks, block_size, 4, dtype=torch.uint8)
    latent = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    for request, length in enumerate(request_lengths):
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        keys = torch.randn(length, 128, generator=generator) * 2.0
        kv_write_torch(torch.zeros(length, 576), keys, slots, latent, 1.0, values, scales,
                       index_format, fp8_variant)
    return block_table, values, scales


def make_rows(rows, num_heads, seed):
    """(row_request, row_position, q, head_weights) for [(request, position), ...]."""
    generator = torch.Generator().manual_seed(seed)
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64)
    q = torch.randn(len(rows), num_heads, 128, generator=generator).to(torch.bfloat16)
    head_weights = torch.randn(len(rows), num_heads, generator=generator)
    head_weights *= num_heads**-0.5 * 128**-0.5  # mixed signs: scores can be negative
    return row_request, row_position, q, head_weights


def assert_scores_close(name, got, want, atol_scale="row"):
    """Same -inf pattern; finite parts within rtol 1e-5, atol 1e-5 * the row's max |score|
    (the op's tolerance), or * the batch's max |score| for tensor-core products, whose fp32
    accumulation is not IEEE-sequential: its error follows the size of the terms, which a
    row of one cancelling score (length 1) does not show."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: -inf mask differs"
    assert not torch.isnan(got).any(), f"{name}: NaN"
    finite = torch.isfinite(want)
    row_scale = torch.where(finite, want.abs(), 0.0).amax(dim=1, keepdim=True).clamp_min(1e-30)
    if atol_scale == "batch":
        row_scale = row_scale.amax().expand_as(row_scale)
    error = torch.where(finite, (got - want).abs(), 0.0)
    bound = 1e-5 * want.abs() + 1e-5 * row_scale
    worst = (error / bound).max().item() if want.numel() else 0.0
    assert worst <= 1.0, f"{name}: max error {error.max().item():.3e} is {worst:.2f}x the bound"


def score_both(score, block_table, values, scales, key_format, rows, num_heads, block_size,
               device, seed=7, **options):
    row_request, row_position, q, weights = make_rows(rows, num_heads, seed)
    index_format, fp8_variant = key_format
    args = (block_table, row_request, row_position)
    got = score(q.to(device), weights.to(device), values.to(device), scales.to(device),
                index_format, fp8_variant, *(a.to(device) for a in args), block_size, **options)
    want = indexer_score_torch(q, weights, values, scales, index_format, fp8_variant, *args,
                               block_size)
    return got.cpu(), want


# Mixed batch: a decode row at position 0 (length 1), four verification rows of one request
# (consecutive positions), prefill rows around block edges; requests interleaved.
MIXED_ROWS = [(2, 129), (1, 33), (0, 0), (1, 34), (2, 0), (1, 35), (2, 64), (1, 36), (2, 127),
              (2, 128), (2, 16), (2, 15)]


@pytest.mark.parametrize("key_format", KEY_FORMATS, ids=lambda f: "keys_" + "_".join(f))
@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_indexer_score_triton_interpreter_mixed_rows(interpreted, block_size, key_format):
    block_table, values, scales = build_cache([1, 37, 130], block_size, key_format, seed=3)
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           key_format, MIXED_ROWS, 4, block_size, "cpu")
    assert_scores_close("scores", got, want)


@pytest.mark.parametrize("num_heads", [1, 32], ids=lambda h: f"H{h}")
def test_indexer_score_triton_interpreter_decode_rows(interpreted, num_heads):
    # One row per request (plain decode): rows of a program belong to different requests.
    block_table, values, scales = build_cache([70, 5, 1, 66], 16, ("fp8", "e4m3fn"), seed=4)
    rows = [(0, 69), (1, 4), (2, 0), (3, 65)]
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           ("fp8", "e4m3fn"), rows, num_heads, 16, "cpu")
    assert_scores_close("scores", got, want)


# Interpreter configurations of the GPU code paths: block-table reads per group of 2 tiles
# (group edges inside a request, a last partial group); one read per tile; fp16 operands.
PATH_CONFIGS = {
    "tile_group2": dict(dot="fp32", block_n=16, num_stages=1, tile_group=2),
    "tile_reads": dict(dot="fp32", block_n=16, num_stages=1, tile_group=0),
    "fp16_tile_group2": dict(dot="fp16", block_n=16, num_stages=1, tile_group=2),
}


@pytest.mark.parametrize("path", PATH_CONFIGS)
def test_indexer_score_triton_interpreter_kernel_paths(interpreted, path):
    from atomk31.triton_kernels.indexer_score import IndexerScoreConfig

    block_table, values, scales = build_cache([1, 37, 130], 16, ("fp8", "e4m3fn"), seed=3)
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           ("fp8", "e4m3fn"), MIXED_ROWS, 4, 16, "cpu",
                           config=IndexerScoreConfig(**PATH_CONFIGS[path], programs_per_sm=2))
    assert_scores_close("scores", got, want)


@pytest.mark.parametrize("extra", [0, 5], ids=lambda e: f"L_plus_{e}")
def test_indexer_score_triton_interpreter_num_positions(interpreted, extra):
    # The caller's L (host metadata, no device read): max(position) + 1, or wider (-inf there).
    block_table, values, scales = build_cache([37, 130], 16, ("fp8", "e4m3fn"), seed=8)
    rows = [(0, 36), (1, 129), (1, 40)]
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           ("fp8", "e4m3fn"), rows, 4, 16, "cpu", num_positions=130 + extra)
    assert got.shape == (3, 130 + extra)
    assert torch.isinf(got[:, 130:]).all()
    assert_scores_close("scores", got[:, :130], want)


def test_indexer_score_triton_rejects_fp16_dot_of_mxfp4_keys(interpreted):
    from atomk31.triton_kernels.indexer_score import IndexerScoreConfig

    block_table, values, scales = build_cache([3], 16, ("mxfp4", "e4m3fn"), seed=6)
    with pytest.raises(ValueError, match=r"dot 'fp16' is for fp8 keys"):
        interpreted.indexer_score_triton(torch.zeros(1, 4, 128), torch.zeros(1, 4), values,
                                         scales, "mxfp4", "e4m3fn", block_table,
                                         torch.tensor([0]), torch.tensor([2]), 16,
                                         config=IndexerScoreConfig(dot="fp16"))


def test_indexer_score_triton_interpreter_no_rows(interpreted):
    block_table, values, scales = build_cache([3], 16, ("fp8", "e4m3fn"), seed=5)
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           ("fp8", "e4m3fn"), [], 4, 16, "cpu")
    assert got.shape == want.shape == (0, 0)


@pytest.mark.parametrize("sizes", [(1, 1, 1), (16, 16, 256), (17, 3, 33)],
                         ids=["one-row-one-head-one-key", "sixteen", "odd"])
def test_indexer_score_triton_interpreter_size_one_and_odd_sizes(interpreted, sizes):
    """Every size argument at 1 (one request, one row, one head, one key: Triton passes such
    arguments as constants), at multiples of 16 and at odd sizes."""
    num_rows, num_heads, length = sizes
    lengths = [length] * num_rows
    block_table, values, scales = build_cache(lengths, 16, ("fp8", "e4m3fn"), seed=length)
    rows = [(r, length - 1) for r in range(num_rows)]
    got, want = score_both(interpreted.indexer_score_triton, block_table, values, scales,
                           ("fp8", "e4m3fn"), rows, num_heads, 16, "cpu",
                           num_positions=length)
    assert_scores_close("scores", got, want)


def test_indexer_score_triton_does_not_read_the_device(interpreted, monkeypatch):
    """With num_positions from the host the launcher never turns a device tensor into a
    Python value (graph steps capture it)."""
    block_table, values, scales = build_cache([37, 130], 16, ("fp8", "e4m3fn"), seed=8)
    rows = [(0, 36), (1, 129), (1, 40)]
    row_request, row_position, q, weights = make_rows(rows, 4, seed=7)

    def forbidden(*_args, **_kwargs):
        raise AssertionError("host sync")

    for name in ("tolist", "item", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    got = interpreted.indexer_score_triton(q, weights, values, scales, "fp8", "e4m3fn",
                                           block_table, row_request, row_position, 16,
                                           num_positions=130)
    monkeypatch.undo()
    want = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                               row_request, row_position, 16)
    assert_scores_close("scores", got, want)


def test_indexer_score_triton_refuses_more_heads_than_a_program_holds(interpreted):
    block_table, values, scales = build_cache([3], 16, ("fp8", "e4m3fn"), seed=6)
    with pytest.raises(ValueError, match=r"handles up to 128 heads, got H_I=129"):
        interpreted.indexer_score_triton(torch.zeros(1, 129, 128), torch.zeros(1, 129),
                                         values, scales, "fp8", "e4m3fn", block_table,
                                         torch.tensor([0]), torch.tensor([2]), 16)


@pytest.mark.parametrize("fp8_keys, want_dot, want_block_n", [(True, "fp16", 64),
                                                               (False, "bf16", 128)])
def test_indexer_score_cuda_default_by_key_format(monkeypatch, fp8_keys, want_dot, want_block_n):
    # FP8 keys: exact fp16 products (measured fastest on the H200); MXFP4 keys: bf16 (their
    # values x 2^e overflow fp16).
    from types import SimpleNamespace

    from atomk31.triton_kernels import indexer_score_config as config_module

    target = SimpleNamespace(backend="cuda", arch=90, warp_size=32)
    fake_driver = SimpleNamespace(active=SimpleNamespace(get_current_target=lambda: target))
    monkeypatch.setattr(config_module, "runs_on_interpreter", lambda kernel: False)
    monkeypatch.setattr(config_module, "driver", fake_driver)
    config = config_module.default_config(None, fp8_keys=fp8_keys)
    assert (config.dot, config.block_n) == (want_dot, want_block_n)


# GPU configurations: the default (what the op runs: fp16 n64 w4 s6 pps2 for FP8 keys, bf16
# n128 for MXFP4) and the exact variants the benchmark compares.
FP16_N64_W4 = dict(dot="fp16", block_n=64, num_warps=4, programs_per_sm=2, tile_group=32)
GPU_CONFIGS = {
    "default": None,
    "bf16_n128_s4": dict(dot="bf16", num_stages=4),
    "fp16_n128_s3": dict(dot="fp16", num_stages=3, tile_group=32),
    "fp16_n64_w4_s4": dict(FP16_N64_W4, num_stages=4),
    "tile_reads": dict(FP16_N64_W4, num_stages=6, tile_group=0),
}
# 8 requests x 4 verification rows, contexts from 1 to past top-k and past a block edge.
GPU_LENGTHS = [1, 128, 129, 2049, 3000, 5000, 9000, 12289]


def gpu_scores(key_format, config=None):
    from atomk31.triton_kernels.indexer_score import IndexerScoreConfig, indexer_score_triton

    block_table, values, scales = build_cache(GPU_LENGTHS, 128, key_format, seed=9)
    rows = [(r, max(0, n - 4 + j)) for r, n in enumerate(GPU_LENGTHS) for j in range(4)]
    return score_both(indexer_score_triton, block_table, values, scales, key_format,
                      rows, 32, 128, "cuda", num_positions=GPU_LENGTHS[-1],
                      config=IndexerScoreConfig(**config) if config else None)


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
@pytest.mark.parametrize("key_format", [("fp8", "e4m3fn"), ("mxfp4", "e4m3fn")],
                         ids=lambda f: "keys_" + f[0])
def test_indexer_score_triton_gpu_verification_rows(key_format, config):
    options = GPU_CONFIGS[config]
    if key_format[0] == "mxfp4" and options and options["dot"] == "fp16":
        pytest.skip("fp16 products are for fp8 keys")
    got, want = gpu_scores(key_format, options)
    assert_scores_close("scores", got, want, atol_scale="batch")
