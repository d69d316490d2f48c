"""indexer_score's key tiles: `score_key_tile` reads a tile of BLOCK_N keys (FP8 or MXFP4),
multiplies it against the program's queries and stores its scores through
`store_tile_scores` (relu, weights, head sum, key scale, causal mask, store). Run by
`indexer_score_kernel` (triton_kernels/indexer_score.py, which owns the numbers in its
docstring).
"""

import triton
import triton.language as tl


@triton.jit
def mxfp4_dequantize_keys(b_packed, b_scale_bytes, BLOCK_N: tl.constexpr):
    """[BLOCK_N, 64] uint8 E2M1 pairs + [BLOCK_N, 4] uint8 E8M0 -> [BLOCK_N, 128] fp32."""
    codes = tl.join(b_packed & 0xF, b_packed >> 4)  # [BLOCK_N, 64, 2]: the even value is low
    codes = tl.reshape(codes, (BLOCK_N, 4, 32)).to(tl.int32)
    index = codes & 7
    magnitude = tl.where(index < 4, index.to(tl.float32) * 0.5,
                         tl.where(index == 7, 6.0, (index - 2).to(tl.float32)))
    value = tl.where((codes & 8) != 0, -magnitude, magnitude)
    scale_byte = b_scale_bytes.to(tl.int32)
    scale_bits = tl.where(scale_byte == 0, 1 << 22, scale_byte << 23)
    scale_bits = tl.where(scale_byte == 255, 0x7FC00000, scale_bits)
    scale = scale_bits.to(tl.float32, bitcast=True)
    return tl.reshape(value * scale[:, :, None], (BLOCK_N, 128))


@triton.jit
def weighted_head_sum(b_logits, b_weight, ROWS: tl.constexpr, HEADS_PAD: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """[BLOCK_N, ROWS * HEADS_PAD] logits -> [BLOCK_N, ROWS]: sum_h w_h relu(logit_h)."""
    b_logits = tl.maximum(b_logits, 0.0) * b_weight[None, :]
    return tl.sum(tl.reshape(b_logits, (BLOCK_N, ROWS, HEADS_PAD)), axis=2)


@triton.jit
def store_tile_scores(
    b_logits, b_key_scale, start, chunk_end, scores_ptr, stride_scores_row,
    o_r, m_rows, b_position, b_weight,
    ROWS: tl.constexpr, HEADS_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """[BLOCK_N, ROWS * HEADS_PAD] logits of keys start .. start + BLOCK_N -> the rows'
    scores: key scale x sum_h w_h relu(logit_h) (the scale after the sum: it is common to the
    heads and positive), -inf past each row's position, stored up to chunk_end."""
    o_s = start + tl.arange(0, BLOCK_N)
    b_scores = weighted_head_sum(b_logits, b_weight, ROWS, HEADS_PAD, BLOCK_N)
    b_scores = b_scores * b_key_scale[:, None]  # [BLOCK_N, ROWS]
    p_scores = scores_ptr + o_r[None, :].to(tl.int64) * stride_scores_row + o_s[:, None]
    is_future = o_s[:, None] > b_position[None, :]
    b_scores = tl.where(is_future, float("-inf"), b_scores)
    tl.store(p_scores, b_scores, mask=m_rows[None, :] & (o_s < chunk_end)[:, None])


@triton.jit
def score_key_tile(
    values_ptr, scales_ptr, scores_ptr, b_block, start, key_end, chunk_end, block_size,
    stride_values_b, stride_values_t, stride_scales_b, stride_scales_t, stride_scores_row,
    o_key_rows, o_scale_rows, o_r, m_rows, b_position, b_weight, b_q_t,
    ROWS: tl.constexpr, HEADS_PAD: tl.constexpr, IS_MXFP4: tl.constexpr,
    DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILES: tl.constexpr,
):
    """Scores of the tile's rows (m_rows: one request's) over keys start .. start + BLOCK_N
    in page(s) b_block (int64: a scalar with PAGE_TILES, else one per key), -inf past each
    row's position. Key offsets are int32: an int64 modulo per key row is a ~80-instruction
    subroutine call in SASS (10 per tile, more than the rest of the tile's work)."""
    if not IS_MXFP4:  # int32 there made gfx942's compile spill scalar registers
        start = tl.cast(start, tl.int32)  # positions < 2^31 (the launcher checks L)
        key_end, chunk_end = tl.cast(key_end, tl.int32), tl.cast(chunk_end, tl.int32)
        b_position = b_position.to(tl.int32)
    o_s = start + tl.arange(0, BLOCK_N)
    m_s = o_s < key_end
    if PAGE_TILES:
        # The tile lies in one page: a scalar tile offset plus the loop-invariant row
        # offsets (two 64-bit adds per row instead of recomputing each row's address).
        tile_offset = start % block_size
        p_key = (values_ptr + (b_block * stride_values_b + tile_offset * stride_values_t)
                 + o_key_rows)
        p_key_scale = (scales_ptr + (b_block * stride_scales_b + tile_offset * stride_scales_t)
                       + o_scale_rows)
    else:
        o_offset = o_s % block_size
        p_key = values_ptr + b_block * stride_values_b + o_offset * stride_values_t
        p_key_scale = scales_ptr + b_block * stride_scales_b + o_offset * stride_scales_t
    if IS_MXFP4:
        o_byte = tl.arange(0, 64)
        o_group = tl.arange(0, 4)
        b_packed = tl.load(p_key[:, None] + o_byte[None, :], mask=m_s[:, None], other=0)
        b_scale_bytes = tl.load(p_key_scale[:, None] + o_group[None, :], mask=m_s[:, None],
                                other=0)
        b_k = mxfp4_dequantize_keys(b_packed, b_scale_bytes, BLOCK_N).to(DOT_DTYPE)
        b_key_scale = tl.full((BLOCK_N,), 1.0, tl.float32)  # in the dequantized keys
    else:
        b_key_scale = tl.load(p_key_scale, mask=m_s, other=0.0)
        b_k = tl.load(p_key[:, None] + tl.arange(0, 128)[None, :], mask=m_s[:, None],
                      other=0.0).to(DOT_DTYPE)
    b_logits = tl.dot(b_k, b_q_t, input_precision="ieee")  # [BLOCK_N, ROWS * HEADS_PAD]
    store_tile_scores(b_logits, b_key_scale, start, chunk_end, scores_ptr, stride_scores_row,
                      o_r, m_rows, b_position, b_weight, ROWS, HEADS_PAD, BLOCK_N)
