"""indexer_score's key tiles: `score_key_tile` reads a tile of BLOCK_N keys (every key format
and product), multiplies and stores its scores through `store_tile_scores` (relu, weights,
head sum, key scale, causal mask, store). Run by `indexer_score_kernel`
(triton_kernels/indexer_score.py, which owns the numbers in its docstring).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.indexer_score_keys import (
    fp8_key_columns, key_tile_product, mxfp4_dequantize_keys, weighted_head_sum,
)


@triton.jit
def store_tile_scores(
    b_logits, b_key_scale, start, chunk_end, scores_ptr, stride_scores_row,
    o_r, m_rows, b_position, b_weight,
    ROWS: tl.constexpr, HEADS_PAD: tl.constexpr, REPEAT_EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):
    """[BLOCK_N, ROWS * HEADS_PAD] logits of keys start .. start + BLOCK_N -> the rows'
    scores: key scale x sum_h w_h relu(logit_h) (the scale after the sum: it is common to the
    heads and positive), -inf past each row's position, stored up to chunk_end. MASKED False:
    the caller knows every key is before chunk_end and every row's position."""
    o_s = start + tl.arange(0, BLOCK_N)
    b_scores = weighted_head_sum(b_logits, b_weight, ROWS, HEADS_PAD, BLOCK_N)
    if REPEAT_EPILOGUE:  # the probe: the sum again with weights x 2 (not merged), exact
        b_twice = weighted_head_sum(b_logits, b_weight * 2.0, ROWS, HEADS_PAD, BLOCK_N)
        b_scores = (b_scores + 0.5 * b_twice) * 0.5
    b_scores = b_scores * b_key_scale[:, None]  # [BLOCK_N, ROWS]
    p_scores = scores_ptr + o_r[None, :].to(tl.int64) * stride_scores_row + o_s[:, None]
    if MASKED:
        is_future = o_s[:, None] > b_position[None, :]
        b_scores = tl.where(is_future, float("-inf"), b_scores)
        tl.store(p_scores, b_scores, mask=m_rows[None, :] & (o_s < chunk_end)[:, None])
    else:
        tl.store(p_scores, b_scores, mask=m_rows[None, :])


@triton.jit
def score_key_tile(
    values_ptr, scales_ptr, scores_ptr, b_block, start, key_end, chunk_end, block_size,
    stride_values_b, stride_values_t, stride_scales_b, stride_scales_t, stride_scores_row,
    o_key_rows, o_scale_rows,
    o_r, m_rows, b_position, b_weight, b_q_t, b_q_t0, b_q_t1, b_q_t2, b_q_t3,
    ROWS: tl.constexpr, HEADS_PAD: tl.constexpr, IS_MXFP4: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_FP8_DOT: tl.constexpr, FP8_ACC_INTERVAL: tl.constexpr,
    K_SPLIT: tl.constexpr, KEY_CONVERT: tl.constexpr, REPEAT_EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_TILES: tl.constexpr, MASKED: tl.constexpr = True,
):
    """Scores of the tile's rows (m_rows: one request's) over keys start .. start + BLOCK_N
    in page(s) b_block (int64: a scalar with PAGE_TILES, else one per key), -inf past each
    row's position. Key offsets are int32: an int64 modulo per key row is a ~80-instruction
    subroutine call in SASS (10 per tile, more than the rest of the tile's work). MASKED
    False: every key is before key_end and every row's position (no masks to compute)."""
    if not IS_MXFP4:  # int32 there made gfx942's compile spill scalar registers
        start = tl.cast(start, tl.int32)  # positions < 2^31 (the launcher checks L)
        key_end, chunk_end = tl.cast(key_end, tl.int32), tl.cast(chunk_end, tl.int32)
        b_position = b_position.to(tl.int32)
    o_s = start + tl.arange(0, BLOCK_N)
    if MASKED:
        m_s = o_s < key_end
    else:  # a constant mask: the loads compile unmasked
        m_s = tl.full((BLOCK_N,), 1, tl.int1)
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
        b_logits = tl.dot(b_k, b_q_t, input_precision="ieee")  # [BLOCK_N, M]
    elif K_SPLIT == 4:
        b_key_scale = tl.load(p_key_scale, mask=m_s, other=0.0)
        o_k32 = tl.arange(0, 32)
        b_k = fp8_key_columns(p_key, m_s, 0, o_k32, USE_FP8_DOT, DOT_DTYPE, KEY_CONVERT)
        b_logits = key_tile_product(b_k, b_q_t0, USE_FP8_DOT, 0)
        b_k = fp8_key_columns(p_key, m_s, 32, o_k32, USE_FP8_DOT, DOT_DTYPE, KEY_CONVERT)
        b_logits += key_tile_product(b_k, b_q_t1, USE_FP8_DOT, 0)
        b_k = fp8_key_columns(p_key, m_s, 64, o_k32, USE_FP8_DOT, DOT_DTYPE, KEY_CONVERT)
        b_logits += key_tile_product(b_k, b_q_t2, USE_FP8_DOT, 0)
        b_k = fp8_key_columns(p_key, m_s, 96, o_k32, USE_FP8_DOT, DOT_DTYPE, KEY_CONVERT)
        b_logits += key_tile_product(b_k, b_q_t3, USE_FP8_DOT, 0)
    else:
        b_key_scale = tl.load(p_key_scale, mask=m_s, other=0.0)
        b_k = fp8_key_columns(p_key, m_s, 0, tl.arange(0, 128), USE_FP8_DOT, DOT_DTYPE,
                              KEY_CONVERT)
        b_logits = key_tile_product(b_k, b_q_t, USE_FP8_DOT, FP8_ACC_INTERVAL)
    if IS_MXFP4:
        b_key_scale = tl.full((BLOCK_N,), 1.0, tl.float32)  # in the dequantized keys
    store_tile_scores(b_logits, b_key_scale, start, chunk_end, scores_ptr, stride_scores_row,
                      o_r, m_rows, b_position, b_weight, ROWS, HEADS_PAD, REPEAT_EPILOGUE,
                      BLOCK_N, MASKED)
