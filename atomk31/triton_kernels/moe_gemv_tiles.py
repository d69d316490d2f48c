"""Per-tile products of the MoE GEMVs (moe_gemv.py): one K tile of MXFP4 weight rows decoded
and multiplied by the activation rows, in each ``MODE``.

``tile_product`` is the entry: "dot_t_words" reads the weights as int32 words of 8 nibbles
(``_words_tile_weights``), "fma" and "dot_t" as bytes (``_byte_tile_product``: FP16-bit E2M1
decode; FMA group sums or ``tl.dot``). ``load_activations`` loads a K tile of the activation
rows in the layout its mode needs and ``tile_accumulator`` zeroes the mode's accumulator
([BLOCK_N, BLOCK_M] for the transposed "dot_t" modes).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.moe_mxfp4_decode import (ONE_FACTOR_SHIFT, e2m1_times_2_pow_minus_14,
                                                     e2m1_word_pairs, e2m1_word_pairs_scaled_ptx,
                                                     e8m0_factor)

TWO_POW_126 = tl.constexpr(2.0 ** 126)
ONE_FACTOR_UNDO = tl.constexpr(2.0 ** ONE_FACTOR_SHIFT.value)
# The one-multiply decodes' factor byte: 2^(s - 1 - ONE_FACTOR_SHIFT) has exponent field
# s + 126 - ONE_FACTOR_SHIFT (fp32 and BF16 share the bias).
ONE_FACTOR_BYTE_OFFSET = tl.constexpr(126 - ONE_FACTOR_SHIFT.value)


@triton.jit
def _byte_tile_product(b_a_even, b_a_odd, b_a, p_packed, p_scales, k0, acc,
                       STRIDE_PACKED: tl.constexpr, STRIDE_SCALES: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr,
                       DOT_FP32: tl.constexpr):
    """acc + a[:, k0:k0+BLOCK_K] @ W[rows, k0:k0+BLOCK_K]^T, W as bytes.

    "fma": b_a_even / b_a_odd are the activations of even / odd inputs as [BLOCK_M, G, 16]
    fp32 (G = BLOCK_K / 32 groups), matching the low / high nibbles; acc is [BLOCK_M, BLOCK_N].
    "dot_t": b_a is [BLOCK_M, BLOCK_K] and acc [BLOCK_N, BLOCK_M] (the product transposed, the
    weights as the dot's first operand so they can stay in registers)."""
    GROUPS: tl.constexpr = BLOCK_K // 32
    o_n = tl.arange(0, BLOCK_N)
    # Triton's alignment analysis loses k0's divisibility through `//`: without the hints
    # the weight loads compile to one-byte LDG.U8 and the group sums to warp shuffles.
    o_kp = tl.multiple_of(k0 // 2, BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    o_g = tl.multiple_of(k0 // 32, GROUPS) + tl.arange(0, GROUPS)
    b_bytes = tl.load(p_packed + o_n[:, None] * STRIDE_PACKED + o_kp[None, :])
    b_scales = tl.load(p_scales + o_n[:, None] * STRIDE_SCALES + o_g[None, :])
    b_packed = b_bytes.to(tl.int32)
    b_factor = e8m0_factor(b_scales)
    b_low = e2m1_times_2_pow_minus_14(b_packed & 0xF)
    b_high = e2m1_times_2_pow_minus_14(b_packed >> 4)
    if MODE == "dot_t":
        b_w = tl.reshape(tl.join(b_low, b_high), (BLOCK_N, GROUPS, 32))
        b_w = tl.reshape(b_w * b_factor[:, :, None], (BLOCK_N, BLOCK_K))
        if DOT_FP32:
            acc = tl.dot(b_w, tl.trans(b_a.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(b_w.to(b_a.dtype), tl.trans(b_a), acc)
    else:
        b_low = tl.reshape(b_low, (1, BLOCK_N, GROUPS, 16))
        b_high = tl.reshape(b_high, (1, BLOCK_N, GROUPS, 16))
        # Sum each 32-input group unscaled, then apply its scale once.
        b_group = tl.sum(b_low * b_a_even[:, None, :, :] + b_high * b_a_odd[:, None, :, :],
                         axis=3)
        acc += tl.sum(b_group * b_factor[None, :, :], axis=2)
    return acc


@triton.jit
def _bf16x2_halves(b_pairs, AS_FP32: tl.constexpr):
    """int32 BF16x2 bits -> (low, high) halves as BF16 (as fp32 when AS_FP32; exact)."""
    if AS_FP32:
        b_low = (b_pairs << 16).to(tl.float32, bitcast=True)
        b_high = (b_pairs & -65536).to(tl.float32, bitcast=True)
    else:
        b_low = b_pairs.to(tl.int16).to(tl.bfloat16, bitcast=True)
        b_high = (b_pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return b_low, b_high


@triton.jit
def _scaled_word_pair(b_pairs, b_scales):
    """Plain-Triton path of "dot_t_words": unscaled pairs (E2M1 * 2^-126) times 2^126 and the
    E8M0 factor in fp32 (exact; two products so no factor overflows), as fp32 (low, high)."""
    b_low, b_high = _bf16x2_halves(b_pairs, True)
    b_factor = (b_scales << 23).to(tl.float32, bitcast=True)
    return b_low * TWO_POW_126 * b_factor, b_high * TWO_POW_126 * b_factor


@triton.jit
def _one_factor_word_pair(b_pairs, b_scales):
    """Plain-Triton one-multiply decode ("triton_one_factor"): unscaled pairs (E2M1 * 2^-126)
    times 2^(s - 1 - ONE_FACTOR_SHIFT) in fp32, as fp32 (low, high): the weights times
    2^-ONE_FACTOR_SHIFT, the same values as the PTX one-factor decode wherever the scale bytes
    allow it (ops/moe.py: 0 and 59..192), where they are BF16s."""
    b_low, b_high = _bf16x2_halves(b_pairs, True)
    b_factor = ((b_scales + ONE_FACTOR_BYTE_OFFSET) << 23).to(tl.float32, bitcast=True)
    return b_low * b_factor, b_high * b_factor


@triton.jit
def undo_one_factor(acc, WORD_DECODE: tl.constexpr):
    """The fp32 accumulator of a one-multiply decode's products times 2^ONE_FACTOR_SHIFT (its
    weights came times 2^-ONE_FACTOR_SHIFT); unchanged for the other decodes."""
    if WORD_DECODE == "ptx_one_factor" or WORD_DECODE == "triton_one_factor":
        acc = acc * ONE_FACTOR_UNDO
    return acc


@triton.jit
def _words_tile_weights(p_words, p_scales, k0, STRIDE_WORDS: tl.constexpr,
                        STRIDE_SCALES: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, WORD_DECODE: tl.constexpr):
    """MODE "dot_t_words": W[rows, k0:k0+BLOCK_K] read as int32 words, decoded two weights per
    32-bit op, returned as [BLOCK_N, BLOCK_K] in the WORD ORDER of the inputs (words_order).
    WORD_DECODE: "triton" (plain ops, any backend; fp32 weights), "ptx" (NVIDIA; BF16 weights,
    exact), or the one-multiply decodes "ptx_one_factor" / "triton_one_factor" (weights times
    2^-ONE_FACTOR_SHIFT, exact for the scale bytes of ops/moe.py's ONE_FACTOR_SCALE_BYTES).

    The tensor-core A fragment gives lane c (of 4) inputs 2c, 2c+1, 2c+8, 2c+9 of every 16.
    Word order puts word (c, q) of the tile (words c Q .. c Q + Q-1, Q = BLOCK_K / 32) on lane
    c: pair i of word q (nibbles i and i + 4, one BF16x2 register) lands on k' = 32 q + 16 i1 +
    8 i0 + 2 c + {0, 1} (i = 2 i1 + i0). So every thread decodes whole words, from one 4Q-byte
    load, straight into the registers the MMA reads; the activations come in the same order."""
    Q: tl.constexpr = BLOCK_K // 32
    WORDS: tl.constexpr = BLOCK_K // 8
    GROUPS: tl.constexpr = BLOCK_K // 32
    o_n = tl.arange(0, BLOCK_N)
    o_kw = tl.multiple_of(k0 // 8, WORDS) + tl.arange(0, WORDS)
    o_g = tl.multiple_of(k0 // 32, GROUPS) + tl.arange(0, GROUPS)
    b_words = tl.reshape(tl.load(p_words + o_n[:, None] * STRIDE_WORDS + o_kw[None, :]),
                         (BLOCK_N, 4, Q))
    b_scales = tl.load(p_scales + o_n[:, None] * STRIDE_SCALES + o_g[None, :]).to(tl.int32)
    return decode_words_tile(b_words, b_scales, BLOCK_N, BLOCK_K, WORD_DECODE)


@triton.jit
def load_words_tile(p_words, k0, STRIDE_WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """The packed words of rows p_words[0 .. BLOCK_N-1] for inputs k0 .. k0 + BLOCK_K, as int32
    [BLOCK_N, 4 (c), BLOCK_K / 32 (q)], as _words_tile_weights loads them (there inline, beside
    its scale load, in the GEMV's order)."""
    Q: tl.constexpr = BLOCK_K // 32
    WORDS: tl.constexpr = BLOCK_K // 8
    o_n = tl.arange(0, BLOCK_N)
    o_kw = tl.multiple_of(k0 // 8, WORDS) + tl.arange(0, WORDS)
    return tl.reshape(tl.load(p_words + o_n[:, None] * STRIDE_WORDS + o_kw[None, :]),
                      (BLOCK_N, 4, Q))


@triton.jit
def decode_words_tile(b_words, b_scales, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      WORD_DECODE: tl.constexpr):
    """Words [BLOCK_N, 4, Q] and their E8M0 bytes int32 [BLOCK_N, BLOCK_K / 32] -> the weights
    [BLOCK_N, BLOCK_K] in word order (see _words_tile_weights; WORD_DECODE as there)."""
    Q: tl.constexpr = BLOCK_K // 32  # also the tile's scale groups (32 inputs each)
    # Word w = 4 g + r of the tile is in group g: [N, G] -> [N, G, 4] -> [N, 4 (c), Q].
    b_scales = tl.reshape(tl.broadcast_to(b_scales[:, :, None], (BLOCK_N, Q, 4)),
                          (BLOCK_N, 4, Q))
    if WORD_DECODE == "ptx" or WORD_DECODE == "ptx_one_factor":
        b_p0, b_p1, b_p2, b_p3 = e2m1_word_pairs_scaled_ptx(b_words, b_scales,
                                                             WORD_DECODE == "ptx_one_factor")
        b_l0, b_h0 = _bf16x2_halves(b_p0, False)
        b_l1, b_h1 = _bf16x2_halves(b_p1, False)
        b_l2, b_h2 = _bf16x2_halves(b_p2, False)
        b_l3, b_h3 = _bf16x2_halves(b_p3, False)
    elif WORD_DECODE == "triton_one_factor":
        b_p0, b_p1, b_p2, b_p3 = e2m1_word_pairs(b_words)
        b_l0, b_h0 = _one_factor_word_pair(b_p0, b_scales)
        b_l1, b_h1 = _one_factor_word_pair(b_p1, b_scales)
        b_l2, b_h2 = _one_factor_word_pair(b_p2, b_scales)
        b_l3, b_h3 = _one_factor_word_pair(b_p3, b_scales)
    else:
        b_p0, b_p1, b_p2, b_p3 = e2m1_word_pairs(b_words)
        b_l0, b_h0 = _scaled_word_pair(b_p0, b_scales)
        b_l1, b_h1 = _scaled_word_pair(b_p1, b_scales)
        b_l2, b_h2 = _scaled_word_pair(b_p2, b_scales)
        b_l3, b_h3 = _scaled_word_pair(b_p3, b_scales)
    # [N, c, q] per nibble -> [N, c, q, i2, i0, i1] (nibble 4 i2 + 2 i1 + i0) ->
    # [N, q, i1, i0, c, i2] -> k' = 32 q + 16 i1 + 8 i0 + 2 c + i2.
    b_i1_0 = tl.join(tl.join(b_l0, b_h0), tl.join(b_l1, b_h1))
    b_i1_1 = tl.join(tl.join(b_l2, b_h2), tl.join(b_l3, b_h3))
    b_w = tl.permute(tl.join(b_i1_0, b_i1_1), (0, 2, 5, 4, 1, 3))
    return tl.reshape(b_w, (BLOCK_N, BLOCK_K))


@triton.jit
def words_order(o_k, BLOCK_K: tl.constexpr):
    """Input index k -> its position k' in word order (see _words_tile_weights), per block of
    BLOCK_K inputs: k = 8 (Q c + q) + 4 i2 + 2 i1 + i0 -> 32 q + 16 i1 + 8 i0 + 2 c + i2."""
    Q: tl.constexpr = BLOCK_K // 32
    o_r = o_k % BLOCK_K
    o_word = o_r // 8
    o_c, o_q = o_word // Q, o_word % Q
    o_i2, o_i1, o_i0 = (o_r >> 2) & 1, (o_r >> 1) & 1, o_r & 1
    return (o_k - o_r) + 32 * o_q + 16 * o_i1 + 8 * o_i0 + 2 * o_c + o_i2


@triton.jit
def tile_product(b_a_even, b_a_odd, b_a, p_packed, p_scales, k0, acc,
                 STRIDE_PACKED: tl.constexpr, STRIDE_SCALES: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 MODE: tl.constexpr, DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr):
    if MODE == "dot_t_words":
        b_w = _words_tile_weights(p_packed, p_scales, k0, STRIDE_PACKED, STRIDE_SCALES, BLOCK_N,
                                  BLOCK_K, WORD_DECODE)
        if DOT_FP32:
            acc = tl.dot(b_w, tl.trans(b_a.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(b_w.to(b_a.dtype), tl.trans(b_a), acc)   # exact for BF16
    else:
        acc = _byte_tile_product(b_a_even, b_a_odd, b_a, p_packed, p_scales, k0, acc,
                                 STRIDE_PACKED, STRIDE_SCALES, BLOCK_N, BLOCK_K, MODE, DOT_FP32)
    return acc


@triton.jit
def load_activations(p_rows, m_m, k0, BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    """Rows p_rows [BLOCK_M] (pointers to row starts) at inputs k0..k0+BLOCK_K, as (even, odd,
    tile): for "fma" even / odd inputs as fp32 [BLOCK_M, G, 16] (tile = even); else the plain
    [BLOCK_M, BLOCK_K] tile (even = odd = tile)."""
    o_k = tl.multiple_of(k0, BLOCK_K) + tl.arange(0, BLOCK_K)
    b_tile = tl.load(p_rows[:, None] + o_k[None, :], mask=m_m[:, None], other=0.0)
    if MODE == "fma":
        # One contiguous (vectorised) load, split into even / odd inputs in registers: two
        # stride-2 loads compiled to one 2-byte load per activation.
        b_pairs = tl.reshape(b_tile.to(tl.float32), (b_tile.shape[0], BLOCK_K // 32, 16, 2))
        b_even, b_odd = tl.split(b_pairs)
    else:
        b_even = b_tile
        b_odd = b_tile
    return b_even, b_odd, b_tile


@triton.jit
def tile_accumulator(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    if MODE == "fma":
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    return acc
