"""Every Triton kernel of atomk31/triton_kernels compiled for gfx950 and gfx942, no GPU.

capture_triton_isa.py runs each launcher of triton_launch_examples.py under a compile-only
driver (one subprocess per architecture, both at once, with TRITON_INTERPRET removed from
its environment), each example once per size case (sizes.py), and reports the ISA of every
kernel it compiled. Checks: every `*_kernel` is reached by an example; no launcher fails;
kernels that call tl.dot use MFMA, and the examples of SCALED_MFMA_EXAMPLES scaled MFMA
(v_mfma_scale_*) on gfx950; no scratch, no spills; the unified VGPR count (arch VGPRs +
AGPRs) within two waves per SIMD unless REGISTER_BUDGET says otherwise.

KNOWN_FAILURES lists what these checks find today, with the ISA reason, by example name (every
size case) or "<name>@<case>". They are strict xfails: when a kernel is fixed its test fails
as XPASS, and the entry must go.
"""

import sys
from pathlib import Path

import pytest

from amd_compile.capture import calls_dot, capture_reports, compiled_by
from amd_compile.isa import TWO_WAVES_PER_SIMD, unified_vgprs
from amd_compile.sizes import known

ARCHS = ("gfx950", "gfx942")

# Kernels designed for fewer waves per SIMD than two (none yet).
REGISTER_BUDGET: dict[str, int] = {}

# Examples whose products must run on scaled MFMA (MXFP4 with E8M0 scales), per architecture:
# example (name or "<name>@<case>") -> the kernels held to it (None: every kernel it compiles).
# None today: the Triton dot_scaled paths left the package (the MoE grouped GEMMs' MXFP8
# variant lives in benchmarks/kernels/variants/); FlyDSL's MoE is checked in
# test_flydsl_compile.py.
SCALED_MFMA_EXAMPLES: dict[str, dict[str, set[str] | None]] = {}

# (arch or "*", example name or "<name>@<case>") -> what the check found (measured with
# triton 3.x, this repo's kernels). Strict: a fixed kernel turns its test red (XPASS).
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("gfx950", "indexer_score[mxfp4]@ones"):
        "326 unified VGPRs with every size specialized to 1 (one row, one key block): one wave "
        "per SIMD, no scratch; the fp8 keys and the other size cases stay within two waves",
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """Run the capture for every architecture in parallel; {arch: report}."""
    return capture_reports(ARCHS, tmp_path_factory.mktemp("triton_isa"))


def _known_failure(arch: str, example: str) -> str | None:
    base = example.split("@")[0]
    return next((KNOWN_FAILURES[key] for key in ((arch, example), ("*", example), (arch, base),
                                                 ("*", base)) if key in KNOWN_FAILURES), None)


def _cases() -> list:
    """(arch, example) pairs, the known failures marked strict xfail."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from triton_launch_examples import EXAMPLES

    cases = []
    for example in EXAMPLES:
        for arch in ARCHS:
            reason = _known_failure(arch, example)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            cases.append(pytest.param(arch, example, marks=marks, id=f"{example}-{arch}"))
    return cases


@pytest.mark.parametrize("arch", ARCHS)
def test_every_triton_kernel_is_reached_by_an_example(reports, arch):
    report = reports[arch]
    compiled = {c["kernel"] for c in report["compiled"]}
    missing = [k for k in report["kernels"] if k not in compiled]
    assert not missing, (f"{arch}: no launch example compiles {missing}; add them to "
                         "tests/amd_compile/triton_launch_examples.py")


def test_known_failures_name_existing_examples():
    """A stale KNOWN_FAILURES key (a renamed example) would silently stop checking."""
    examples = {case.values[1] for case in _cases()}
    examples |= {example.split("@")[0] for example in examples}
    stale = [key for key in KNOWN_FAILURES if key[1] not in examples or
             key[0] not in (*ARCHS, "*")]
    assert not stale, f"KNOWN_FAILURES entries for no (arch, example): {stale}"


@pytest.mark.parametrize("arch, example", _cases())
def test_triton_launcher_compiles_for_amd(reports, arch, example):
    for kernel in compiled_by(reports[arch], arch, example):
        name = f"{kernel['kernel']} ({example}) on {arch}"
        if calls_dot(kernel["kernel"]):
            assert kernel["mfma"], f"{name}: multiplies matrices (tl.dot) but has no MFMA"
        scaled_kernels = known(SCALED_MFMA_EXAMPLES.get(arch, {}), example) or set()
        if scaled_kernels is None or kernel["kernel"] in scaled_kernels:
            assert any(m.startswith("v_mfma_scale") for m in kernel["mfma"]), (
                f"{name}: an MXFP4 dot_scaled path without scaled MFMA, only {kernel['mfma']}")
        assert kernel["private_segment_fixed_size"] == 0, (
            f"{name}: {kernel['private_segment_fixed_size']} B of scratch per lane "
            f"({kernel['vgpr_spill_count']} VGPRs spilled)")
        assert not kernel["vgpr_spill_count"] and not kernel["sgpr_spill_count"], (
            f"{name}: spills {kernel['vgpr_spill_count']} VGPRs, "
            f"{kernel['sgpr_spill_count']} SGPRs")
        budget = REGISTER_BUDGET.get(kernel["kernel"], TWO_WAVES_PER_SIMD)
        used = unified_vgprs(kernel)
        assert used <= budget, f"{name}: {used} VGPRs (arch + AGPR) per lane, budget {budget}"
