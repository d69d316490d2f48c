"""The Hopper Gluon indexer (gluon_kernels/indexer_score_hopper*.py) against indexer_score_torch.

CPU: the launcher's refusals name their reason, the shared-memory formula fits every ring, and
an offline sm_90 compile (a subprocess without TRITON_INTERPRET) shows the design: wgmma,
TMA loads, register hand-back, no stack in the exact and fp8 kernels. GPU (``-m gpu``, sm_90
only): awkward shapes (length 1, lengths off the 64-key tile, mixed requests, 1 / 4 / 8 rows a
request in any order, block sizes 64 and 128, a strided engine cache view) within the op's
tolerance for the exact fp16 products; the fp8 products within a bound derived from how Hopper
accumulates them (`fp8_error_bound`), their top-k overlap with the exact scores printed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch, quantize_index_keys

REPO = Path(__file__).resolve().parents[2]
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


# ---- CPU ---------------------------------------------------------------------------------

def test_why_not_hopper_names_the_reason_off_a_gpu():
    from gluon_kernels.indexer_score_hopper_launch import why_not_hopper

    values = torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn)
    reason = why_not_hopper(torch.zeros(1, 32, 128), values, torch.zeros(2, 64), "fp8", 64)
    assert reason == "needs an NVIDIA Hopper GPU, got a cpu tensor"
    assert "interpreter" in why_not_hopper(torch.zeros(1), values, values, "fp8", 64,
                                           interpreted=True)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("product", ["fp16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_query_prep_compiled_is_bit_exact_with_the_quantizer(product, dtype):
    test_query_prep_is_bit_exact_with_the_quantizer(product, dtype, device=DEVICE)


def test_triton_launcher_refuses_unknown_kernels_and_foreign_knobs():
    from atomk31.triton_kernels.indexer_score import IndexerScoreConfig, indexer_score_triton

    args = (torch.zeros(1, 32, 128), torch.zeros(1, 32),
            torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn), torch.zeros(2, 64), "fp8",
            "e4m3fn", torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int64), 64)
    with pytest.raises(ValueError, match=r"kernel must be one of \('triton', 'gluon_hopper'"):
        indexer_score_triton(*args, kernel="cutlass")
    with pytest.raises(ValueError, match=r"takes no config or use_fp8_dot"):
        indexer_score_triton(*args, kernel="gluon_hopper", config=IndexerScoreConfig())
    with pytest.raises(ValueError, match=r"needs an NVIDIA Hopper GPU, got a cpu tensor"):
        indexer_score_triton(*args, kernel="gluon_hopper")
    with pytest.raises(ValueError, match=r"product must be one of"):
        from gluon_kernels.indexer_score_hopper_launch import indexer_score_hopper
        indexer_score_hopper(*args, product="bf16")


@pytest.mark.parametrize("product", ["fp16", "fp8_acc32", "fp8"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_every_launch_shape_fits_shared_memory(product, rows):
    from gluon_kernels import indexer_score_hopper as kernel

    rows = min(rows, kernel.MAX_COLUMNS[product] // NUM_HEADS)
    stages = kernel.stages_that_fit(rows, NUM_HEADS, product)
    assert stages >= 8, f"{product} rows {rows}: only {stages} stages fit"
    assert kernel.shared_bytes(rows, NUM_HEADS, stages, product) <= kernel.MAX_SHARED_BYTES


def awkward_queries(num_rows, num_heads, dtype, seed):
    """Queries whose quantization takes every path: an all-zero head (the amax floor), a head
    below the floor, heads whose largest values divide to ~448 (saturation), values that land
    in e4m3's subnormals and under half its smallest step, fp32 subnormals, -0, and random
    magnitudes over 2^-20..2^20."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_rows, num_heads, 128, generator=generator)
    q *= torch.exp2(torch.randint(-20, 21, (num_rows, num_heads, 1), generator=generator).float())
    q[0, 0] = 0.0
    q[0, 1] = 3e-5 * torch.randn(128, generator=generator)  # amax under the 1e-4 floor
    q[0, 2, :64] = 1.0 / 448 * torch.arange(64) * 2.0**-8  # codes 0, 2^-9.. (subnormals)
    q[0, 2, 64] = 1.0
    q[0, 2, 65:68] = torch.tensor([1.0, 2.0, 3.0]) * 2.0**-11 / 448  # under / at / over half a step
    q[0, 3, :] = -0.0
    q[0, 3, 5] = 7.0
    if num_rows > 1:
        q[1, 0, :] = 448.0 * (1 - torch.rand(128, generator=generator) * 2.0**-10)
        q[1, 0, 3] = -448.0
        q[1, 1, :8] = torch.tensor([1e-40, -1e-39, 1e-38, 0.0, 2e-45, -0.0, 5.0, -5.0])
    return q.to(dtype)


@pytest.mark.parametrize("product", ["fp16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_query_prep_is_bit_exact_with_the_quantizer(product, dtype, device="cpu"):
    """The launcher's one-launch query preparation (a Triton kernel, run here by the
    interpreter; compiled on the GPU below) against the contract's quantizer: codes bit for
    bit (FP16 or e4m3fn), padded heads zero, weights x query scales bit for bit (zero past
    H_I); a strided q view."""
    from gluon_kernels.indexer_score_hopper_query_prep import prepare_queries

    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors need Triton's interpreter (the GPU variant runs compiled)")
    num_rows, num_heads, heads_pad = 3, 20, 32
    q = awkward_queries(num_rows, num_heads, dtype, seed=23)
    wide = torch.full((num_rows, 2 * num_heads, 128), float("nan"), dtype=dtype)
    wide[:, ::2] = q
    q = wide[:, ::2]  # strided heads: a view, as a caller's slice
    weights = torch.randn(num_rows, num_heads, generator=torch.Generator().manual_seed(24))
    codes, folded = prepare_queries(q.to(device), weights.to(device), heads_pad, product)
    codes, folded = codes.cpu(), folded.cpu()
    want_values, want_scales = quantize_index_keys(q, "fp8", "e4m3fn")
    want_codes = want_values if product == "fp8" else want_values.to(torch.float16)
    assert codes.dtype == want_codes.dtype and codes.shape == (num_rows, heads_pad, 128)
    bits = torch.uint8 if product == "fp8" else torch.int16
    assert torch.equal(codes[:, :num_heads].view(bits), want_codes.view(bits))
    assert not codes[:, num_heads:].view(bits).any()
    want_weights = weights.float() * want_scales
    assert torch.equal(folded[:, :num_heads].view(torch.int32), want_weights.view(torch.int32))
    assert not folded[:, num_heads:].any()
    # the awkward paths were taken
    assert want_scales[0, 0] == want_scales[0, 1] == torch.tensor(1e-4) / 448.0
    assert (want_values[1, 0].float().abs() == 448).sum() >= 2
    assert ((want_values[0, 2].float().abs() > 0) & (want_values[0, 2].float().abs() < 2**-6)).any()


COMPILE_SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from gluon_kernels import indexer_score_hopper as kernel
from gluon_kernels.indexer_score_hopper_launch import compile_examples
from gluon_kernels.targets import target_for_arch

report = {}
for example in compile_examples(target_for_arch("sm90")):
    compiled = triton.compile(
        GluonASTSource(fn=example.fn, signature=example.signature,
                       constexprs=example.constexprs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": example.num_warps, "maxnreg": kernel.KERNEL_MAX_REGISTERS})
    tools = os.path.join(os.path.dirname(nvidia.__file__), "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    report[example.name] = {
        "hgmma": len(re.findall(r"\bHGMMA\.64x\d+x16\.F32\b", sass)),
        "qgmma": len(re.findall(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3\b", sass)),
        "f2fp": len(re.findall(r"F2FP\.F16\.E4M3", sass)),
        "tma_load": len(re.findall(r"UTMALDG", sass)),
        "setmaxreg": len(re.findall(r"USETMAXREG", sass)),
        "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
        "shared": compiled.metadata.shared, "triton": triton.__version__}
print(json.dumps(report))
"""


def test_gluon_hopper_indexer_compiles_for_sm90_offline():
    """Every compile example builds for sm_90 with no GPU: wgmma of the product's type (fp16
    products of codes converted in registers: F2FP; fp8 from shared memory), TMA loads,
    setmaxnreg, shared memory within a CTA's. Stack: none in the exact kernel of 1 and 4 rows
    (triton 3.6 and 3.9); 8 rows and the fp8 ones keep <= 56 B, used outside the tile loops
    (the module docstring)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("the offline sm_90 compile took over 600 s")
    if done.returncode != 0 and "cuobjdump" in done.stderr and "No such file" in done.stderr:
        pytest.skip("this triton wheel has no cuobjdump to read the SASS")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, compiled in report.items():
        assert compiled["tma_load"] >= 2 and compiled["setmaxreg"] > 0, (name, compiled)
        assert compiled["shared"] <= 227 * 1024, (name, compiled)
        if "fp16" in name:
            assert compiled["hgmma"] >= 16 and compiled["f2fp"] >= 64, (name, compiled)
        else:
            assert compiled["qgmma"] >= 8, (name, compiled)
        if "fp16 rows1" in name or "fp16 rows4" in name:
            assert compiled["stack"] == 0, (name, compiled)
        else:  # the spills are outside the tile loops (module docstring)
            assert compiled["stack"] <= 64, (name, compiled)


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


def test_default_kernel_off_hopper_and_when_tuned_is_triton():
    """The launcher's default: Triton for CPU tensors (even inside replayed launches) and
    whenever a Triton configuration is asked for; no Gluon import needed to decide."""
    from atomk31.triton_kernels.indexer_score import default_kernel
    from atomk31.triton_kernels.runtime import replayed_launches

    q = torch.zeros(4, NUM_HEADS, 128)
    values = torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(2, 64)
    with replayed_launches():
        assert default_kernel(q, values, scales, "fp8", 64) == "triton"
    assert default_kernel(q, values, scales, "fp8", 64, tuned=True) == "triton"


@pytest.mark.gpu
@hopper
def test_default_kernel_is_gluon_for_replayed_fp8_launches():
    """On Hopper the default is the Gluon kernel's exact products for launches replayed from a
    CUDA graph (FP8 keys), Triton for eager launches and MXFP4 keys; the replayed default's
    scores are the contract's."""
    from atomk31.triton_kernels.indexer_score import default_kernel, indexer_score_triton
    from atomk31.triton_kernels.runtime import replayed_launches

    block_table, values, scales, gpu_values, gpu_scales = build_cache([300, 70], 128, seed=21)
    row_request, row_position, q, weights = make_rows([(0, 299), (1, 69), (0, 298)], seed=22)
    q_gpu = q.cuda()
    assert default_kernel(q_gpu, gpu_values, gpu_scales, "fp8", 128) == "triton"
    mxfp4 = torch.zeros(2, 128, 64, dtype=torch.uint8, device=DEVICE)
    mxfp4_scales = torch.zeros(2, 128, 4, dtype=torch.uint8, device=DEVICE)
    with replayed_launches():
        assert default_kernel(q_gpu, gpu_values, gpu_scales, "fp8", 128) == "gluon_hopper"
        assert default_kernel(q_gpu, mxfp4, mxfp4_scales, "mxfp4", 128) == "triton"
        got = indexer_score_triton(q_gpu, weights.cuda(), gpu_values, gpu_scales, "fp8",
                                   "e4m3fn", block_table.cuda(), row_request.cuda(),
                                   row_position.cuda(), 128, num_positions=300)
    want = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                               row_request, row_position, 128)
    assert_scores_close("scores", got.cpu(), want)


@pytest.mark.gpu
@hopper
def test_through_the_triton_launcher():
    from atomk31.triton_kernels.indexer_score import indexer_score_triton

    block_table, values, scales, gpu_values, gpu_scales = build_cache([90, 7], 64, seed=17)
    row_request, row_position, q, weights = make_rows([(0, 89), (1, 6), (0, 88)], seed=18)
    got = indexer_score_triton(q.cuda(), weights.cuda(), gpu_values, gpu_scales, "fp8",
                               "e4m3fn", block_table.cuda(), row_request.cuda(),
                               row_position.cuda(), 64, kernel="gluon_hopper")
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
