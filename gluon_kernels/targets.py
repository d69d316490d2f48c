"""Targets of the Gluon kernels: which matrix instruction and which register layouts each GPU gets.

A Gluon kernel here is written once; its layouts and its matrix instruction are constexpr
arguments chosen from a ``GluonTarget``:

| arch   | GPU           | matmul        | warp | FP8 keys               | MXFP4 keys           |
|--------|---------------|---------------|------|------------------------|----------------------|
| gfx950 | MI355X/MI350X | mfma_scaled   | 64   | e4m3, unit E8M0 scales | e2m1, E8M0 scales    |
| gfx942 | MI300X        | mfma (CDNA3)  | 64   | e4m3fnuz               | none (§4.6.1)        |
| sm80+  | NVIDIA        | mma_v2        | 32   | e4m3 -> bf16           | e2m1 * 2^e -> bf16   |

The NVIDIA instantiation exists to test the algorithm on the GPUs we have (DESIGN.md §6): it
dequantizes in registers, exactly (every E4M3 value and every E2M1 value times a power of two
in the float32 range is a bfloat16), so it computes what the scaled MFMA computes.
"""

from dataclasses import dataclass

import torch
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl

MATMULS = ("mfma_scaled", "mfma", "mma_v2")
# First NVIDIA compute capability with mma.sync on bf16 (Ampere).
MIN_NVIDIA_CAPABILITY = 80


@dataclass(frozen=True)
class GluonTarget:
    """One GPU architecture as the Gluon kernels see it."""

    arch: str  # "gfx950", "gfx942" or "sm<major><minor>" (e.g. "sm90")
    matmul: str  # one of MATMULS
    warp_size: int

    @property
    def is_amd(self) -> bool:
        return self.arch.startswith("gfx")

    @property
    def has_fp4(self) -> bool:
        """Whether MXFP4 index keys are available (§4.6.1: not on gfx942)."""
        return self.arch != "gfx942"

    @property
    def fp8_variant(self) -> str:
        """The FP8 E4M3 variant the target executes (§6.1)."""
        return "e4m3fnuz" if self.arch == "gfx942" else "e4m3fn"

    def compile_target(self) -> GPUTarget:
        """The triton GPUTarget to compile for (no device needed)."""
        if self.is_amd:
            return GPUTarget("hip", self.arch, self.warp_size)
        return GPUTarget("cuda", int(self.arch[2:]), self.warp_size)


def target_for_arch(arch: str) -> GluonTarget:
    """The GluonTarget of an architecture name: "gfx950", "gfx942" or "sm80".."sm120"."""
    if arch == "gfx950":
        return GluonTarget(arch, "mfma_scaled", 64)
    if arch == "gfx942":
        return GluonTarget(arch, "mfma", 64)
    if arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= MIN_NVIDIA_CAPABILITY:
        return GluonTarget(arch, "mma_v2", 32)
    raise ValueError(
        f"no Gluon target for architecture {arch!r}; expected gfx950, gfx942 or sm80 and newer"
    )


def why_no_target(device: torch.device) -> str | None:
    """None when the Gluon kernels can run on ``device``, else the reason they cannot."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a ROCm (gfx950/gfx942) or NVIDIA (sm80+) GPU"
    try:
        target_for_arch(arch_of_device(device))
    except ValueError as error:
        return str(error)
    return None


def arch_of_device(device: torch.device) -> str:
    """Architecture name of a GPU visible to torch ("gfx950", "gfx942", "sm90", ...)."""
    properties = torch.cuda.get_device_properties(device)
    if torch.version.hip is not None:
        # gcnArchName looks like "gfx950:sramecc+:xnack-".
        return properties.gcnArchName.split(":")[0]
    return f"sm{properties.major}{properties.minor}"


def active_target() -> GluonTarget:
    """The GluonTarget of the GPU Triton compiles for now (its active driver's current target):
    the device a launch runs on, or, under tests/amd_compile's compile-only driver, the
    architecture being compiled for. ValueError if the Gluon kernels have no target there."""
    from triton.runtime import driver

    target = driver.active.get_current_target()
    if target.backend == "hip":
        return target_for_arch(str(target.arch).split(":")[0])
    return target_for_arch(f"sm{target.arch}")


def target_of_device(device: torch.device) -> GluonTarget:
    """The GluonTarget of a visible GPU; ValueError if the Gluon kernels cannot run on it."""
    reason = why_no_target(device)
    if reason is not None:
        raise ValueError(f"Gluon kernels cannot run on {device}: {reason}")
    return target_for_arch(arch_of_device(torch.device(device)))


def accumulator_layout(target: GluonTarget, num_warps: int) -> object:
    """Layout of a [rows, keys] fp32 accumulator; warps split the keys (the N dim)."""
    if target.matmul == "mfma_scaled":
        # v_mfma_scale_f32_16x16x128_f8f6f4: one instruction covers K = 128, one index key.
        return gl.amd.AMDMFMALayout(version=4, instr_shape=[16, 16, 128], transposed=True,
                                    warps_per_cta=[1, num_warps])
    if target.matmul == "mfma":
        # v_mfma_f32_16x16x32_fp8_fp8 (CDNA3, fnuz operands).
        return gl.amd.AMDMFMALayout(version=3, instr_shape=[16, 16, 32], transposed=True,
                                    warps_per_cta=[1, num_warps])
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps],
                                     instr_shape=[16, 8])


def operand_k_width(target: GluonTarget) -> int:
    """Elements of K each lane holds contiguously in a dot operand of ``target``'s matmul."""
    return {"mfma_scaled": 16, "mfma": 8, "mma_v2": 2}[target.matmul]


def row_major_layout(target: GluonTarget, num_warps: int) -> object:
    """Blocked layout of a [rows, K] tile whose K dim is contiguous in memory (loads)."""
    lanes_k = 8
    return gl.BlockedLayout([1, 16], [target.warp_size // lanes_k, lanes_k], [num_warps, 1],
                            [1, 0])


def column_major_layout(target: GluonTarget, num_warps: int) -> object:
    """Blocked layout of a [K, cols] tile whose K dim is contiguous in memory (key loads)."""
    lanes_k = 8
    return gl.BlockedLayout([16, 1], [lanes_k, target.warp_size // lanes_k], [1, num_warps],
                            [0, 1])


def vector_layout(target: GluonTarget, num_warps: int) -> object:
    """1-D blocked layout for streaming passes (top-k histograms)."""
    return gl.BlockedLayout([4], [target.warp_size], [num_warps], [0])
