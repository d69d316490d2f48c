"""The Hopper Gluon sparse MLA kernels (the warp-specialized gluon_kernels/sparse_mla_hopper_ws.py,
the default, and the one-role sparse_mla_hopper.py) against sparse_mla_torch (§4.5, §4.6): on
an H100 / H200 at the model's 96 heads (and 16 / 64), 1, 7, 16 and 64 rows, selections of 1,
65, 100, 130, 2047 and 2048 slots with -1 padding (a row keeping only its first half) and a
row with no valid key, with the Triton kernel's GPU bounds (relative error of out <= 1e-2, of
lse <= 1e-3); offline, their sm_90 compiles (wgmma, 16-byte loads, little stack, shared
memory within a CTA's 227 KB). Few compiles on the GPU (the warp-specialized kernel takes
~20 s): its default order on both slot paths, the one-role kernel on one.
Gluon does not run under Triton's interpreter: no CPU numerics here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atomk31.ops.sparse_mla import sparse_mla_torch

SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02
MAX_SHARED_BYTES = 232448  # 227 KB: the most one CTA may hold on sm_90
REPO = Path(__file__).resolve().parents[2]


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None \
        and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not is_hopper(), reason="needs an NVIDIA Hopper GPU (sm_90)")


def make_cache(num_blocks: int, block_size: int, seed: int, every_other_block: bool = False):
    """An FP8 latent cache on the GPU, rows contiguous (16-byte aligned); every_other_block:
    a view of every other block of a twice larger buffer (block stride 2 x block_size x 576)."""
    generator = torch.Generator().manual_seed(seed)
    total = num_blocks * (2 if every_other_block else 1)
    rows = torch.randn(total, block_size, 576, generator=generator) / LATENT_SCALE
    rows = rows.clamp(-448, 448)
    cache = rows.to(torch.float8_e4m3fn).cuda()
    return cache[::2] if every_other_block else cache


def make_slots(num_rows: int, k: int, num_slots: int, seed: int) -> torch.Tensor:
    """k distinct slots a row, ~10% masked (-1), the last row all masked; row 1 of several
    keeps only its first half (a short selection padded with -1)."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.stack([torch.randperm(num_slots, generator=generator)[:k]
                         for _ in range(num_rows)]).to(torch.int32)
    slots[torch.rand(num_rows, k, generator=generator) < 0.1] = -1
    if num_rows > 2:
        slots[1, max(1, k // 2):] = -1
    slots[0, 0] = slots[0, 0].clamp_min(0)
    if num_rows > 1:
        slots[-1] = -1  # no valid key: out 0, lse -inf
    return slots.cuda()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    finite = torch.isfinite(want)
    diff = (got.double() - want.double()).masked_fill(~finite, 0)
    return (diff.norm() / want.double().masked_fill(~finite, 0).norm().clamp_min(1e-30)).item()


def check_against_torch(q, cache, slots, **knobs) -> None:
    from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper

    got_out, got_lse = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE, **knobs)
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert got_out.shape == want_out.shape and got_lse.shape == want_lse.shape
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse)), "lse -inf pattern differs"
    assert bool(torch.isfinite(got_out).all()), "non-finite output"
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3
    no_keys = (slots < 0).all(dim=1)
    assert bool((got_out[no_keys] == 0).all())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_heads, num_rows, k", [(96, 7, 100), (96, 64, 2048), (64, 1, 1)],
                         ids=lambda v: str(v))
def test_sparse_mla_gluon_hopper_one_role_matches_torch(num_heads, num_rows, k):
    """The one-role kernel (kernel="gluon_hopper", no longer the default: a few shapes, one
    compile; session 5 ran the full set)."""
    cache = make_cache(160, 128, seed=5)
    slots = make_slots(num_rows, k, 160 * 128, seed=6)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(7))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots, warp_specialized=False)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_heads, num_rows, k, num_splits", [
    (96, 64, 2048, None), (96, 16, 2048, None), (96, 64, 2047, None), (96, 16, 100, None),
    (96, 16, 1, None), (96, 7, 65, None), (96, 16, 2048, 3), (96, 16, 130, 2),
    (16, 7, 2048, None), (64, 64, 100, None), (64, 1, 1, None)],
    ids=lambda v: str(v))
def test_sparse_mla_gluon_hopper_ws_matches_torch(num_heads, num_rows, k, num_splits):
    """The warp-specialized kernel (its default order, late_values): 64 and 16 rows, lengths 1,
    65, 100, 130 (a split of one key tile and a short one), 2047 and 2048, -1 padding, a row
    with no valid key. Its other orders ran on the H200 in session 6 (rounds 1 and 2)."""
    cache = make_cache(160, 128, seed=17)
    slots = make_slots(num_rows, k, 160 * 128, seed=18)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(19))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots, num_splits=num_splits,
                        warp_specialized=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_splits", [None, 3], ids=lambda s: f"splits{s}")
def test_sparse_mla_gluon_hopper_ws_block_strided_cache(num_splits):
    """Blocks not back to back (slots split into block and offset), and explicit key splits."""
    cache = make_cache(80, 64, seed=8, every_other_block=True)
    assert cache.stride(0) != cache.shape[1] * cache.stride(1)
    slots = make_slots(7, 2048, 80 * 64, seed=9)
    q = torch.randn(7, 96, 576, generator=torch.Generator().manual_seed(10))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots, num_splits=num_splits,
                        warp_specialized=True)


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_ws_growing_maxima_match_torch():
    """Queries x 8: the softmax maxima grow by more than 2^8 between tiles (every tile's
    rescale of O matters)."""
    cache = make_cache(160, 128, seed=14)
    slots = make_slots(16, 2048, 160 * 128, seed=15)
    q = torch.randn(16, 96, 576, generator=torch.Generator().manual_seed(16))
    check_against_torch((q * 8.0).to(torch.bfloat16).cuda(), cache, slots,
                        warp_specialized=True)


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_ws_repeats_exactly():
    """The same inputs twice give the same bits (a missing hand-off between the roles would
    show as a result that moves between runs)."""
    from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper

    cache = make_cache(160, 128, seed=20)
    slots = make_slots(64, 2048, 160 * 128, seed=21)
    q = torch.randn(64, 96, 576, generator=torch.Generator().manual_seed(22))
    q = q.to(torch.bfloat16).cuda()
    first = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE, warp_specialized=True)
    for _ in range(3):
        again = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE,
                                  warp_specialized=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_triton_dispatches_gluon_hopper():
    """sparse_mla_triton's default on Hopper is the warp-specialized Gluon kernel where it
    applies (bench shape, 16 rows), the Triton kernel otherwise (a BF16 latent, misaligned
    rows)."""
    from atomk31.triton_kernels.sparse_mla import gluon_hopper_applies, sparse_mla_triton

    cache = make_cache(160, 128, seed=11)
    slots = make_slots(16, 2048, 160 * 128, seed=12)
    q = torch.randn(16, 96, 576, generator=torch.Generator().manual_seed(13))
    q = q.to(torch.bfloat16).cuda()
    assert gluon_hopper_applies(q, cache)
    assert not gluon_hopper_applies(q, cache.to(torch.bfloat16))
    misaligned = torch.zeros(4, 16, 600, dtype=torch.float8_e4m3fn, device="cuda")[:, :, 8:584]
    assert not gluon_hopper_applies(q, misaligned)
    got_out, got_lse = sparse_mla_triton(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_rejects_misaligned_rows():
    rows = torch.zeros(4, 16, 600, dtype=torch.float8_e4m3fn, device="cuda")[:, :, 8:584]
    q = torch.zeros(1, 96, 576, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(1, 4, dtype=torch.int32, device="cuda")
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    with pytest.raises(ValueError, match="16-byte boundaries"):
        sparse_mla_triton(q, rows, 1.0, slots, SOFTMAX_SCALE, kernel="gluon_hopper")


def test_sparse_mla_hopper_rejects_unknown_schedule():
    from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper

    q = torch.zeros(1, 96, 576, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, 576, dtype=torch.float8_e4m3fn)
    slots = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="schedule must be one of"):
        sparse_mla_hopper(q, cache, 1.0, slots, SOFTMAX_SCALE, warp_specialized=True,
                          schedule="x")


def test_sparse_mla_triton_rejects_unknown_kernel_and_foreign_knobs():
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    args = (torch.zeros(1, 4, 576), torch.zeros(2, 16, 576), 1.0,
            torch.zeros(1, 4, dtype=torch.int32), SOFTMAX_SCALE)
    with pytest.raises(ValueError, match="kernel must be 'triton', 'gluon_hopper' or "
                                         "'gluon_hopper_ws', got 'x'"):
        sparse_mla_triton(*args, kernel="x")
    with pytest.raises(ValueError, match=r"takes num_splits only, got \['block_h'\]"):
        sparse_mla_triton(*args, kernel="gluon_hopper", block_h=64)
    with pytest.raises(ValueError, match="needs an NVIDIA Hopper GPU, got a cpu tensor"):
        sparse_mla_triton(*args, kernel="gluon_hopper")


COMPILE_SCRIPT = """
import json, os, subprocess, sys, tempfile
import triton
try:
    import triton.backends.nvidia.compiler
except ImportError as error:
    print(json.dumps({"skip": f"triton has no NVIDIA backend here: {error}"}))
    sys.exit(0)
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper_kernel
from gluon_kernels.sparse_mla_hopper_ws import SCHEDULES, sparse_mla_hopper_ws_kernel

# The launch's argument types; pointers and strides 16-byte divisible, as the JIT marks them
# (the 16-byte loads need it).
pointers = ["q_ptr", "cache_ptr", "slots_ptr", "out_ptr", "lse_ptr"]
types = ["*bf16", "*fp8e4nv", "*i32", "*fp32", "*fp32"]
sizes = ["num_heads", "num_selected", "keys_per_split", "block_size", "num_head_blocks"]
strides = ["stride_q_row", "stride_q_head", "stride_cache_b", "stride_cache_t",
           "stride_slots_row", "stride_out_row", "stride_out_head", "stride_out_split"]
signature = {**dict(zip(pointers, types)), **{name: "i32" for name in sizes},
             "score_scale_log2": "fp32", "value_scale": "fp32",
             **{name: "i32" for name in strides}, "stride_lse_row": "i32",
             "stride_lse_head": "i32", "FLAT_SLOTS": "constexpr"}
names = list(signature)
attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in pointers + strides}
report = {}
# The warp-specialized kernel's dense mode (dense_mla_hopper.py): rows, positions, heads.
ws_signature = {**{name: kind for name, kind in signature.items() if name != "FLAT_SLOTS"},
                "row_request_ptr": "*i32", "row_position_ptr": "*i64", "heads_per_row": "i32",
                "rows_per_group": "i32", "FLAT_SLOTS": "constexpr"}
variants = [("one_role", sparse_mla_hopper_kernel, 8, flat, False) for flat in (True, False)]
# The warp-specialized kernel: its default order on both slot paths, the others on one; its
# dense mode on both.
variants += [(f"ws_{schedule}", sparse_mla_hopper_ws_kernel, 4, flat, False)
             for schedule in SCHEDULES for flat in (True, False)
             if flat or schedule == "late_values"]
variants += [("ws_late_values_dense", sparse_mla_hopper_ws_kernel, 4, flat, True)
             for flat in (True, False)]
for name, fn, num_warps, flat, dense in variants:
    constexprs = {"FLAT_SLOTS": flat}
    if name.startswith("ws"):
        constexprs["SCHEDULE"] = SCHEDULES["late_values" if dense else name[3:]]
        constexprs["DENSE"] = dense
    kind = ws_signature if name.startswith("ws") else signature
    source = GluonASTSource(fn=fn, signature={**kind, **{k: "constexpr" for k in constexprs}},
                            attrs=attrs, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps})
    ptx = kernel.asm["ptx"]
    stack = None
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(tool):
        path = os.path.join(tempfile.mkdtemp(), "kernel.cubin")
        open(path, "wb").write(kernel.asm["cubin"])
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
        stack = int(usage.split("STACK:")[1].split()[0]) if "STACK:" in usage else None
    report[f"{name} flat={flat}"] = {
        "wgmma": ptx.count("wgmma.mma_async"), "ld_global_v4": ptx.count("ld.global.v4"),
        "setmaxnreg": ptx.count("setmaxnreg"), "shared": kernel.metadata.shared,
        "stack": stack, "triton": triton.__version__}
print(json.dumps(report))
"""


def test_sparse_mla_gluon_hopper_compiles_for_sm90_offline():
    """Both kernels' slot paths compile for sm_90 with no GPU: wgmma, 16-byte loads, shared
    memory within a CTA's limit, little stack (figures in the kernels' docstrings).
    Run without TRITON_INTERPRET (a subprocess)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True,
                            text=True, env=env, cwd=REPO, timeout=600)
    assert result.returncode == 0, f"sm_90 compile failed:\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    for variant, compiled in report.items():
        assert compiled["wgmma"] >= 40, f"{variant}: {compiled}"
        assert compiled["ld_global_v4"] > 0, f"{variant}: no 16-byte loads: {compiled}"
        assert compiled["shared"] <= MAX_SHARED_BYTES, f"{variant}: {compiled}"
        if variant.startswith("ws"):
            # The roles' register budgets (setmaxnreg). Stack: 24 B under 3.6 (the H200's: the
            # producer's loop scalars, the scorer's epilogue pointers); 3.9 spills the scorer
            # (224-232 B), not on the H200. The dense mode: 64-72 B under 3.6, 312 under 3.9.
            assert compiled["setmaxnreg"] > 0, f"{variant}: {compiled}"
            bound = 32 if compiled["triton"].startswith("3.6") else 256
            if "dense" in variant:
                bound = 80 if compiled["triton"].startswith("3.6") else 320
        else:
            bound = 32  # None under 3.6 (the H200's), 32 B under 3.9: more would be new spills
        assert compiled["stack"] is None or compiled["stack"] <= bound, f"{variant}: {compiled}"


def test_key_splits_and_split_outputs():
    """The Gluon MLA launchers' shared split plan: whole 64-key tiles a split, no empty split,
    and the outputs themselves as the kernel's target when there is one split."""
    from gluon_kernels.sparse_mla_hopper import key_splits, split_outputs

    assert key_splits(32, 16384, 4, torch.device("cpu")) == (4, 4096)
    assert key_splits(10, 130, 2, torch.device("cpu")) == (2, 128)  # 3 tiles: 2 + 1
    assert key_splits(10, 1, 8, torch.device("cpu")) == (1, 64)
    assert key_splits(10, 2048, 40, torch.device("cpu")) == (32, 64)  # at most one per tile
    out, lse = torch.zeros(3, 5, 512), torch.zeros(3, 5)
    partial_out, partial_lse = split_outputs(out, lse, 1)
    assert partial_out.data_ptr() == out.data_ptr() and partial_out.shape == (3, 5, 1, 512)
    assert partial_lse.data_ptr() == lse.data_ptr() and partial_lse.shape == (3, 5, 1)
    partial_out, partial_lse = split_outputs(out, lse, 3)
    assert partial_out.shape == (3, 5, 3, 512) and partial_lse.shape == (3, 5, 3)
