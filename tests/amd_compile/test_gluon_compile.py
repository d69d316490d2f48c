"""The Gluon kernels with offline compile examples (gluon_kernels' `compile_examples`; today the
Hopper PTPC-FP8 GEMM, gluon_kernels/hopper/ptpc_fp8.py) compiled for sm_90, no GPU. The attention
kernels (gluon_kernels/hopper, gluon_kernels/amd: every AMD Gluon kernel) are compiled through
their launchers instead, with the engine's tensors, for gfx950, gfx942 and sm_90:
test_gluon_launches.py.

Each example is compiled once per size case of the size arguments it names (all equal to 1,
all multiples of 16, neither: gluon_kernels/compile.py), as Triton specializes a launch's ints.
ISA checks: async wgmma with the producer's registers given back (setmaxnreg).

The compiles run in subprocesses (capture_gluon_isa.py, one per target, all at once) without
TRITON_INTERPRET, which the test session sets and under which the kernels' helpers cannot be
compiled; only the example list is read in this process.
"""

from pathlib import Path

import pytest

from gluon_kernels.compile import size_cases
from gluon_kernels.hopper import ptpc_fp8
from gluon_kernels.targets import target_for_arch
from amd_compile.capture import capture_reports

KERNEL_MODULES = [ptpc_fp8]  # Hopper only
SCRIPT = Path(__file__).with_name("capture_gluon_isa.py")


@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> dict[str, dict[str, dict[str, str]]]:
    """{"sm90": {example name: {"asm": text} or {"error": text}}}."""
    return capture_reports(("sm90",), tmp_path_factory.mktemp("gluon_isa"), script=SCRIPT)


def _asm(assembly: dict, arch: str, name: str) -> str:
    compiled = assembly[arch][name]
    assert "error" not in compiled, f"{name} on {arch} failed to compile: {compiled.get('error')}"
    return compiled["asm"]


def compile_examples(target) -> list:
    """Every module's examples for ``target``, once per size case."""
    return [case for module in KERNEL_MODULES for example in module.compile_examples(target)
            for case in size_cases(example)]


@pytest.mark.parametrize("example", compile_examples(target_for_arch("sm90")),
                         ids=lambda e: f"sm90-{e.name}")
def test_gluon_kernel_nvidia_instantiation_compiles(assembly, example):
    ptx = _asm(assembly, "sm90", example.name)
    # async wgmma, producer registers given back
    assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx


def test_unknown_arch_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="expected gfx950, gfx942 or sm80"):
        target_for_arch("gfx1100")
