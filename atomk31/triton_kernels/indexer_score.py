"""indexer_score in Triton: lightning-indexer scores of query rows over the paged index keys.

Contract: `atomk31.ops.indexer_score` (MODEL_SPEC §4.6 "Quantized evaluation", §4.6.1, §9 #4):
scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= row_position[i], -inf up to L.

A program owns ROWS consecutive query rows and one chunk of key positions. For each request
among its rows it streams that request's keys page by page once and scores them against all
ROWS x H_I query heads with one matrix product, [BLOCK_N, 128] x [128, ROWS*H_I]: the rows of
one request (verification rows, prefill rows) share every key load. The keys are the
product's left operand, the quantized queries the right one (staged once in shared memory);
the sum over heads then runs along the accumulator's columns. Memory: the block-table entries
of TILE_GROUP tiles are read at once, so the key loads of the tile loop depend on no load of
that loop and Triton's pipeliner keeps num_stages - 1 tiles in flight (a block-table read per
tile inside the loop made it wait for every tile: one tile in flight).

Numbers: queries are quantized in the kernel with the keys' quantizer (§9 #4), bit-exact with
`quantize_index_keys`. FP8: the product runs on the e4m3 values themselves and the scales
come after, since relu(s_q s_k x) = s_q s_k relu(x) for positive scales:
score = s_k * sum_h (w_h s_q,h) relu(q_codes · k_codes). In bf16 (e4m3 values are bf16
values) the products are exact and accumulate in fp32; on the fp8 tensor cores Hopper
accumulates with ~14 bits, so "fp8_acc32" adds the partial sums into fp32 registers every 32
products (or K_SPLIT 4: four products of K = 32 summed in fp32); even so its error is 4x the
op's tolerance on the H200, so the fp8 products are opt-in only and the bf16 ones the default.
The keys' bf16 operand comes from the fp8 -> bf16 conversion, or (KEY_CONVERT) from the bytes'
bits: the code x 2^-120, the queries carrying 2^119 and the weights 2 (powers of two: exact).
MXFP4: every dequantized value (E2M1 value x 2^e) is exact in bf16, so one bf16 product of
the dequantized values. Under the interpreter the products run in fp32 (its bf16 dot is
wrong).
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.indexer_score_config import (
    DOTS,
    FP8_ACC_INTERVALS,
    KEY_CONVERTS,
    IndexerScoreConfig,
    default_config,
    fp8_dot_config,
)
from atomk31.triton_kernels.indexer_score_keys import (
    _has_aligned_words, fp8_key_columns, key_tile_product, key_words, mxfp4_dequantize_keys,
    split_columns_in_4, weighted_head_sum,
)
from atomk31.triton_kernels.kv_write import (
    FP8_INDEX_AMAX_FLOOR,
    FP8_MAX,
    fp8_group_quantize,
    mxfp4_group_quantize,
)

INDEX_DIM = 128
MAX_QUERY_VECTORS = 128  # ROWS * H_I per program; more spills registers


@triton.jit
def score_key_tile(
    values_ptr, scales_ptr, scores_ptr, b_block, start, key_end, chunk_end, block_size,
    stride_values_b, stride_values_t, stride_scales_b, stride_scales_t, stride_scores_row,
    o_r, m_rows, b_position, b_weight, b_q_t, b_q_t0, b_q_t1, b_q_t2, b_q_t3,
    ROWS: tl.constexpr, HEADS_PAD: tl.constexpr, IS_MXFP4: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_FP8_DOT: tl.constexpr, FP8_ACC_INTERVAL: tl.constexpr,
    K_SPLIT: tl.constexpr, KEY_CONVERT: tl.constexpr, REPEAT_EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Scores of the tile's rows (m_rows: one request's) over keys start .. start + BLOCK_N
    in page(s) b_block (a scalar, or one per key), -inf past each row's position."""
    o_s = start + tl.arange(0, BLOCK_N)
    m_s = o_s < key_end
    o_offset = (o_s % block_size).to(tl.int64)
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
    b_scores = weighted_head_sum(b_logits, b_weight, ROWS, HEADS_PAD, BLOCK_N)
    if REPEAT_EPILOGUE:  # the probe: the sum again with weights x 2 (not merged), exact
        b_twice = weighted_head_sum(b_logits, b_weight * 2.0, ROWS, HEADS_PAD, BLOCK_N)
        b_scores = (b_scores + 0.5 * b_twice) * 0.5
    if not IS_MXFP4:
        b_scores = b_scores * b_key_scale[:, None]
    is_future = o_s[:, None] > b_position[None, :]
    b_scores = tl.where(is_future, float("-inf"), b_scores)  # [BLOCK_N, ROWS]
    tl.store(scores_ptr + o_r[None, :].to(tl.int64) * stride_scores_row + o_s[:, None],
             b_scores, mask=m_rows[None, :] & (o_s < chunk_end)[:, None])


@triton.jit
def indexer_score_kernel(
    # pointers
    q_ptr, head_weights_ptr, values_ptr, scales_ptr, block_table_ptr,
    row_request_ptr, row_position_ptr, scores_ptr,
    # sizes
    num_rows, num_positions, block_size, keys_per_program,
    # strides (elements)
    stride_q_row, stride_q_head, stride_w_row, stride_w_head,
    stride_values_b, stride_values_t, stride_scales_b, stride_scales_t,
    stride_table_r, stride_scores_row,
    # meta-parameters
    NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, ROWS: tl.constexpr,
    IS_MXFP4: tl.constexpr, FP8_MAX_VALUE: tl.constexpr, MIN_AMAX: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_FP8_DOT: tl.constexpr, FP8_ACC_INTERVAL: tl.constexpr,
    K_SPLIT: tl.constexpr,  # 4: four products of K = 32 summed in fp32 (FP8 keys only)
    KEY_CONVERT: tl.constexpr,  # e4m3fn keys -> operand: 0 convert, 1 bytes, 2 words (config)
    REPEAT_EPILOGUE: tl.constexpr,  # a benchmark probe (config.repeat_epilogue)
    BLOCK_N: tl.constexpr,
    PAGE_TILES: tl.constexpr,  # block_size % BLOCK_N == 0: no tile straddles two pages
    TILE_GROUP: tl.constexpr,  # > 0 (PAGE_TILES only): block-table reads per TILE_GROUP tiles
):
    i_tile = tl.program_id(0)
    i_chunk = tl.program_id(1)
    M: tl.constexpr = ROWS * HEADS_PAD
    o_d = tl.arange(0, 128)
    o_r = i_tile * ROWS + tl.arange(0, ROWS)
    m_r = o_r < num_rows
    b_request = tl.load(row_request_ptr + o_r, mask=m_r, other=-1).to(tl.int32)
    b_position = tl.load(row_position_ptr + o_r, mask=m_r, other=-1).to(tl.int64)

    # Query vectors of the tile, row-major over (row, head), quantized like the keys (§9 #4).
    o_m = tl.arange(0, M)
    o_m_row = i_tile * ROWS + o_m // HEADS_PAD
    o_m_head = o_m % HEADS_PAD
    m_m = (o_m_row < num_rows) & (o_m_head < NUM_HEADS)
    b_q = tl.load(q_ptr + o_m_row[:, None].to(tl.int64) * stride_q_row
                  + o_m_head[:, None] * stride_q_head + o_d[None, :],
                  mask=m_m[:, None], other=0.0).to(tl.float32)
    b_weight = tl.load(head_weights_ptr + o_m_row.to(tl.int64) * stride_w_row
                       + o_m_head * stride_w_head, mask=m_m, other=0.0).to(tl.float32)
    if IS_MXFP4:
        _, q_values, q_scale, _ = mxfp4_group_quantize(tl.reshape(b_q, (M, 4, 32)))
        b_q_dot = tl.reshape(q_values * q_scale[:, :, None], (M, 128))
    else:
        b_q_dot, q_scale = fp8_group_quantize(b_q, FP8_MAX_VALUE, MIN_AMAX)
        b_weight = b_weight * q_scale
        if KEY_CONVERT > 0:
            # The keys' operand is key x 2^-120; queries x 2^119 (448 x 2^119 < the bf16
            # maximum 2^128) and weights x 2 give the same scores: powers of two, exact.
            b_q_dot = b_q_dot * 6.646139978924579e35  # 2^119
            b_weight = b_weight * 2.0
    if USE_FP8_DOT:
        b_q_dot = b_q_dot.to(values_ptr.dtype.element_ty)
    else:
        b_q_dot = b_q_dot.to(DOT_DTYPE)
    b_q_t = tl.trans(b_q_dot)  # [128, M]
    b_q_t0, b_q_t1, b_q_t2, b_q_t3 = b_q_t, b_q_t, b_q_t, b_q_t  # [32, M] each for K_SPLIT 4
    if K_SPLIT == 4:
        b_q_0, b_q_1, b_q_2, b_q_3 = split_columns_in_4(b_q_dot, M)
        b_q_t0, b_q_t1 = tl.trans(b_q_0), tl.trans(b_q_1)
        b_q_t2, b_q_t3 = tl.trans(b_q_2), tl.trans(b_q_3)

    chunk_start = i_chunk * keys_per_program
    chunk_end = tl.minimum(chunk_start + keys_per_program, num_positions)
    # Each request among the tile's rows streams its keys once (rows grouped by request in
    # the engine's batches; any order is still correct).
    for j in range(ROWS):
        request = tl.load(row_request_ptr + tl.minimum(i_tile * ROWS + j, num_rows - 1))
        is_first = tl.sum(((tl.arange(0, ROWS) < j) & (b_request == request)).to(tl.int32)) == 0
        if (i_tile * ROWS + j < num_rows) & is_first:
            m_rows = b_request == request
            max_position = tl.max(tl.where(m_rows, b_position, -1))
            key_end = tl.minimum(chunk_end, max_position + 1)
            if TILE_GROUP > 0:
                # The pages of TILE_GROUP tiles read at once: the key loads of the inner loop
                # then depend on no load of their own loop, so they pipeline num_stages deep.
                o_group = tl.arange(0, TILE_GROUP)
                for group_start in range(chunk_start, key_end, TILE_GROUP * BLOCK_N):
                    o_tile_start = group_start + o_group * BLOCK_N
                    b_pages = tl.load(block_table_ptr + request.to(tl.int64) * stride_table_r
                                      + o_tile_start // block_size,
                                      mask=o_tile_start < key_end, other=0)
                    group_end = tl.minimum(group_start + TILE_GROUP * BLOCK_N, key_end)
                    for start in range(group_start, group_end, BLOCK_N):
                        b_block = tl.sum(tl.where(o_tile_start == start, b_pages, 0))
                        score_key_tile(
                            values_ptr, scales_ptr, scores_ptr, b_block.to(tl.int64), start,
                            key_end, chunk_end, block_size, stride_values_b, stride_values_t,
                            stride_scales_b, stride_scales_t, stride_scores_row, o_r, m_rows,
                            b_position, b_weight, b_q_t, b_q_t0, b_q_t1, b_q_t2, b_q_t3,
                            ROWS, HEADS_PAD, IS_MXFP4, DOT_DTYPE, USE_FP8_DOT,
                            FP8_ACC_INTERVAL, K_SPLIT, KEY_CONVERT, REPEAT_EPILOGUE, BLOCK_N)
            else:
                for start in range(chunk_start, key_end, BLOCK_N):
                    o_s = start + tl.arange(0, BLOCK_N)
                    if PAGE_TILES:  # the tile lies in one page: one block-table read
                        b_block = tl.load(block_table_ptr + request.to(tl.int64)
                                          * stride_table_r + start // block_size)
                    else:
                        b_block = tl.load(block_table_ptr + request.to(tl.int64)
                                          * stride_table_r + o_s // block_size,
                                          mask=o_s < key_end, other=0)
                    score_key_tile(
                        values_ptr, scales_ptr, scores_ptr, b_block.to(tl.int64), start,
                        key_end, chunk_end, block_size, stride_values_b, stride_values_t,
                        stride_scales_b, stride_scales_t, stride_scores_row, o_r, m_rows,
                        b_position, b_weight, b_q_t, b_q_t0, b_q_t1, b_q_t2, b_q_t3,
                        ROWS, HEADS_PAD, IS_MXFP4, DOT_DTYPE, USE_FP8_DOT,
                        FP8_ACC_INTERVAL, K_SPLIT, KEY_CONVERT, REPEAT_EPILOGUE, BLOCK_N)
            # Positions past every row of this request: -inf without reading keys.
            tail_start = chunk_start + tl.cdiv(tl.maximum(key_end - chunk_start, 0),
                                               BLOCK_N) * BLOCK_N
            for start in range(tail_start, chunk_end, BLOCK_N):
                o_s = start + tl.arange(0, BLOCK_N)
                tl.store(scores_ptr + o_r[:, None].to(tl.int64) * stride_scores_row
                         + o_s[None, :], tl.full((ROWS, BLOCK_N), float("-inf"), tl.float32),
                         mask=m_rows[:, None] & (o_s < chunk_end)[None, :])


def indexer_score_triton(
    q: torch.Tensor,
    head_weights: torch.Tensor,
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    use_fp8_dot: bool = False,
    num_positions: int | None = None,
    config: IndexerScoreConfig | None = None,
) -> torch.Tensor:
    """Indexer scores [Nq, L] fp32, L = max(row_position) + 1 (contract: ops/indexer_score).

    q [Nq, H_I, 128], head_weights [Nq, H_I], index_values / index_scales one layer's key
    pages (contiguous last dim), block_table [N, max_blocks], row_request / row_position [Nq].
    num_positions: L when the caller knows it (host-side metadata): saves reading
      max(row_position) back from the device. Rows see keys up to min(position, L - 1).
    config: the product and tiling (default: `default_config`, exact bf16 products).
    use_fp8_dot: (config None) opt in to the fp8 tensor cores (`fp8_dot_config`, e4m3fn keys
      only): faster, but 4x outside the op's tolerance on the H200 (indexer_score_config).
    """
    del fp8_variant  # the dtype of index_values says it
    num_rows = row_request.shape[0]
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != INDEX_DIM:
        raise ValueError(f"q must be [Nq={num_rows}, H_I, {INDEX_DIM}], got {list(q.shape)}")
    num_heads = q.shape[1]
    if tuple(head_weights.shape) != (num_rows, num_heads):
        raise ValueError(f"head_weights must be [Nq={num_rows}, H_I={num_heads}], got "
                         f"{list(head_weights.shape)}")
    if index_format not in ("fp8", "mxfp4"):
        raise ValueError(f"index_format must be 'fp8' or 'mxfp4', got {index_format!r}")
    heads_pad = triton.next_power_of_2(num_heads)
    if heads_pad > MAX_QUERY_VECTORS:
        raise ValueError(f"indexer_score_triton handles up to {MAX_QUERY_VECTORS} heads, got "
                         f"H_I={num_heads}; use the torch implementation")
    if index_values.shape[1] != block_size or index_values.stride(-1) != 1:
        raise ValueError(
            f"index_values must be [num_blocks, block_size={block_size}, ...] with a "
            f"contiguous last dim, got shape {list(index_values.shape)} strides "
            f"{index_values.stride()}")
    if num_positions is None:
        num_positions = int(row_position.max()) + 1 if num_rows else 0  # a device sync
    elif num_positions < 0:
        raise ValueError(f"num_positions must be >= 0, got {num_positions}")
    if config is None and use_fp8_dot:
        config = fp8_dot_config(indexer_score_kernel)
    elif config is None:
        word_keys = (index_format == "fp8" and index_values.dtype == torch.float8_e4m3fn
                     and _has_aligned_words(index_values))
        config = default_config(indexer_score_kernel, num_positions, word_keys)
    is_fp8_dot = config.dot.startswith("fp8")
    if (config.dot not in DOTS or config.k_split not in (1, 4)
            or config.key_convert not in KEY_CONVERTS):
        raise ValueError(f"config.dot must be one of {DOTS}, k_split 1 or 4 and key_convert "
                         f"one of {KEY_CONVERTS}, got {config.dot!r}, {config.k_split}, "
                         f"{config.key_convert!r}")
    if is_fp8_dot and (index_format != "fp8" or index_values.dtype != torch.float8_e4m3fn):
        raise ValueError(f"an fp8 dot ({config.dot!r}) needs e4m3fn fp8 keys, got "
                         f"{index_format} {index_values.dtype}")
    if config.k_split == 4 and index_format != "fp8":
        raise ValueError("k_split=4 is for fp8 keys, got mxfp4")
    key_convert = KEY_CONVERTS.index(config.key_convert) if not is_fp8_dot else 0
    if key_convert and (index_format != "fp8" or index_values.dtype != torch.float8_e4m3fn):
        raise ValueError(f"key_convert {config.key_convert!r} is for e4m3fn fp8 keys, got "
                         f"{index_format} {index_values.dtype}")
    if key_convert == 2 and config.k_split != 1:
        raise ValueError(f"key_convert 'words' reads all 128 columns at once: k_split must be "
                         f"1, got {config.k_split}")
    scores = torch.empty(num_rows, num_positions, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_positions == 0:
        return scores
    if q.stride(-1) != 1:
        q = q.contiguous()

    # Rows per program: about the rows of one request (host-known Nq / N), at least 16 query
    # vectors (the smallest tensor-core product) and at most MAX_QUERY_VECTORS.
    rows_per_request = triton.cdiv(num_rows, max(1, block_table.shape[0]))
    rows = max(triton.next_power_of_2(rows_per_request), max(1, 16 // heads_pad))
    rows = min(rows, max(1, MAX_QUERY_VECTORS // heads_pad))
    block_n = config.block_n
    num_row_tiles = triton.cdiv(num_rows, rows)
    num_key_tiles = triton.cdiv(num_positions, block_n)
    num_programs_wanted = config.programs_per_sm * _num_sms(q.device)
    num_chunks = min(num_key_tiles, max(1, triton.cdiv(num_programs_wanted, num_row_tiles)))
    keys_per_program = triton.cdiv(num_key_tiles, num_chunks) * block_n
    num_chunks = triton.cdiv(num_positions, keys_per_program)
    num_warps = config.num_warps
    if num_warps is None:
        num_warps = 8 if block_n * rows * heads_pad >= 128 * 128 else 4
    register_cap = {} if config.max_registers is None else {"maxnreg": config.max_registers}
    fp8_max_value = FP8_MAX.get(index_values.dtype, 448.0)
    if key_convert == 1:
        index_values = index_values.view(torch.uint8)  # the kernel reads the bytes
    elif key_convert == 2:
        index_values = key_words(index_values)
    indexer_score_kernel[(num_row_tiles, num_chunks)](
        q, head_weights, index_values, index_scales, block_table,
        row_request, row_position, scores,
        num_rows, num_positions, block_size, keys_per_program,
        q.stride(0), q.stride(1), head_weights.stride(0), head_weights.stride(1),
        index_values.stride(0), index_values.stride(1),
        index_scales.stride(0), index_scales.stride(1),
        block_table.stride(0), scores.stride(0),
        NUM_HEADS=num_heads, HEADS_PAD=heads_pad, ROWS=rows,
        IS_MXFP4=index_format == "mxfp4",
        FP8_MAX_VALUE=fp8_max_value,
        MIN_AMAX=FP8_INDEX_AMAX_FLOOR,
        DOT_DTYPE=tl.float32 if config.dot == "fp32" else tl.bfloat16,
        USE_FP8_DOT=is_fp8_dot,
        FP8_ACC_INTERVAL=FP8_ACC_INTERVALS.get(config.dot, 0),
        K_SPLIT=config.k_split,
        KEY_CONVERT=key_convert,
        REPEAT_EPILOGUE=config.repeat_epilogue,
        BLOCK_N=block_n,
        PAGE_TILES=block_size % block_n == 0,
        TILE_GROUP=config.tile_group if block_size % block_n == 0 else 0,
        num_warps=num_warps,
        num_stages=config.num_stages,
        **register_cap,
    )
    return scores


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
