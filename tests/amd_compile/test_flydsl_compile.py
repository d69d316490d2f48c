"""Every FlyDSL kernel compiled for gfx950 in compile-only mode (no GPU, no ROCm install).

FlyDSL needs ld.lld and device bitcode under ROCM_PATH; flydsl_toolchain.py builds a stand-in
(Debian's lld-19, triton's ocml/ockl). Each kernel compiles in a subprocess with FlyDSL's
settings in its environment, dumping its final ISA, which is then checked: the MFMA it was
written for, no scratch, no spills, registers within its design budget.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amd_compile.flydsl_toolchain import make_rocm_path
from amd_compile.isa import check_no_scratch, check_registers, instructions, register_report

SCRIPT = Path(__file__).with_name("compile_flydsl_kernel.py")

# (module, compile function, arch, MFMA instructions the ISA must hold, VGPR+AGPR budget)
KERNELS = [
    # the engine's strided cache view (amd_compile/flydsl_launch_examples.py)
    ("amd_compile.flydsl_launch_examples", "sparse_mla_engine_view", "gfx950",
     ("v_mfma_f32_16x16x32_fp8_fp8", "v_mfma_f32_16x16x16_bf16"), 256),
    ("flydsl_kernels.moe_mxfp4", "compile_gate_up_situ", "gfx950",
     ("v_mfma_scale_f32_16x16x128_f8f6f4",), 128),
    ("flydsl_kernels.moe_mxfp4", "compile_down", "gfx950",
     ("v_mfma_scale_f32_16x16x128_f8f6f4",), 128),
]

needs_flydsl = pytest.mark.skipif(
    importlib.util.find_spec("flydsl") is None,
    reason="needs the flydsl package (pip install 'atomk31[test]' brings it on x86-64 Linux)")


@pytest.fixture(scope="module")
def rocm_path(tmp_path_factory) -> Path:
    path = make_rocm_path(tmp_path_factory.mktemp("rocm"))
    if path is None:
        pytest.skip("needs ld.lld (Debian's lld-19); not found and could not be apt-installed")
    return path


@needs_flydsl
@pytest.mark.parametrize("module,function,arch,expected,budget", KERNELS,
                         ids=[f"{k[0].split('.')[-1]}-{k[1]}-{k[2]}" for k in KERNELS])
def test_flydsl_kernel_compiles(rocm_path, tmp_path, module, function, arch, expected, budget):
    env = {**os.environ, "ROCM_PATH": str(rocm_path), "COMPILE_ONLY": "1", "ARCH": arch,
           "FLYDSL_DEBUG_DUMP_ASM": "1", "FLYDSL_DUMP_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, str(SCRIPT), module, function], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"{module} failed to compile for {arch}:\n{result.stderr[-3000:]}")
    dumps = sorted(tmp_path.rglob("*final_isa.s"))
    assert dumps, f"{module}: FlyDSL wrote no ISA dump under {tmp_path}"
    amdgcn = "\n".join(path.read_text() for path in dumps)
    for instruction in expected:
        assert instruction in instructions(amdgcn, "v_mfma"), (
            f"{module}: no {instruction}; found {sorted(instructions(amdgcn, 'v_mfma'))}")
    report = register_report(amdgcn)
    check_no_scratch(f"{module} on {arch}", report)
    check_registers(f"{module} on {arch}", report, budget)
