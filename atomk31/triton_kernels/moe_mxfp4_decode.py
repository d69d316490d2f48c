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


# Word decode (GEMV mode "dot_t_words"): a little-endian int32 word holds 8 E2M1 nibbles
# (nibble i = input 8 w + i). Pair i (i = 0..3) is the BF16x2 register of nibbles i (low half)
# and i + 4 (high half): nibble i + 4 sits 16 bits above nibble i, so one mask, one multiply
# (two shifts at once: (x << a) + (x << b) with no overlapping bits) and one mask move both:
# magnitude bits to 6..8, sign to 15, of each half. The halves are BF16 E2M1 * 2^-126 (0.5 is
# the subnormal 2^-127), as in e2m1_times_2_pow_minus_14 with BF16's exponent.
# 0x81C081C0 (magnitude bits 6..8 and sign bit 15 of both halves) as a signed int32 constant.
E2M1_PAIR_BITS = tl.constexpr(0x81C081C0 - (1 << 32))


@triton.jit
def e2m1_word_pairs(b_words):
    """int32 words -> 4 int32 tensors of BF16x2 bits, pair i = (nibble i, nibble i + 4) times
    2^-126, exact. Plain Triton (every backend; the interpreter)."""
    b_shifted = b_words >> 8                  # nibbles 2, 3 (6, 7) down to where 0, 1 (4, 5) were
    b_pair0 = ((b_words & 0x000F000F) * 0x1040) & E2M1_PAIR_BITS   # << 6 and << 12
    b_pair1 = ((b_words & 0x00F000F0) * 0x0104) & E2M1_PAIR_BITS   # << 2 and << 8
    b_pair2 = ((b_shifted & 0x000F000F) * 0x1040) & E2M1_PAIR_BITS
    b_pair3 = ((b_shifted & 0x00F000F0) * 0x0104) & E2M1_PAIR_BITS
    return b_pair0, b_pair1, b_pair2, b_pair3


@triton.jit
def e8m0_bf16x2_factor(b_scales):
    """E8M0 bytes (int32) -> BF16x2 bits of (2^(s-127), 2^(s-127)): the byte is BF16's exponent
    field (byte 0 gives 0, as e8m0_factor; 255 gives inf)."""
    return b_scales * 0x00800080


# PTX (sm_90: mul.rn.bf16x2 keeps subnormals) for e2m1_word_pairs followed by two exact BF16x2
# multiplies, by 2^126 (the decode's offset) and by the group's factor. One invocation per word:
# $0..$3 the scaled pairs, $4 the word, $5 the factor. 13 integer ops + 8 multiplies for 8
# weights (Hopper: the integer ops share the ALU pipe with the multiplies' FMA pipe).
# e2m1_word_pairs in PTX: the 4 pairs of word $4 in registers t0..t3.
_WORD_PAIRS_DECODE = """
shr.u32 w, $4, 8;
and.b32 t0, $4, 0x000F000F;
and.b32 t1, $4, 0x00F000F0;
and.b32 t2, w, 0x000F000F;
and.b32 t3, w, 0x00F000F0;
mul.lo.u32 t0, t0, 0x1040;
mul.lo.u32 t1, t1, 0x0104;
mul.lo.u32 t2, t2, 0x1040;
mul.lo.u32 t3, t3, 0x0104;
and.b32 t0, t0, 0x81C081C0;
and.b32 t1, t1, 0x81C081C0;
and.b32 t2, t2, 0x81C081C0;
and.b32 t3, t3, 0x81C081C0;
"""
_TIMES_FACTOR = """
mul.rn.bf16x2 $0, t0, $5;
mul.rn.bf16x2 $1, t1, $5;
mul.rn.bf16x2 $2, t2, $5;
mul.rn.bf16x2 $3, t3, $5;
"""
E2M1_WORD_PAIRS_PTX = tl.constexpr(
    "{\n.reg .b32 w, k, t0, t1, t2, t3;\nmov.b32 k, 0x7E807E80;" + _WORD_PAIRS_DECODE
    + "".join(f"mul.rn.bf16x2 t{i}, t{i}, k;\n" for i in range(4)) + _TIMES_FACTOR + "}\n")


# The same with ONE multiply per pair, by 2^(s - 1 - ONE_FACTOR_SHIFT) (the 2^126 folded in):
# the weights come out times 2^-ONE_FACTOR_SHIFT, undone on the fp32 accumulator. Exact only
# for E8M0 bytes in 59..192 (weights' group scales 2^-68 .. 2^65): the factor must be a BF16
# (s <= 192) and the smallest weight 0.5 * 2^(s-127-64) no smaller than BF16's 2^-133; byte 0
# gives 0 as the two-multiply decode does. Callers take it only when the weights promise it
# (ops/moe.py: ONE_FACTOR_SCALE_BYTES, mxfp4_scales_allow_one_factor, one_factor_exact).
ONE_FACTOR_SHIFT = tl.constexpr(64)
E2M1_WORD_PAIRS_ONE_FACTOR_PTX = tl.constexpr(
    "{\n.reg .b32 w, t0, t1, t2, t3;" + _WORD_PAIRS_DECODE + _TIMES_FACTOR + "}\n")


@triton.jit
def e2m1_word_pairs_scaled_ptx(b_words, b_scales, ONE_FACTOR: tl.constexpr):
    """As e2m1_word_pairs, then scaled by the E8M0 bytes b_scales (int32), in inline PTX: 4
    int32 tensors of BF16x2 weights. NVIDIA only. Exact: times 2^126, then times 2^(s-127).
    ONE_FACTOR: one multiply, by 2^(s-1-64): the weights times 2^-64, exact for s in 59..192
    (see E2M1_WORD_PAIRS_ONE_FACTOR_PTX)."""
    if ONE_FACTOR:
        b_pairs = tl.inline_asm_elementwise(
            E2M1_WORD_PAIRS_ONE_FACTOR_PTX, "=r,=r,=r,=r,r,r",
            [b_words, e8m0_bf16x2_factor(b_scales + (126 - ONE_FACTOR_SHIFT))],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        b_pairs = tl.inline_asm_elementwise(
            E2M1_WORD_PAIRS_PTX, "=r,=r,=r,=r,r,r", [b_words, e8m0_bf16x2_factor(b_scales)],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    return b_pairs
