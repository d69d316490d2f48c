"""The Gluon kernels with offline compile examples (gluon_kernels' `compile_examples`) compiled for
gfx950 and gfx942 (and their NVIDIA instantiation), no GPU. The attention kernels
(gluon_kernels/hopper, gluon_kernels/amd) are compiled through their launchers instead, with
the engine's tensors: test_gluon_launches.py.

Each example is compiled once per size case of the size arguments it names (all equal to 1,
all multiples of 16, neither: gluon_kernels/compile.py), as Triton specializes a launch's ints.
ISA checks: the matrix instruction the kernel was written for (scaled MFMA on gfx950, with
the FP4 operand format ``cbsz:4 blgp:4`` on the MXFP4 path; CDNA3 FP8 MFMA on gfx942;
mma.sync on NVIDIA), no scratch, no spills, registers within the kernel's design budget.

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
from amd_compile.isa import check_no_scratch, check_registers, instructions, register_report

KERNEL_MODULES = [ptpc_fp8]  # Hopper only
AMD_ARCHS = ["gfx950", "gfx942"]
SCRIPT = Path(__file__).with_name("capture_gluon_isa.py")


@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> dict[str, dict[str, dict[str, str]]]:
    """{arch: {example name: {"asm": text} or {"error": text}}} for gfx950, gfx942, sm90."""
    return capture_reports((*AMD_ARCHS, "sm90"), tmp_path_factory.mktemp("gluon_isa"),
                           script=SCRIPT)


def _asm(assembly: dict, arch: str, name: str) -> str:
    compiled = assembly[arch][name]
    assert "error" not in compiled, f"{name} on {arch} failed to compile: {compiled.get('error')}"
    return compiled["asm"]


def compile_examples(target) -> list:
    """Every module's examples for ``target``, once per size case."""
    return [case for module in KERNEL_MODULES for example in module.compile_examples(target)
            for case in size_cases(example)]


def examples(arch):
    target = target_for_arch(arch)
    return [pytest.param(target, example, id=f"{arch}-{example.name}")
            for example in compile_examples(target)]


@pytest.mark.parametrize("target,example", [p for arch in AMD_ARCHS for p in examples(arch)])
def test_gluon_kernel_compiles_for_amd_with_its_matrix_instruction(assembly, target, example):
    amdgcn = _asm(assembly, target.arch, example.name)
    for expected in example.expected_instructions:
        assert expected in instructions(amdgcn, "v_mfma"), (
            f"{example.name} on {target.arch}: no {expected} in the ISA; found "
            f"{sorted(instructions(amdgcn, 'v_mfma'))}")
    if "mxfp4" in example.name and target.matmul == "mfma_scaled":
        scaled = [line for line in amdgcn.splitlines() if "v_mfma_scale" in line]
        assert scaled and all("cbsz:4 blgp:4" in line for line in scaled), (
            f"{example.name}: the scaled MFMA must take both operands as FP4 (cbsz:4 blgp:4)")
    report = register_report(amdgcn)
    check_no_scratch(f"{example.name} on {target.arch}", report)
    if example.max_vgprs is not None:
        check_registers(f"{example.name} on {target.arch}", report, example.max_vgprs)


@pytest.mark.parametrize("example", compile_examples(target_for_arch("sm90")),
                         ids=lambda e: f"sm90-{e.name}")
def test_gluon_kernel_nvidia_instantiation_compiles(assembly, example):
    ptx = _asm(assembly, "sm90", example.name)
    if example.name.startswith("indexer_score["):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    if example.name.startswith(("ptpc_gemm_hopper", "indexer_score_hopper")):
        # async wgmma, producer registers given back
        assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx


def test_unknown_arch_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="expected gfx950, gfx942 or sm80"):
        target_for_arch("gfx1100")
