"""The MLA attention kernel of sparse_mla and dense_mla: query rows over their own cache rows.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5 "Weight absorption", §4.6 "Effect on MLA"):
per query row, H heads of 576-wide absorbed queries attend to the row's selected cache rows
(576-wide keys [c 512 | k_r 64], 512-wide values c); returns out [Nq, H, 512] and the natural
log-sum-exp [Nq, H]. Decode (one row per request), verification rows and prefill rows all
run the same kernel: every row has its own selection.

A program owns BLOCK_M = ROWS_PER_PROGRAM x BLOCK_H query vectors (ROWS_PER_PROGRAM consecutive
rows, BLOCK_H heads of each), 512 / VALUE_SPLITS of the value columns and one split of their
keys. It gathers BLOCK_N key rows at a time (each a contiguous 576-element row of the paged
cache), scores them with tensor-core products over all 576 columns and keeps an online softmax
(exp2 with log2(e) folded into the scale) and a [BLOCK_M, 512 / VALUE_SPLITS] fp32
accumulator. With one value split, 8 warps and BLOCK_M = 64 the Hopper layout gives each
warpgroup 256 of the value columns, as FlashMLA does, but Triton runs the score product on both
warpgroups over the same 64 rows (its layout for a dot feeding a dot) unless SCORES_VIA_MEMORY
hands the probabilities over through a scratch buffer (each warpgroup then takes half the
keys). With two value splits each program recomputes the scores for its half of the values
(1.53x the products) for half the accumulator: one warpgroup (4 warps) per program and two
programs per multiprocessor, or BLOCK_H = 128 (96 heads in one program) on 8 warps. Which of
these wins is measured (benchmarks/kernels/bench_sparse_mla.py; defaults in mla_tiles.py).
With several key splits (flash-decoding: they fill the multiprocessors when rows are few),
each writes its normalized partial output and lse, and `mla_combine` merges them exactly.
`dense_mla` runs this kernel with the keys taken from the block table (every causal slot
0..p); there the rows of one program must share a request (verification rows), so their keys
are read once for all of them and 96 heads tile exactly (4 rows x 16 heads or 2 x 32 = 64
vectors) instead of padding 96 to 128.

Memory latency: without pipelining each key tile waits on two dependent loads (its slots, then
its cache rows). PREFETCH 1 reads the next tile's slots during the current tile and issues all
of a tile's row loads before its first product; it carries the int32 slots (`_key_ids`), not
the 64-bit row offsets (those spilled inside the runs of wgmma), and computes the offsets per
tile. It pays with few programs (the 16-row default) and not with many (the variants measured
against it: benchmarks/NOTES.md).

Numbers: with bf16 queries and a bf16 or fp8 latent the products are bf16 (fp8 e4m3 is
exact in bf16) with fp32 accumulation, and the probabilities are rounded to bf16 for the
second product; the latent scale is applied once to the scores and once to the output, never
per element. With a float32 query or latent every product is float32 (ieee), as it is under
the interpreter (whose bf16 dot is wrong). FP16_OPERANDS (FP8 latent only): the products are
FP16 instead, over queries scaled into FP16's range by a power of two (mla_fp16_query.py) and
probabilities rounded to FP16 (3 more significand bits than BF16): closer to the fp32 result
than BF16, and one conversion instruction per two FP8 values instead of three.
"""

import triton
import triton.language as tl

LATENT_DIM = 576
VALUE_DIM = 512


@triton.jit
def _key_ids(
    slots_ptr, block_table_ptr, tile, end, i_first_row, request, block_size,
    stride_slots_row, stride_table_r, IS_DENSE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """What locates keys tile..tile + BLOCK_N - 1 (before `end`), as stored (int32): sparse,
    their slots (-1: masked); dense, their blocks. The first of the gather's two dependent
    loads, and all that PREFETCH carries to the next tile (a few registers)."""
    o_n = tile + tl.arange(0, BLOCK_N)
    m_n = o_n < end
    if IS_DENSE:
        b_id = tl.load(block_table_ptr + request * stride_table_r + o_n // block_size,
                       mask=m_n, other=0)
    else:
        b_id = tl.load(slots_ptr + i_first_row.to(tl.int64) * stride_slots_row + o_n,
                       mask=m_n, other=-1)
    return b_id


@triton.jit
def _key_rows(
    b_id, tile, end, block_size, stride_cache_b, stride_cache_t,
    IS_DENSE: tl.constexpr, BLOCK_N: tl.constexpr, FLAT_SLOTS: tl.constexpr,
):
    """Keys tile..tile + BLOCK_N - 1 located by `_key_ids`: element offsets of their cache
    rows, the valid-key mask and the key indices (causal positions). Slots are split into
    (block, offset) in int32 (an int64 division is a ~85-instruction call on triton 3.6),
    or not at all with FLAT_SLOTS (block stride = block_size x row stride: slot x row stride)."""
    o_n = tile + tl.arange(0, BLOCK_N)
    if IS_DENSE:
        m_n = o_n < end
        o_k = b_id.to(tl.int64) * stride_cache_b \
            + (o_n % block_size).to(tl.int64) * stride_cache_t
    else:
        m_n = b_id >= 0
        b_slot = tl.maximum(b_id, 0).to(tl.int32)
        if FLAT_SLOTS:
            o_k = b_slot.to(tl.int64) * stride_cache_t
        else:
            o_k = (b_slot // block_size).to(tl.int64) * stride_cache_b \
                + (b_slot % block_size).to(tl.int64) * stride_cache_t
    return o_k, m_n, o_n


@triton.jit
def _key_tile(cache_ptr, o_k, m_n, o_v, o_w, o_r, VALUE_SPLITS: tl.constexpr):
    """The stored key pieces of one tile, unconverted: the owned value columns, the other
    half's (scores only; with one value split, a copy of the owned piece that is never read)
    and the 64 rope columns. Issued together, so their memory latencies overlap."""
    p_k = cache_ptr + o_k[:, None]
    b_k_own = tl.load(p_k + o_v[None, :], mask=m_n[:, None], other=0.0)
    if VALUE_SPLITS == 2:
        b_k_other = tl.load(p_k + o_w[None, :], mask=m_n[:, None], other=0.0)
    else:
        b_k_other = b_k_own
    b_k_rope = tl.load(p_k + o_r[None, :], mask=m_n[:, None], other=0.0)
    return b_k_own, b_k_other, b_k_rope


@triton.jit
def _operand(x, FP16_OPERANDS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """x as a product operand: rounded to FP16 first when FP16_OPERANDS (FP8 e4m3 values and
    softmax probabilities; DOT_DTYPE is FP16 then, or FP32 under the interpreter)."""
    if FP16_OPERANDS:
        return x.to(tl.float16).to(DOT_DTYPE)
    return x.to(DOT_DTYPE)


@triton.jit
def sparse_mla_kernel(
    # pointers
    q_ptr, cache_ptr, slots_ptr, block_table_ptr, row_request_ptr, row_position_ptr,
    out_ptr, lse_ptr,
    q_unscale_ptr,  # [Nq, H] fp32 2^-e of FP16 queries scaled by 2^e; read with FP16_OPERANDS
    scratch_ptr,  # [programs, 2, BLOCK_M, BLOCK_N + 1] fp32, read only with SCORES_VIA_MEMORY
    # sizes
    num_rows, num_heads, num_selected, block_size, keys_per_split, num_head_blocks,
    score_scale_log2, value_scale,
    # strides (elements)
    stride_q_row, stride_q_head, stride_cache_b, stride_cache_t,
    stride_slots_row, stride_table_r,
    stride_out_row, stride_out_head, stride_out_split,
    stride_lse_row, stride_lse_head,
    # meta-parameters
    IS_DENSE: tl.constexpr,  # keys = causal positions of the rows' request (dense_mla)
    ROWS_PER_PROGRAM: tl.constexpr,  # rows sharing one key stream (dense: one request)
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    # Programs per query block, each owning 512 / VALUE_SPLITS value columns (1 or 2): each
    # recomputes the full 576-wide scores, for an accumulator half as large.
    VALUE_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # bf16 (bf16 / fp8 inputs) or fp32 (fp32 inputs, interpreter)
    # Hand the probabilities and the rescale factors to the value product through memory:
    # Triton then lays out the score product on its own (the two warpgroups of 8 warps split
    # its keys) instead of the flash-attention layout that runs it on both over the same rows.
    SCORES_VIA_MEMORY: tl.constexpr,
    PREFETCH: tl.constexpr,  # 0 or 1: the next tile's key rows read during this one
    # FP16 products over an FP8 latent (e4m3 is exact in FP16, converted in one instruction
    # per two values where BF16 takes three), the queries scaled into FP16's range.
    FP16_OPERANDS: tl.constexpr,
    # The cache's blocks lie back to back (stride_cache_b = block_size x stride_cache_t): a
    # slot's row offset is slot x stride_cache_t, with no division on the gather's path.
    FLAT_SLOTS: tl.constexpr,
):
    i_program = tl.program_id(0)
    i_split = tl.program_id(1)
    if VALUE_SPLITS == 1:
        i_value = 0  # a constant: the column offsets stay provably aligned
        i_group_head = i_program
    else:
        # The value halves of one query block are neighbours: their key reads meet in L2.
        i_value = i_program % VALUE_SPLITS
        i_group_head = i_program // VALUE_SPLITS
    i_group = i_group_head // num_head_blocks
    i_h = i_group_head % num_head_blocks
    BLOCK_M: tl.constexpr = ROWS_PER_PROGRAM * BLOCK_H
    BLOCK_V: tl.constexpr = 512 // VALUE_SPLITS
    # Query vector m is head (i_h * BLOCK_H + m % BLOCK_H) of row (first + m // BLOCK_H).
    o_m = tl.arange(0, BLOCK_M)
    i_first_row = i_group * ROWS_PER_PROGRAM
    o_row = (i_first_row + o_m // BLOCK_H).to(tl.int64)
    o_h = i_h * BLOCK_H + o_m % BLOCK_H
    m_m = (o_row < num_rows) & (o_h < num_heads)
    o_v = i_value * BLOCK_V + tl.arange(0, BLOCK_V)  # the value columns this program owns
    o_r = 512 + tl.arange(0, 64)
    p_q = q_ptr + o_row[:, None] * stride_q_row + o_h[:, None] * stride_q_head
    b_q_own = tl.load(p_q + o_v[None, :], mask=m_m[:, None], other=0.0)
    b_q_rope = tl.load(p_q + o_r[None, :], mask=m_m[:, None], other=0.0)
    o_w = (1 - i_value) * BLOCK_V + tl.arange(0, BLOCK_V)  # the other half: scores only
    if VALUE_SPLITS == 2:
        b_q_other = tl.load(p_q + o_w[None, :], mask=m_m[:, None], other=0.0)
    else:
        b_q_other = b_q_own
    if FP16_OPERANDS:
        # FP16 queries scaled by 2^e per vector (mla_fp16_query); the scores are scaled back.
        b_q_unscale = tl.load(q_unscale_ptr + o_row * num_heads + o_h, mask=m_m, other=1.0)
        b_score_scale = (score_scale_log2 * b_q_unscale)[:, None]
    else:
        b_score_scale = score_scale_log2
    b_q_own = b_q_own.to(DOT_DTYPE)
    b_q_other = b_q_other.to(DOT_DTYPE)
    b_q_rope = b_q_rope.to(DOT_DTYPE)

    request = 0
    if IS_DENSE:
        request = tl.load(row_request_ptr + i_first_row).to(tl.int64)
        # Causal: vector m sees keys 0..position of its row; the program walks to the last.
        b_position = tl.load(row_position_ptr + o_row, mask=m_m, other=-1).to(tl.int32)
        num_keys = tl.max(b_position, axis=0) + 1
    else:
        num_keys = num_selected
    start = i_split * keys_per_split
    end = tl.minimum(start + keys_per_split, num_keys)

    b_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    b_sum = tl.zeros((BLOCK_M,), tl.float32)
    b_acc = tl.zeros((BLOCK_M, BLOCK_V), tl.float32)
    if SCORES_VIA_MEMORY:
        i_scratch = i_program * tl.num_programs(1) + i_split
        p_scratch = scratch_ptr + i_scratch.to(tl.int64) * (2 * BLOCK_M * (BLOCK_N + 1)) \
            + o_m * (BLOCK_N + 1)
        o_scratch_n = tl.arange(0, BLOCK_N)
    # PREFETCH 1: the next tile's slots (or blocks) load during this tile.
    b_id = _key_ids(slots_ptr, block_table_ptr, start, end, i_first_row, request, block_size,
                    stride_slots_row, stride_table_r, IS_DENSE, BLOCK_N)
    for tile in range(start, end, BLOCK_N):
        if PREFETCH == 0:
            b_id = _key_ids(slots_ptr, block_table_ptr, tile, end, i_first_row, request,
                            block_size, stride_slots_row, stride_table_r, IS_DENSE, BLOCK_N)
        else:
            b_id_next = _key_ids(slots_ptr, block_table_ptr, tile + BLOCK_N, end, i_first_row,
                                 request, block_size, stride_slots_row, stride_table_r,
                                 IS_DENSE, BLOCK_N)
        o_k, m_n, o_n = _key_rows(b_id, tile, end, block_size, stride_cache_b, stride_cache_t,
                                  IS_DENSE, BLOCK_N, FLAT_SLOTS)
        if PREFETCH == 1:
            b_k_own, b_k_other, b_k_rope = _key_tile(cache_ptr, o_k, m_n, o_v, o_w, o_r,
                                                     VALUE_SPLITS)
        else:
            # Without PREFETCH the other half's keys load after the owned half's product.
            p_k = cache_ptr + o_k[:, None]
            b_k_own = tl.load(p_k + o_v[None, :], mask=m_n[:, None], other=0.0)
            b_k_rope = tl.load(p_k + o_r[None, :], mask=m_n[:, None], other=0.0)
        b_k_own_op = _operand(b_k_own, FP16_OPERANDS, DOT_DTYPE)
        b_s = tl.dot(b_q_own, tl.trans(b_k_own_op), input_precision="ieee")
        if VALUE_SPLITS == 2:
            if PREFETCH == 0:
                b_k_other = tl.load(p_k + o_w[None, :], mask=m_n[:, None], other=0.0)
            b_s = tl.dot(b_q_other, tl.trans(_operand(b_k_other, FP16_OPERANDS, DOT_DTYPE)),
                         b_s, input_precision="ieee")
        b_k_rope_op = _operand(b_k_rope, FP16_OPERANDS, DOT_DTYPE)
        if SCORES_VIA_MEMORY:
            # Scaled before the sum: Triton folds dot + add into one chained dot otherwise.
            b_s = b_s * b_score_scale + tl.dot(b_q_rope, tl.trans(b_k_rope_op),
                                               input_precision="ieee") * b_score_scale
        else:
            b_s = tl.dot(b_q_rope, tl.trans(b_k_rope_op), b_s, input_precision="ieee")
            b_s = b_s * b_score_scale
        if IS_DENSE and ROWS_PER_PROGRAM > 1:
            m_s = m_n[None, :] & (o_n[None, :] <= b_position[:, None])
        else:
            m_s = m_n[None, :]
        b_s = tl.where(m_s, b_s, float("-inf"))
        # Online softmax in base 2; a vector whose keys are all masked so far shifts by 0.
        b_new_max = tl.maximum(b_max, tl.max(b_s, axis=1))
        b_shift = tl.where(b_new_max == float("-inf"), 0.0, b_new_max)
        b_alpha = tl.exp2(b_max - b_shift)
        b_p = tl.exp2(b_s - b_shift[:, None])
        b_sum = b_sum * b_alpha + tl.sum(b_p, axis=1)
        if SCORES_VIA_MEMORY:
            # Two buffers by tile parity: a tile's stores never meet the previous tile's loads.
            # Column BLOCK_N holds alpha. The barrier makes the stores visible to the CTA.
            p_tile = p_scratch + ((tile - start) // BLOCK_N % 2) * (BLOCK_M * (BLOCK_N + 1))
            tl.store(p_tile[:, None] + o_scratch_n[None, :], b_p)
            tl.store(p_tile + BLOCK_N, b_alpha)
            tl.debug_barrier()
            b_p = tl.load(p_tile[:, None] + o_scratch_n[None, :])
            b_alpha = tl.load(p_tile + BLOCK_N)
        b_acc = b_acc * b_alpha[:, None]
        b_acc = tl.dot(_operand(b_p, FP16_OPERANDS, DOT_DTYPE), b_k_own_op, b_acc,
                       input_precision="ieee")
        b_max = b_new_max
        if PREFETCH == 1:
            b_id = b_id_next

    # Normalized (partial) output and natural lse; no valid key: 0 and -inf.
    b_has_keys = b_sum > 0
    b_out = b_acc * (value_scale / tl.where(b_has_keys, b_sum, 1.0))[:, None]
    p_out = out_ptr + o_row[:, None] * stride_out_row + i_split * stride_out_split
    tl.store(p_out + o_h[:, None] * stride_out_head + o_v[None, :], b_out, mask=m_m[:, None])
    b_lse = tl.where(b_has_keys, (b_max + tl.log2(tl.where(b_has_keys, b_sum, 1.0)))
                     * 0.6931471805599453, float("-inf"))  # x ln 2: natural log
    m_lse = m_m & ((o_m * 0 + i_value) == 0)  # the value halves hold the same lse
    tl.store(lse_ptr + o_row * stride_lse_row + o_h * stride_lse_head + i_split, b_lse,
             mask=m_lse)
