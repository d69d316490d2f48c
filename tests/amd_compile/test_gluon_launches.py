"""Every Gluon kernel of gluon_kernels/hopper and gluon_kernels/amd launched with the engine's
own tensors under a compile-only driver, no GPU: gfx950 and gfx942 (the AMD kernels) and sm90
(the Hopper kernels and the AMD kernels' NVIDIA instantiation).

gluon_launch_examples.py holds the launches (a ForwardBatch's rows, a PackedLayout pool's
strided pages, topk_slots' arguments) at three batch sizes, so that Triton's specialization
of arguments equal to 1 and divisible by 16 is compiled as a real launch would (issue 16: a
graph capture of one request crashed on a `.to()` of such a constant). Checks: no launcher
fails; each kernel compiles with the matrix instruction it was written for (scaled MFMA with
FP4 operands on gfx950's MXFP4 path, CDNA3 FP8 MFMA on gfx942, wgmma on Hopper, mma.sync for
the NVIDIA instantiation); no scratch, no spills and registers within the design budget on
AMD; on Hopper register hand-back (setmaxnreg), TMA or 16-byte loads, shared memory within a
CTA's, stack within the measured bound.
"""

import sys
from pathlib import Path

import pytest

from amd_compile.capture import capture_reports
from amd_compile.isa import check_no_scratch, check_registers

ARCHS = ("gfx950", "gfx942", "sm90")
SCRIPT = Path(__file__).with_name("capture_gluon_launches.py")
MAX_SHARED_BYTES = 232448  # 227 KiB: the most one CTA may hold on sm_90
# Most VGPRs per lane each AMD kernel's design allows (two waves per SIMD and more).
AMD_VGPR_BUDGET = {"indexer_score_kernel": 128, "radix_histogram_kernel": 64,
                   "radix_select_kernel": 64, "radix_gather_kernel": 64}
AMD_MFMA = {"gfx950": "v_mfma_scale_f32_16x16x128_f8f6f4", "gfx942": "v_mfma_f32_16x16x32_fp8_fp8"}
# Stack bytes of the Hopper kernels under triton 3.9 (its ptxas spills the MLA scorer; the
# H200's triton 3.6 keeps 24 B there): a bound that catches new spills.
HOPPER_STACK = {"indexer_score_hopper_kernel": 0, "sparse_mla_hopper_kernel": 320,
                "query_prep_kernel": 0}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    return capture_reports(ARCHS, tmp_path_factory.mktemp("gluon_launches"), script=SCRIPT)


def _examples() -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gluon_launch_examples import EXAMPLES

    return list(EXAMPLES)


def compiled(report: dict, example: str) -> list[dict]:
    assert example not in report["errors"], f"{example} on {report['arch']}: " \
                                            f"{report['errors'][example]}"
    return [c for c in report["compiled"] if c["example"] == example]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("example", _examples())
def test_gluon_launch_compiles(reports, arch, example):
    kernels = compiled(reports[arch], example)
    is_hopper_kernel = example.startswith("hopper")
    if is_hopper_kernel and arch != "sm90" or "mxfp4" in example and arch == "gfx942":
        assert not kernels, f"{example} compiled on {arch}, where it does not apply"
        return
    if not kernels:  # every kernel of the example was compiled by an earlier one (cache)
        pytest.skip(f"{example} on {arch}: the same binaries as an earlier example")
    for kernel in kernels:
        name = f"{kernel['kernel']} ({example}) on {arch}"
        if arch == "sm90":
            check_nvidia(name, kernel, is_hopper_kernel)
        else:
            check_amd(name, kernel, arch, "mxfp4" in example)


def check_amd(name: str, kernel: dict, arch: str, is_mxfp4: bool) -> None:
    if kernel["kernel"] == "indexer_score_kernel":
        assert AMD_MFMA[arch] in kernel["mfma"], f"{name}: no {AMD_MFMA[arch]}: {kernel['mfma']}"
        if is_mxfp4:
            assert kernel["scaled_mfma_fp4"], f"{name}: the scaled MFMA must take FP4 operands"
    check_no_scratch(name, kernel)
    check_registers(name, kernel, AMD_VGPR_BUDGET.get(kernel["kernel"], 256))


def check_nvidia(name: str, kernel: dict, is_hopper_kernel: bool) -> None:
    assert kernel["shared_bytes"] <= MAX_SHARED_BYTES, f"{name}: {kernel['shared_bytes']} B"
    if kernel["kernel"] == "indexer_score_kernel":  # the AMD kernel's NVIDIA instantiation
        assert "mma.sync" in kernel["mma"] and kernel["stack_bytes"] == 0, (name, kernel)
        return
    if not is_hopper_kernel:
        return
    bound = HOPPER_STACK.get(kernel["kernel"])
    assert bound is not None, f"{name}: a kernel with no stack bound here; add one"
    assert kernel["stack_bytes"] <= bound, f"{name}: {kernel['stack_bytes']} B of stack"
    if kernel["kernel"] == "indexer_score_hopper_kernel":
        assert kernel["wgmma"] and kernel["setmaxnreg"] and kernel["tma_loads"] >= 2, kernel
    if kernel["kernel"] == "sparse_mla_hopper_kernel":
        assert kernel["wgmma"] >= 40 and kernel["setmaxnreg"], (name, kernel)
        assert kernel["ld_global_v4"], f"{name}: no 16-byte loads"


@pytest.mark.parametrize("arch", ARCHS)
def test_size_one_examples_pass_their_sizes_as_constants(reports, arch):
    """The "[1]" examples really exercise the specialization: their kernels received size
    arguments as the constant 1 (the Hopper indexer's num_row_tiles among them, issue 16)."""
    ones: dict[str, set[str]] = {}
    for kernel in reports[arch]["compiled"]:
        if kernel["example"].endswith("[1]"):
            ones.setdefault(kernel["kernel"], set()).update(kernel["ones"])
    assert {"num_heads", "stride_scores_row"} <= ones["indexer_score_kernel"], ones
    assert "stride_scores_row" in ones["radix_histogram_kernel"], ones
    if arch == "sm90":
        assert {"num_rows", "num_positions", "tiles_per_row_tile", "num_row_tiles"} <= \
            ones["indexer_score_hopper_kernel"], ones
        assert {"num_heads", "num_selected", "num_head_blocks"} <= \
            ones["sparse_mla_hopper_kernel"], ones


def test_gfx942_refuses_mxfp4_keys_with_the_reason():
    from gluon_kernels.amd.indexer_score import check_key_format
    from gluon_kernels.targets import target_for_arch

    with pytest.raises(ValueError, match="MXFP4 index keys need FP4 support, which gfx942"):
        check_key_format(target_for_arch("gfx942"), "mxfp4", "e4m3fn")
    with pytest.raises(ValueError, match="gfx942 executes e4m3fnuz FP8, got a e4m3fn key"):
        check_key_format(target_for_arch("gfx942"), "fp8", "e4m3fn")
    check_key_format(target_for_arch("gfx950"), "mxfp4", "e4m3fn")
