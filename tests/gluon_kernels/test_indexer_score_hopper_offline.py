"""The Hopper Gluon indexer (gluon_kernels/indexer_score_hopper*.py) with no GPU: the launchers'
refusals name their reason, the shared-memory formula fits every ring, the default kernel off
Hopper is Triton's, and an offline sm_90 compile (a subprocess without TRITON_INTERPRET) shows
the design: wgmma of the product's type, TMA loads, register hand-back, shared memory within a
CTA's, no ptxas warning (C7512 / C7515: wgmma serialized), no local-memory op in any tile loop.
The GPU cases are in test_indexer_score_hopper.py, the query preparation's in
test_indexer_score_hopper_query_prep.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
NUM_HEADS = 32  # K3.1's H_I


def test_why_not_hopper_names_the_reason_off_a_gpu():
    from gluon_kernels.indexer_score_hopper_launch import why_not_hopper

    values = torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn)
    reason = why_not_hopper(torch.zeros(1, 32, 128), values, torch.zeros(2, 64), "fp8", 64)
    assert reason == "needs an NVIDIA Hopper GPU, got a cpu tensor"
    assert "interpreter" in why_not_hopper(torch.zeros(1), values, values, "fp8", 64,
                                           interpreted=True)


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
    for kernel in ("gluon_hopper", "gluon_hopper_ss"):
        with pytest.raises(ValueError, match=r"needs an NVIDIA Hopper GPU, got a cpu tensor"):
            indexer_score_triton(*args, kernel=kernel)
    with pytest.raises(ValueError, match=r"product must be one of"):
        from gluon_kernels.indexer_score_hopper_launch import indexer_score_hopper
        indexer_score_hopper(*args, product="bf16")


# The fewest ring stages a launch may get: the products that read the ring hold up to two
# stages a consumer; fp16_ss's converter gives a stage back as soon as it has read it (its
# FP16 buffers, NUM_BUFFERS of them, take the consumers' holding).
MIN_STAGES = {"fp16": 8, "fp8_acc32": 8, "fp8": 8, "fp16_ss": 6}


@pytest.mark.parametrize("product", ["fp16", "fp8_acc32", "fp8", "fp16_ss"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_every_launch_shape_fits_shared_memory(product, rows):
    from gluon_kernels import indexer_score_hopper as kernel

    rows = min(rows, kernel.MAX_COLUMNS[product] // NUM_HEADS)
    stages = kernel.stages_that_fit(rows, NUM_HEADS, product)
    assert stages >= MIN_STAGES[product], f"{product} rows {rows}: only {stages} stages fit"
    assert kernel.shared_bytes(rows, NUM_HEADS, stages, product) <= kernel.MAX_SHARED_BYTES


COMPILE_SCRIPT = r"""
import contextlib, io, json, os, re, subprocess, sys, tempfile
import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from gluon_kernels import indexer_score_hopper as kernel
from gluon_kernels.indexer_score_hopper_launch import compile_examples
from gluon_kernels.targets import target_for_arch

KEY = re.compile(r"HGMMA|QGMMA|UTMALDG|F2FP\.F16\.E4M3")


def tile_loops(sass):
    # Innermost loops (backward branches before the last EXIT: after it sit the mbarrier
    # waits' retry stubs) holding a product, a TMA load or an FP8 -> FP16 conversion.
    code = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);",
                                                           sass)]
    last_exit = max(a for a, t in code if re.search(r"\bEXIT\b", t))
    where = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, t) in enumerate(code):
        m = re.search(r"\bBRA\s+(?:\S+,\s*)?0x([0-9a-f]+)", t)
        if m and a < last_exit and int(m.group(1), 16) < a and int(m.group(1), 16) in where:
            body = [x for _, x in code[where[int(m.group(1), 16)]:i + 1]]
            if any(KEY.search(x) for x in body):
                loops.append((int(m.group(1), 16), a, body))
    inner = [l for l in loops
             if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    return [{"instructions": len(b), "wgmma": sum("GMMA" in x for x in b),
             "tma": sum("UTMALDG" in x for x in b), "f2fp": sum("F2FP" in x for x in b),
             "local": sum(bool(re.search(r"\b(LDL|STL)\b", x)) for x in b)}
            for _, _, b in inner]


report = {}
for example in compile_examples(target_for_arch("sm90")):
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # TRITON_DUMP_PTXAS_LOG: ptxas -v's output
        compiled = triton.compile(
            GluonASTSource(fn=example.fn, signature=example.signature,
                           constexprs=example.constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": example.num_warps,
                     "maxnreg": kernel.kernel_max_registers(example.constexprs["PRODUCT"])})
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
        "ptxas_log": "ptxas" in log.getvalue(),
        "ptxas_warnings": [line for line in log.getvalue().splitlines()
                           if "warning" in line.lower()],
        "tile_loops": tile_loops(sass),
        "shared": compiled.metadata.shared, "triton": triton.__version__}
print(json.dumps(report))
"""


def test_gluon_hopper_indexer_compiles_for_sm90_offline():
    """Every compile example builds for sm_90 with no GPU: wgmma of the product's type (fp16
    products of codes converted in registers: F2FP; fp16_ss's converted by the converter's
    F2FP into shared memory, SS wgmma; fp8 from shared memory), TMA loads, setmaxnreg, shared
    memory within a CTA's; ptxas warns of nothing (it says when it serializes wgmma); the tile
    loops (each consumer's, the producer's, the converter's) have no local-memory op. Stack:
    none in the exact kernel of 1 and 4 rows with register A (triton 3.6 and 3.9); the others
    keep <= 96 B, used outside the tile loops (the module docstring)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")  # ptxas runs, logs
    try:
        done = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("the offline sm_90 compile took over 600 s")
    if done.returncode != 0 and "cuobjdump" in done.stderr and "No such file" in done.stderr:
        pytest.skip("this triton wheel has no cuobjdump to read the SASS")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("fp16_ss" in name for name in report), sorted(report)
    for name, compiled in report.items():
        assert compiled["tma_load"] >= 2 and compiled["setmaxreg"] > 0, (name, compiled)
        assert compiled["shared"] <= 227 * 1024, (name, compiled)
        assert compiled["ptxas_log"] and not compiled["ptxas_warnings"], (name, compiled)
        loops = compiled["tile_loops"]
        assert not any(loop["local"] for loop in loops), (name, loops)
        # two consumers' loops of products, the producer's of TMA loads (and fp16_ss's
        # converter's of conversions)
        assert sum(loop["wgmma"] > 0 for loop in loops) == 2, (name, loops)
        assert sum(loop["tma"] > 0 for loop in loops) == 1, (name, loops)
        if "fp16_ss" in name:
            assert compiled["hgmma"] >= 32 and compiled["f2fp"] >= 32, (name, compiled)
            assert any(loop["f2fp"] >= 32 and not loop["wgmma"] for loop in loops), loops
            assert not any(loop["f2fp"] and loop["wgmma"] for loop in loops), loops
        elif "fp16" in name:
            assert compiled["hgmma"] >= 16 and compiled["f2fp"] >= 64, (name, compiled)
        else:
            assert compiled["qgmma"] >= 8, (name, compiled)
        if "fp16 rows1" in name or "fp16 rows4" in name:
            assert compiled["stack"] == 0, (name, compiled)
        else:  # the spills are outside the tile loops (checked above)
            assert compiled["stack"] <= 96, (name, compiled)
