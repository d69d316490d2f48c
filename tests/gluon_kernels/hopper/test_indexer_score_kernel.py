"""The Hopper Gluon indexer (gluon_kernels/hopper/indexer_score*.py) with no GPU: the launcher's
refusals name their reason, the shared-memory formula fits every ring, and an offline sm_90
compile through the launcher (a subprocess without TRITON_INTERPRET, under the compile-only
driver of tests/amd_compile) shows the design: FP16 wgmma of codes converted in registers,
TMA loads, register hand-back, shared memory within a CTA's, no ptxas warning (C7512 / C7515:
wgmma serialized), no local-memory op in any tile loop. The GPU cases are in
test_indexer_score.py, the query preparation's in test_indexer_score_query_prep.py; every
batch size's compile (1, 16, 17 rows) in tests/amd_compile/test_gluon_launches.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
NUM_HEADS = 32  # K3.1's H_I


def launch_args(index_values: torch.Tensor, index_scales: torch.Tensor, block_size: int = 64,
                num_heads: int = NUM_HEADS) -> tuple:
    return (torch.zeros(1, num_heads, 128), torch.zeros(1, num_heads), index_values,
            index_scales, "fp8", "e4m3fn", torch.zeros(1, 2, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), block_size)


def test_launcher_refuses_what_the_kernel_cannot_read():
    from gluon_kernels.hopper.indexer_score import indexer_score_hopper

    values, scales = torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fn), torch.zeros(2, 64)
    with pytest.raises(ValueError, match="reads e4m3fn FP8 keys, got torch.float8_e4m3fnuz"):
        indexer_score_hopper(*launch_args(values.view(torch.float8_e4m3fnuz), scales))
    with pytest.raises(ValueError, match="takes up to 128 heads, got H_I=200"):
        indexer_score_hopper(*launch_args(values, scales, num_heads=200))
    with pytest.raises(ValueError, match="block_size a multiple of 64 .* got 32"):
        indexer_score_hopper(*launch_args(values[:, :32], scales[:, :32], block_size=32))
    strided = torch.zeros(2, 64, 136, dtype=torch.float8_e4m3fn)[:, :, 4:132]
    with pytest.raises(ValueError, match="TMA needs 16-byte aligned bases and strides"):
        indexer_score_hopper(*launch_args(strided, scales))


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_every_launch_shape_fits_shared_memory(rows):
    from gluon_kernels.hopper import indexer_score_kernel as kernel

    rows = min(rows, kernel.MAX_COLUMNS // NUM_HEADS)
    stages = kernel.stages_that_fit(rows, NUM_HEADS)
    # the consumers hold a stage each while their products run: 8 keep the ring streaming
    assert stages >= 8, f"rows {rows}: only {stages} stages fit"
    assert kernel.shared_bytes(rows, NUM_HEADS, stages) <= kernel.MAX_SHARED_BYTES


COMPILE_SCRIPT = r"""
import contextlib, io, json, os, re, subprocess, sys, tempfile
import torch
import triton
import triton.backends.nvidia as nvidia

KEY = re.compile(r"HGMMA|UTMALDG|F2FP\.F16\.E4M3")


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


sys.path.insert(0, os.path.join(os.getcwd(), "tests", "amd_compile"))
from capture_triton_isa import CompileOnlyDriver
from triton.runtime.driver import driver
import triton.compiler.compiler as compiler_module

driver.set_active(CompileOnlyDriver("sm90"))
kernels = []
original_compile = compiler_module.compile


def recording_compile(src, target=None, options=None, **kwargs):
    kernel = original_compile(src, target=target, options=options, **kwargs)
    if getattr(src, "name", "") == "indexer_score_hopper_kernel":
        kernels.append(kernel)
    return kernel


compiler_module.compile = recording_compile
triton.compiler.compile = recording_compile
from gluon_kernels.hopper.indexer_score import indexer_score_hopper

report = {}
# the engine's decode shapes: R rows of each of 16 requests (rows per program = R), 32 heads
for rows in (1, 4, 8):
    num_rows = 16 * rows
    values = torch.zeros(40, 128, 128, dtype=torch.float8_e4m3fn)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # TRITON_DUMP_PTXAS_LOG: ptxas -v's output
        indexer_score_hopper(
            torch.zeros(num_rows, 32, 128, dtype=torch.bfloat16), torch.zeros(num_rows, 32),
            values, torch.zeros(40, 128), "fp8", "e4m3fn",
            torch.arange(32, dtype=torch.int32).view(16, 2),
            torch.arange(16, dtype=torch.int32).repeat_interleave(rows),
            torch.full((num_rows,), 200), 128, num_positions=201)
    compiled = kernels[-1]
    tools = os.path.join(os.path.dirname(nvidia.__file__), "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    report[f"rows{rows}"] = {
        "hgmma": len(re.findall(r"\bHGMMA\.64x\d+x16\.F32\b", sass)),
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
    """The launcher's compiles at 1, 4 and 8 rows a request build for sm_90 with no GPU:
    FP16 wgmma of codes converted in registers (F2FP), TMA loads, setmaxnreg, shared memory
    within a CTA's; ptxas warns of nothing (it says when it serializes wgmma); the tile loops
    (each consumer's, the producer's) have no local-memory op at 1 and 4 rows (a decode and a
    verification step), and no stack. At 8 rows (two products a tile) triton 3.9 spills 8 B,
    reloaded in the consumers' loops (at most 2 local ops a tile there)."""
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
    assert sorted(report) == ["rows1", "rows4", "rows8"], sorted(report)
    for name, compiled in report.items():
        assert compiled["tma_load"] >= 2 and compiled["setmaxreg"] > 0, (name, compiled)
        assert compiled["shared"] <= 227 * 1024, (name, compiled)
        assert compiled["ptxas_log"] and not compiled["ptxas_warnings"], (name, compiled)
        loops = compiled["tile_loops"]
        assert all(loop["local"] <= (2 if name == "rows8" else 0) for loop in loops), (name, loops)
        # two consumers' loops of products, the producer's of TMA loads
        assert sum(loop["wgmma"] > 0 for loop in loops) == 2, (name, loops)
        assert sum(loop["tma"] > 0 for loop in loops) == 1, (name, loops)
        assert compiled["hgmma"] >= 16 and compiled["f2fp"] >= 64, (name, compiled)
        assert compiled["stack"] <= (16 if name == "rows8" else 0), (name, compiled)
