"""indexer_score in Triton: lightning-indexer scores of query rows over the paged index keys.

Contract: `atomk31.ops.indexer_score` (MODEL_SPEC §4.6 "Quantized evaluation", §4.6.1, §9 #4):
scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= row_position[i], -inf up to L. The op
checks its arguments before this launcher runs.

A program owns ROWS consecutive query rows and one chunk of key positions. For each request
among its rows it streams that request's keys page by page once and scores them against all
ROWS x H_I query heads with one matrix product, [BLOCK_N, 128] x [128, ROWS*H_I]: the rows of
one request (verification rows, prefill rows) share every key load. The keys are the
product's left operand, the quantized queries the right one (staged once in shared memory);
the sum over heads then runs along the accumulator's columns (the per-tile work:
indexer_score_tile.py). Memory: the block-table entries of TILE_GROUP tiles are read at once,
so the key loads of the tile loop depend on no load of that loop and Triton's pipeliner keeps
num_stages - 1 tiles in flight (a block-table read per tile inside the loop makes it wait for
every tile: one tile in flight).

Numbers: queries are quantized in the kernel with the keys' quantizer (§9 #4), bit-exact with
`quantize_index_keys`. FP8: the product runs on the e4m3 values themselves and the scales
come after, since relu(s_q s_k x) = s_q s_k relu(x) for positive scales:
score = s_k * sum_h (w_h s_q,h) relu(q_codes · k_codes). In bf16 or fp16 (every e4m3 value,
key or query code, is a value of both: |x| <= 448 < 65504, smallest subnormal 2^-9 >= fp16's
2^-24) the products are exact and accumulate in fp32. MXFP4: every dequantized value (E2M1
value x 2^e) is exact in bf16, so one bf16 product of the dequantized values. Under the
interpreter the products run in fp32 (its bf16 dot is wrong).
"""

import torch
import triton
import triton.language as tl

from atomk31.quant.index_keys import FP8_INDEX_AMAX_FLOOR
from atomk31.triton_kernels.indexer_score_config import DOTS, IndexerScoreConfig, default_config
from atomk31.triton_kernels.indexer_score_tile import score_key_tile
from atomk31.triton_kernels.kv_write import FP8_MAX, fp8_group_quantize, mxfp4_group_quantize
from atomk31.triton_kernels.runtime import num_sms

DOT_DTYPES = {"fp32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}
MAX_QUERY_VECTORS = 128  # ROWS * H_I per program; more spills registers


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
    DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
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
    # Positions past L - 1 see the same keys as L - 1. (int64 here: int32 positions made the
    # AMD compiles spill scalar registers; the FP8 tiles convert to int32.)
    b_position = tl.load(row_position_ptr + o_r, mask=m_r, other=-1)
    b_position = tl.minimum(b_position, num_positions - 1)

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
    b_q_t = tl.trans(b_q_dot.to(DOT_DTYPE))  # [128, M]

    o_key_rows = tl.arange(0, BLOCK_N) * stride_values_t  # a tile's rows in its page
    o_scale_rows = tl.arange(0, BLOCK_N) * stride_scales_t
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
            table = block_table_ptr + request.to(tl.int64) * stride_table_r
            if TILE_GROUP > 0:
                # The pages of TILE_GROUP tiles read at once: the key loads of the inner loop
                # then depend on no load of their own loop, so they pipeline num_stages deep.
                o_group = tl.arange(0, TILE_GROUP)
                for group_start in range(chunk_start, key_end, TILE_GROUP * BLOCK_N):
                    o_tile_start = group_start + o_group * BLOCK_N
                    b_pages = tl.load(table + o_tile_start // block_size,
                                      mask=o_tile_start < key_end, other=0)
                    group_end = tl.minimum(group_start + TILE_GROUP * BLOCK_N, key_end)
                    for start in range(group_start, group_end, BLOCK_N):
                        b_block = tl.sum(tl.where(o_tile_start == start, b_pages, 0))
                        score_key_tile(
                            values_ptr, scales_ptr, scores_ptr, b_block.to(tl.int64),
                            start, key_end, chunk_end, block_size, stride_values_b,
                            stride_values_t, stride_scales_b, stride_scales_t,
                            stride_scores_row, o_key_rows, o_scale_rows, o_r, m_rows,
                            b_position, b_weight, b_q_t, ROWS, HEADS_PAD, IS_MXFP4, DOT_DTYPE,
                            BLOCK_N, PAGE_TILES)
            else:
                for start in range(chunk_start, key_end, BLOCK_N):
                    o_s = start + tl.arange(0, BLOCK_N)
                    if PAGE_TILES:  # the tile lies in one page: one block-table read
                        b_block = tl.load(table + start // block_size)
                    else:
                        b_block = tl.load(table + o_s // block_size, mask=o_s < key_end,
                                          other=0)
                    score_key_tile(
                        values_ptr, scales_ptr, scores_ptr, b_block.to(tl.int64), start,
                        key_end, chunk_end, block_size, stride_values_b, stride_values_t,
                        stride_scales_b, stride_scales_t, stride_scores_row, o_key_rows,
                        o_scale_rows, o_r, m_rows, b_position, b_weight, b_q_t, ROWS,
                        HEADS_PAD, IS_MXFP4, DOT_DTYPE, BLOCK_N, PAGE_TILES)
            # Positions past every row of this request: -inf without reading keys.
            tail_start = chunk_start + tl.cdiv(tl.maximum(key_end - chunk_start, 0),
                                               BLOCK_N) * BLOCK_N
            for start in range(tail_start, chunk_end, BLOCK_N):
                o_s = start + tl.arange(0, BLOCK_N)
                tl.store(scores_ptr + o_r[:, None].to(tl.int64) * stride_scores_row
                         + o_s[None, :], tl.full((ROWS, BLOCK_N), float("-inf"), tl.float32),
                         mask=m_rows[:, None] & (o_s < chunk_end)[None, :])


def check_config(config: IndexerScoreConfig, index_format: str) -> None:
    """Raise ValueError unless the kernel can run `config` over keys of `index_format`."""
    if config.dot not in DOTS:
        raise ValueError(f"config.dot must be one of {DOTS}, got {config.dot!r}")
    if config.dot == "fp16" and index_format != "fp8":
        raise ValueError(f"dot 'fp16' is for fp8 keys (MXFP4 values x 2^e overflow fp16), got "
                         f"{index_format}")


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
    num_positions: int | None = None,
    config: IndexerScoreConfig | None = None,
) -> torch.Tensor:
    """Indexer scores [Nq, L] fp32, L = max(row_position) + 1 (contract: ops/indexer_score).

    q [Nq, H_I, 128], head_weights [Nq, H_I], index_values / index_scales one layer's key
    pages (contiguous last dim), block_table [N, max_blocks], row_request / row_position [Nq].
    num_positions: L when the caller knows it (host-side metadata): saves reading
      max(row_position) back from the device. Rows see keys up to min(position, L - 1).
    config: the product and tiling (None: `default_config`, exact fp16 / bf16 products).
    """
    del fp8_variant  # the dtype of index_values says it
    num_rows, num_heads = q.shape[0], q.shape[1]
    heads_pad = triton.next_power_of_2(num_heads)
    if heads_pad > MAX_QUERY_VECTORS:
        raise ValueError(f"indexer_score_triton handles up to {MAX_QUERY_VECTORS} heads, got "
                         f"H_I={num_heads}; use the torch implementation")
    if index_values.stride(-1) != 1:
        raise ValueError(f"index_values must have a contiguous last dim (a page view), got "
                         f"strides {index_values.stride()}")
    if num_positions is None:
        num_positions = int(row_position.max()) + 1 if num_rows else 0  # a device sync
    elif not 0 <= num_positions < 2**31:
        raise ValueError(f"num_positions must be in [0, 2^31) (int32 positions), got "
                         f"{num_positions}")
    config = config or default_config(indexer_score_kernel, fp8_keys=index_format == "fp8")
    check_config(config, index_format)
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
    num_programs_wanted = config.programs_per_sm * num_sms(q.device)
    # Rounded down: programs past whole waves would make a last wave as slow as a full one.
    num_chunks = min(num_key_tiles, max(1, num_programs_wanted // num_row_tiles))
    keys_per_program = triton.cdiv(num_key_tiles, num_chunks) * block_n
    num_chunks = triton.cdiv(num_positions, keys_per_program)
    num_warps = config.num_warps
    if num_warps is None:
        num_warps = 8 if block_n * rows * heads_pad >= 128 * 128 else 4
    page_tiles = block_size % block_n == 0
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
        FP8_MAX_VALUE=FP8_MAX.get(index_values.dtype, 448.0),
        MIN_AMAX=FP8_INDEX_AMAX_FLOOR,
        DOT_DTYPE=DOT_DTYPES[config.dot],
        BLOCK_N=block_n,
        PAGE_TILES=page_tiles,
        TILE_GROUP=config.tile_group if page_tiles else 0,
        num_warps=num_warps,
        num_stages=config.num_stages,
    )
    return scores
