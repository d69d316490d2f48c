"""The Gluon Hopper PTPC-FP8 GEMM (gluon_kernels/ptpc_fp8_hopper.py) vs the torch op (MODEL_SPEC
§6.5).

CPU: the launchers refuse what the kernel cannot run (ValueError), and an offline sm_90
compile (in a subprocess without TRITON_INTERPRET, as tests/amd_compile does) shows the design
in the SASS: FP8 wgmma (QGMMA), waits that leave one wgmma in flight, no spills. GPU (``-m gpu``,
sm_90 only): awkward shapes (M, N and K off the tiles) and proxy shapes, within 1.25 x
torch._scaled_mm's own error on the same inputs (the Triton kernels' bound).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atomk31.ops.linear import ptpc_linear_quantized_torch, ptpc_quantize_torch
from atomk31.quant.ptpc import quantize_weight_ptpc
from atomk31.triton_kernels.ptpc_fp8 import GemmConfig, ptpc_linear_quantized_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The bounds of test_ptpc_fp8.py (see there): 1.25 x torch._scaled_mm's error on the same
# inputs + 1e-5, or 3e-4 where _scaled_mm cannot run the shape.
FP8_GEMM_TOLERANCE = 3e-4
SCALED_MM_ERROR_FACTOR, SCALED_MM_ERROR_SLACK = 1.25, 1e-5
REPO = Path(__file__).resolve().parents[2]
IS_HOPPER = torch.cuda.is_available() and torch.version.hip is None and \
    torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not IS_HOPPER, reason="needs an NVIDIA sm_90 GPU (wgmma, TMA)")

GLUON = GemmConfig(128, 128, 128, num_stages=4, persistent=True, kernel="gluon_hopper")
GLUON_192 = GemmConfig(192, 128, 128, num_stages=3, persistent=True, kernel="gluon_hopper")


def random_matrix(rows, cols, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=generator) * 3).to(device=DEVICE, dtype=dtype)


def scaled_mm_relative_error(x_q, x_scale, w_q, w_scale, expected) -> float:
    """torch._scaled_mm (cuBLASLt FP8) on the same inputs, fp32 out (unit per-tensor scales,
    the row and column scales applied afterwards in fp32)."""
    one = torch.ones((), device=x_q.device)
    y = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    y = y * x_scale[:, None] * w_scale[None, :]
    return ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def gluon_config(**fields) -> GemmConfig:
    return GemmConfig(**{**GLUON.__dict__, **fields})


def test_gluon_stages_that_fit_the_output_tile():
    from atomk31.triton_kernels.ptpc_fp8 import gluon_stages_that_fit
    from atomk31.triton_kernels.ptpc_fp8_config import (
        HOPPER_GLUON_NARROW_CONFIG, HOPPER_GLUON_ONE_WAVE_CONFIG,
    )

    assert gluon_stages_that_fit(HOPPER_GLUON_ONE_WAVE_CONFIG, torch.bfloat16).num_stages == 6
    assert gluon_stages_that_fit(HOPPER_GLUON_ONE_WAVE_CONFIG, torch.float32).num_stages == 5
    assert gluon_stages_that_fit(HOPPER_GLUON_NARROW_CONFIG, torch.float32).num_stages == 6
    assert gluon_stages_that_fit(GLUON, torch.float32) == GLUON


def test_gluon_launcher_refuses_mismatched_shapes_and_dtypes():
    from gluon_kernels.ptpc_fp8_hopper import ptpc_gemm_hopper

    fp8 = torch.float8_e4m3fn
    a, w_q = torch.zeros(4, 64, dtype=fp8), torch.zeros(8, 64, dtype=fp8)
    scales = torch.ones(4), torch.ones(8)
    with pytest.raises(ValueError, match=r"expected a \[M, K\], w_q \[N, K\]"):
        ptpc_gemm_hopper(a, torch.zeros(8, 32, dtype=fp8), *scales,
                         torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"expected float8_e4m3fn a and w_q"):
        ptpc_gemm_hopper(a.to(torch.float8_e4m3fnuz), w_q, *scales,
                         torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"bfloat16, float16 or float32 c"):
        ptpc_gemm_hopper(a, w_q, *scales, torch.empty(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"needs an NVIDIA sm_90 GPU"):
        ptpc_gemm_hopper(a, w_q, *scales, torch.empty(4, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("config, message", [
    (gluon_config(), r"does not run under Triton's interpreter"),
    (gluon_config(kernel="cutlass"), r"config.kernel must be one of"),
])
def test_ptpc_linear_refuses_gluon_config_on_the_interpreter(config, message):
    if torch.cuda.is_available():
        pytest.skip("interpreter test: runs where no GPU is visible")
    x_q, x_scale = ptpc_quantize_torch(random_matrix(3, 64, seed=1))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(8, 64, seed=2))
    with pytest.raises(ValueError, match=message):
        ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32, config)


@pytest.mark.skipif(torch.cuda.is_available() and not IS_HOPPER,
                    reason="the tile checks run before the device check only off a GPU or on "
                           "Hopper")
@pytest.mark.parametrize("fields, message", [
    ({"split_k": 2}, r"takes 128 K per tile and no split K"),
    ({"block_k": 256}, r"takes 128 K per tile and no split K"),
    ({"block_m": 64}, r"expected \(block_m, block_n\) in"),
    ({"block_m": 192, "num_stages": 4}, r"bytes of shared memory, over Hopper's"),
], ids=["split-k", "block-k-256", "block-m-64", "192-rows-4-stages-fp32"])
def test_ptpc_linear_refuses_gluon_tiles_it_does_not_have(monkeypatch, fields, message):
    from atomk31.triton_kernels import ptpc_fp8
    from gluon_kernels import ptpc_fp8_hopper

    monkeypatch.setattr(ptpc_fp8, "runs_on_interpreter", lambda kernel: False)
    if not torch.cuda.is_available():          # the tile checks come after the device check
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        monkeypatch.setattr(ptpc_fp8_hopper.torch.cuda, "get_device_capability",
                            lambda device=None: (9, 0))
    x_q, x_scale = ptpc_quantize_torch(random_matrix(3, 64, seed=1))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(8, 64, seed=2))
    with pytest.raises(ValueError, match=message):
        ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32,
                                     gluon_config(**fields))


@pytest.mark.parametrize("m, n, k, uses_gluon", [
    (4096, 7168, 12288, True),        # o_proj: 1792 tiles of 128 x 128
    (1024, 7168, 12288, True),        # o_proj: 448 tiles, 180 GFLOP
    (128, 36864, 7168, True),         # kda qkv: 288 tiles, 68 GFLOP
    (128, 7168, 12288, False),        # o_proj: 56 tiles, fewer than the SMs
    (1024, 576, 7168, False),         # kv_a: 40 tiles
    (128, 18432, 1536, False),        # q_b: 7 GFLOP (the Gluon launch's host time would show)
    (4096, 24576, 512, "short K"),    # kv_b: K = 512, 4 K tiles a tile: no overlapped epilogue
    (1024, 24576, 512, False),        # kv_b: 26 GFLOP
    (64, 36864, 7168, False),         # below HOPPER_GLUON_MIN_M
])
def test_pick_config_takes_gluon_on_hopper_for_large_gemms(m, n, k, uses_gluon):
    from atomk31.triton_kernels.ptpc_fp8_config import (
        HOPPER_GLUON_CONFIG, HOPPER_GLUON_NO_OVERLAP_CONFIG, GemmTarget, pick_config_for_target,
    )

    hopper_target = GemmTarget(num_sms=132, is_amd=False, has_tma_ws=True)
    expected = {True: HOPPER_GLUON_CONFIG, "short K": HOPPER_GLUON_NO_OVERLAP_CONFIG}.get(uses_gluon)
    chosen = pick_config_for_target(m, n, k, hopper_target)
    assert chosen == expected if expected is not None else chosen.kernel == "triton"
    for other in (GemmTarget(132, False), GemmTarget(304, True)):   # not Hopper: never
        assert pick_config_for_target(m, n, k, other).kernel == "triton"


@pytest.mark.parametrize("m, n, k, expected", [
    (128, 7168, 12288, "narrow"),     # o_proj: 56 tiles of 128 x 128, 112 of 128 x 64
    (256, 7168, 6144, "one wave"),    # shared down: 112 tiles of 128 x 128, under 132 SMs
    (128, 12288, 7168, "one wave"),   # shared gate_up: 96 tiles
    (128, 18432, 1536, "wide"),       # q_b: 144 tiles, 7 GFLOP: no FLOP floor when replayed
    (128, 24576, 512, "short K"),     # kv_b: 192 tiles, but K = 512: no overlap
    (128, 576, 7168, None),           # kv_a: 9 tiles of 128 x 64
    (64, 7168, 12288, None),          # below HOPPER_GLUON_MIN_M
])
def test_replayed_launches_drop_the_flop_floor_and_take_narrow_tiles(m, n, k, expected):
    from atomk31.triton_kernels.ptpc_fp8_config import (
        HOPPER_GLUON_CONFIG, HOPPER_GLUON_NARROW_CONFIG, HOPPER_GLUON_NO_OVERLAP_CONFIG,
        HOPPER_GLUON_ONE_WAVE_CONFIG, GemmTarget, pick_config_for_target,
    )

    hopper = GemmTarget(num_sms=132, is_amd=False, has_tma_ws=True)
    want = {"narrow": HOPPER_GLUON_NARROW_CONFIG, "wide": HOPPER_GLUON_CONFIG,
            "one wave": HOPPER_GLUON_ONE_WAVE_CONFIG,
            "short K": HOPPER_GLUON_NO_OVERLAP_CONFIG}.get(expected)
    chosen = pick_config_for_target(m, n, k, hopper, replayed=True)
    assert chosen == want if want is not None else chosen.kernel == "triton"
    # eager launches keep the FLOP floor: none of these small GEMMs takes Gluon
    assert pick_config_for_target(m, n, k, hopper).kernel == "triton"
    assert pick_config_for_target(m, n, k, GemmTarget(132, False), replayed=True).kernel == \
        "triton"


def test_gluon_default_falls_back_to_the_pointer_kernel_on_unaligned_rows(monkeypatch):
    """A Gluon default with K not a multiple of 16 (no TMA): the pointer kernel's config."""
    from atomk31.triton_kernels import ptpc_fp8

    if torch.cuda.is_available():
        pytest.skip("interpreter test: runs where no GPU is visible")
    monkeypatch.setattr(ptpc_fp8, "pick_config", lambda m, n, k: GLUON)
    monkeypatch.setattr(ptpc_fp8, "current_target",
                        lambda: ptpc_fp8.GemmTarget(132, False, has_tma_ws=True))
    monkeypatch.setattr(ptpc_fp8, "pick_config_for_target",
                        lambda m, n, k, target: GemmConfig(16, 32, 64, num_stages=1,
                                                           promote_every=None))
    x_q, x_scale = ptpc_quantize_torch(random_matrix(5, 72, seed=15))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(40, 72, seed=16))
    y = ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32)
    expected = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    assert torch.allclose(y, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


# Compiled in a subprocess: the test session sets TRITON_INTERPRET, under which a kernel
# cannot go to ptxas. Prints the SASS counts as JSON.
COMPILE_SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from gluon_kernels import ptpc_fp8_hopper as kernel
from gluon_kernels.targets import target_for_arch

example = next(e for e in kernel.compile_examples(target_for_arch("sm90"))
               if e.name == sys.argv[1])
consumers = example.constexprs["NUM_CONSUMERS"]
compiled = triton.compile(
    GluonASTSource(fn=example.fn, signature=example.signature, constexprs=example.constexprs),
    target=GPUTarget("cuda", 90, 32),
    options={"num_warps": example.num_warps,
             "maxnreg": kernel.KERNEL_MAX_REGISTERS[consumers]})
tools = os.path.join(os.path.dirname(nvidia.__file__), "bin")
with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
    cubin.write(compiled.asm["cubin"])
    cubin.flush()
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name],
                          capture_output=True, text=True, check=True).stdout
counts = {name: len(re.findall(pattern, sass)) for name, pattern in {
    "qgmma": r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3", "wait_one": r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1",
    "wait_all": r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", "tma_load": r"UTMALDG",
    "tma_store": r"UTMASTG", "local": r"\b(LDL|STL)\b"}.items()}
counts["triton"] = triton.__version__
counts["shared"] = compiled.metadata.shared
print(json.dumps(counts))
"""


# example -> (consumer warpgroups, wgmma issue sites per consumer, waits that leave one wgmma
# running, waits that drain, per consumer). Two partials (128 x 128): the first K tile, the pair
# loop's two and the odd tail issue; the pair loop's two waits and the odd tail's first leave
# the next K tile's wgmma running; the two tails drain. One partial (192 x 128): one issue and
# one draining wait per K tile.
SASS_SHAPES = {"ptpc_gemm_hopper[128x128 bf16]": (2, 4, 3, 2),
               "ptpc_gemm_hopper[192x128 bf16]": (3, 1, 0, 1)}


@pytest.mark.parametrize("name", list(SASS_SHAPES))
def test_gluon_kernel_compiles_for_sm90_with_pipelined_wgmma(name):
    """FP8 wgmma of K = 128 in 4 QGMMA of 32 per issue site, the waits where the design puts
    them (SASS_SHAPES), TMA loads and stores, and no local memory (no spills)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    try:
        done = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, name], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("the offline sm_90 compile took over 300 s")
    if done.returncode != 0 and "cuobjdump" in done.stderr and "No such file" in done.stderr:
        pytest.skip("this triton wheel has no cuobjdump to read the SASS")
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    consumers, issues, waits_one, waits_all = SASS_SHAPES[name]
    assert counts["qgmma"] == consumers * issues * 4, counts
    assert counts["wait_one"] == consumers * waits_one, counts
    assert counts["wait_all"] == consumers * waits_all, counts
    assert counts["tma_load"] >= 2 and counts["tma_store"] >= 2 and counts["local"] == 0, counts
    assert counts["shared"] <= 227 * 1024, counts


def check_against_torch(m: int, n: int, k: int, config: GemmConfig,
                        out_dtype: torch.dtype = torch.float32, through_op: bool = False) -> None:
    """The Gluon kernel as close to fp32 math as torch._scaled_mm on the same inputs (fp32
    out), or within bf16 rounding of it (bf16 out). Called directly, the kernel writes into an
    output poisoned with NaN (an unwritten element fails; the op's fresh output could be a
    cached block still holding an earlier test's equal result); ``through_op``: through the
    Triton backend's launcher (its dispatch)."""
    from gluon_kernels.ptpc_fp8_hopper import ptpc_gemm_hopper

    x_q, x_scale = ptpc_quantize_torch(random_matrix(m, k, seed=m + k, dtype=torch.bfloat16))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(n, k, seed=n, dtype=torch.bfloat16))
    expected = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    if through_op:
        y = ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, out_dtype, config)
    else:
        y = torch.full((m, n), float("nan"), dtype=out_dtype, device=x_q.device)
        ptpc_gemm_hopper(x_q, w_q, x_scale, w_scale, y, block_m=config.block_m,
                         block_n=config.block_n, num_stages=config.num_stages,
                         group_m=config.group_m, persistent=config.persistent,
                         overlap_epilogue=config.overlap_epilogue)
    assert y.shape == (m, n) and y.dtype == out_dtype
    assert torch.isfinite(y).all(), f"{(~torch.isfinite(y)).sum().item()} elements not written"
    error = ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()
    if out_dtype != torch.float32:
        assert error <= 2 ** -8, f"relative error {error:.3g} > bf16 rounding"
        return
    try:
        peer = scaled_mm_relative_error(x_q, x_scale, w_q, w_scale, expected)
        limit = SCALED_MM_ERROR_FACTOR * peer + SCALED_MM_ERROR_SLACK
        against = f"torch._scaled_mm {peer:.3g}"
    except RuntimeError as failure:         # cuBLASLt wants dims that are multiples of 16
        limit, against = FP8_GEMM_TOLERANCE, f"the fixed bound (_scaled_mm: {failure})"
    assert error <= limit, f"relative error {error:.3g} > {limit:.3g} ({against})"


# Awkward shapes: M = 1 / 7 / 129 / 1000 (one to eight row tiles, ragged), N off the 128-column
# tiles (a multiple of 8: 16-byte bf16 output rows for the TMA store), K off 128 (zero-filled
# last K tile) with an odd and an even number of K tiles (the pair loop's two tails).
AWKWARD = [(1, 200, 272), (7, 72, 1040), (129, 328, 400), (1000, 520, 1168), (1000, 264, 16)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("config", [GLUON, gluon_config(block_n=64, num_stages=3),
                                    gluon_config(persistent=False), GLUON_192,
                                    gluon_config(num_stages=5),
                                    gluon_config(block_n=64, num_stages=6)],
                         ids=["128x128-s4", "128x64-s3", "one-tile-per-program", "192x128-s3",
                              "128x128-s5", "128x64-s6"])
@pytest.mark.parametrize("m,n,k", AWKWARD, ids=[f"M{m}-N{n}-K{k}" for m, n, k in AWKWARD])
def test_gluon_ptpc_gemm_awkward_shapes_gpu(m, n, k, config):
    check_against_torch(m, n, k, config)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m", [300, 2048], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("n,k", [(7168, 12288), (576, 7168), (24576, 512)],
                         ids=["o_proj", "kv_a", "kv_b"])
@pytest.mark.parametrize("config", [GLUON, GLUON_192], ids=["128x128", "192x128"])
def test_gluon_ptpc_gemm_proxy_shapes_gpu(m, n, k, config):
    check_against_torch(m, n, k, config)


@pytest.mark.gpu
@hopper
def test_launcher_default_is_gluon_for_large_gemms_on_hopper_gpu():
    from atomk31.triton_kernels.ptpc_fp8 import pick_config
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GLUON_CONFIG

    assert pick_config(2048, 7168, 12288) == HOPPER_GLUON_CONFIG
    assert pick_config(128, 7168, 12288).kernel == "triton"      # 56 tiles: the Triton kernel


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m,n,k", [(128, 7168, 12288), (128, 12288, 7168), (256, 7168, 6144),
                                   (128, 24576, 512)],
                         ids=["o_proj-M128", "gate_up-M128", "down-M256", "kv_b-M128"])
def test_replayed_launches_take_gluon_at_decode_shapes_gpu(m, n, k):
    """What a graph-captured decode step launches (the hopper target's graph rule,
    ptpc_fp8_config.HOPPER_GRAPH_RULE), through the launcher, against torch."""
    from atomk31.triton_kernels.ptpc_fp8 import pick_config
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GRAPH_RULE

    assert pick_config(m, n, k, HOPPER_GRAPH_RULE).kernel == "gluon_hopper"
    check_against_torch(m, n, k, HOPPER_GRAPH_RULE, torch.bfloat16, through_op=True)
    # a float32 output tile leaves room for fewer stages (gluon_stages_that_fit)
    check_against_torch(m, n, k, HOPPER_GRAPH_RULE, torch.float32, through_op=True)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m,n,k", AWKWARD, ids=[f"M{m}-N{n}-K{k}" for m, n, k in AWKWARD])
def test_gluon_one_wave_config_awkward_shapes_bf16_gpu(m, n, k):
    """The 6-stage 128 x 128 config fits beside a bf16 output tile only."""
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GLUON_ONE_WAVE_CONFIG

    check_against_torch(m, n, k, HOPPER_GLUON_ONE_WAVE_CONFIG, torch.bfloat16)


@pytest.mark.gpu
@hopper
def test_gluon_ptpc_gemm_through_the_triton_backend_bf16_output_gpu():
    check_against_torch(1000, 7168, 1024, GLUON, torch.bfloat16, through_op=True)


# Last in the file: the overlapped epilogue (each tile stored under the next tile's first wgmma),
# a non-default variant; persistent programs walk several tiles at these shapes (and a single
# tile per program at M = 1).
@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m,n,k", [*AWKWARD, (2048, 7168, 12288), (4096, 24576, 512)],
                         ids=[f"M{m}-N{n}-K{k}" for m, n, k in
                              [*AWKWARD, (2048, 7168, 12288), (4096, 24576, 512)]])
def test_gluon_ptpc_gemm_overlapped_epilogue_gpu(m, n, k):
    check_against_torch(m, n, k, gluon_config(overlap_epilogue=True))
