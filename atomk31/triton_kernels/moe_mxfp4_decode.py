"""MXFP4 (E2M1 values, E8M0 scale per 32 inputs, MODEL_SPEC §3.3) decoding inside Triton kernels,
shared by the MoE GEMVs and grouped GEMMs.

E2M1 without tables or selects: a nibble's 3 magnitude bits shifted into an FP16's exponent and
mantissa (``(c & 7) << 9``, sign to bit 15) give the E2M1 value times 2^-14 exactly, subnormals
included (the two formats' subnormals line up: 0.5 = E2M1 subnormal -> FP16 subnormal 2^-15),
and FP16 -> FP32 conversion is exact. The 2^14 is folded into the E8M0 factor.
"""

import triton
import triton.language as tl

FP16_DECODE_SCALE = tl.constexpr(16384.0)


@triton.jit
def e2m1_times_2_pow_minus_14(codes):
    """int32 E2M1 codes (0..15) -> fp32 value * 2^-14, exact."""
    bits = ((codes & 7) << 9) | ((codes & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e8m0_factor(b_scales):
    """E8M0 bytes -> 2^(s - 127) * 2^14 in fp32, to multiply e2m1_times_2_pow_minus_14's
    values (byte 0 flushes to 0: 2^-127 is no normal fp32)."""
    return (b_scales.to(tl.int32) << 23).to(tl.float32, bitcast=True) * FP16_DECODE_SCALE
