"""Every Triton kernel of atomk31/triton_kernels compiled for Hopper (sm_90), no GPU.

The portable path's compile check, beside the AMD one (test_triton_compile.py, same launch
examples and size cases, same compile-only driver reporting ``GPUTarget("cuda", 90, 32)``): the launchers take
their CUDA configurations (tiles, inline PTX, FP16 operand types), the kernels go through
ptxas, and cuobjdump reads the cubin. Checks: every `*_kernel` is reached; no launcher fails
(shared memory within Hopper's 227 KiB per block included); kernels that call tl.dot use tensor
cores (wgmma or mma.sync in the PTX); no stack bytes (register spills) unless KNOWN_SPILLS says
why. CI compiles with its own triton; the H200 runs triton 3.6, whose register allocation
differs (a kernel clean here may spill there, and the reverse), so this catches compile
failures and gross register pressure, not the last few spilled bytes.
"""

import sys
from pathlib import Path

import pytest

from amd_compile.capture import calls_dot, capture_reports, compiled_by
from amd_compile.sizes import known

ARCH = "sm90"

# example (name: every size case, or "<name>@<case>") -> why its kernel spills at the
# example's shape (measured with triton 3.9); strict: a kernel that stops spilling turns its
# test red (XPASS), and the entry must go.
KNOWN_SPILLS: dict[str, str] = {
    "kda_prefill[float32]": "the exact float32 intra-chunk kernel (IEEE products of fp32 "
                            "64-row tiles): 3168 B of stack at 255 registers, a correctness "
                            "path never tuned for speed",
    "sparse_mla[fp8 cache]": "16 heads, one program per row: the few-head tiles (24 B)",
    "sparse_mla[fp16 products]": "16 heads with FP16 products (80 B)",
    "dense_mla": "16 heads over a BF16 cache: the few-head dense tiles (392 B)",
    # (on Hopper the Gluon kernel now runs these shapes; the Triton tiles are AMD's and the
    # fallback's)
    "sparse_mla[96 heads, 16 rows]": "the Triton kernel's few-row tiles (128 heads padded, "
                                     "value halves, next tile read ahead, FP16 products): "
                                     "136 B under triton 3.9, 32 B under the H200's 3.6",
    "sparse_mla[96 heads, 64 rows]": "the Triton kernel's 64-row tiles (FP16 products): 8 B "
                                     "under triton 3.9, none under the H200's 3.6",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return capture_reports((ARCH,), tmp_path_factory.mktemp("sass"))[ARCH]


def _examples() -> list:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from triton_launch_examples import EXAMPLES

    return [pytest.param(example, marks=[pytest.mark.xfail(reason=known(KNOWN_SPILLS, example),
                                                           strict=True)]
                         if known(KNOWN_SPILLS, example) else [], id=example)
            for example in EXAMPLES]


def test_every_triton_kernel_is_reached_on_hopper(report):
    compiled = {c["kernel"] for c in report["compiled"]}
    missing = [k for k in report["kernels"] if k not in compiled]
    assert not missing, f"sm90: no launch example compiles {missing}"


def test_known_spills_name_existing_examples():
    examples = {param.values[0] for param in _examples()}
    examples |= {example.split("@")[0] for example in examples}
    stale = [example for example in KNOWN_SPILLS if example not in examples]
    assert not stale, f"KNOWN_SPILLS entries for no example: {stale}"


@pytest.mark.parametrize("example", _examples())
def test_triton_launcher_compiles_for_hopper(report, example):
    for kernel in compiled_by(report, ARCH, example):
        name = f"{kernel['kernel']} ({example}) on sm90"
        if calls_dot(kernel["kernel"]):
            assert kernel["mma"], f"{name}: multiplies matrices (tl.dot) but has no wgmma/mma"
        assert kernel["stack_bytes"] == 0 and kernel["local_bytes"] == 0, (
            f"{name}: {kernel['stack_bytes']} B of stack, {kernel['local_bytes']} B local "
            f"at {kernel['registers']} registers (spills)")
