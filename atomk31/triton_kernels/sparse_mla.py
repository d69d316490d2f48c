"""sparse_mla in Triton: absorbed MLA attention of query rows over their own latent-cache rows.

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

Numbers: with bf16 queries and a bf16 or fp8 latent the products are bf16 (fp8 e4m3 is
exact in bf16) with fp32 accumulation, and the probabilities are rounded to bf16 for the
second product; the latent scale is applied once to the scores and once to the output, never
per element. With a float32 query or latent every product is float32 (ieee), as it is under
the interpreter (whose bf16 dot is wrong).
"""

import math

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.mla_combine import mla_combine
from atomk31.triton_kernels.mla_tiles import MlaTiles, choose_tiles
from atomk31.triton_kernels.runtime import runs_on_interpreter

LATENT_DIM = 576
VALUE_DIM = 512
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
LOG2_E = 1.0 / math.log(2.0)


@triton.jit
def _key_rows(
    slots_ptr, block_table_ptr, tile, end, i_first_row, request, block_size,
    stride_cache_b, stride_cache_t, stride_slots_row, stride_table_r,
    IS_DENSE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Keys tile..tile + BLOCK_N - 1 (before `end`): element offsets of their cache rows, the
    valid-key mask and the key indices (causal positions)."""
    o_n = tile + tl.arange(0, BLOCK_N)
    m_n = o_n < end
    if IS_DENSE:
        b_block = tl.load(block_table_ptr + request * stride_table_r + o_n // block_size,
                          mask=m_n, other=0).to(tl.int64)
        b_offset = (o_n % block_size).to(tl.int64)
    else:
        b_slot = tl.load(slots_ptr + i_first_row.to(tl.int64) * stride_slots_row + o_n,
                         mask=m_n, other=-1)
        m_n = b_slot >= 0
        b_slot = tl.maximum(b_slot, 0).to(tl.int64)
        b_block = b_slot // block_size
        b_offset = b_slot % block_size
    return b_block * stride_cache_b + b_offset * stride_cache_t, m_n, o_n


@triton.jit
def sparse_mla_kernel(
    # pointers
    q_ptr, cache_ptr, slots_ptr, block_table_ptr, row_request_ptr, row_position_ptr,
    out_ptr, lse_ptr,
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
    b_q_own = tl.load(p_q + o_v[None, :], mask=m_m[:, None], other=0.0).to(DOT_DTYPE)
    b_q_rope = tl.load(p_q + o_r[None, :], mask=m_m[:, None], other=0.0).to(DOT_DTYPE)
    if VALUE_SPLITS == 2:
        o_w = (1 - i_value) * BLOCK_V + tl.arange(0, BLOCK_V)  # the other half: scores only
        b_q_other = tl.load(p_q + o_w[None, :], mask=m_m[:, None], other=0.0).to(DOT_DTYPE)

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
    for tile in range(start, end, BLOCK_N):
        o_k, m_n, o_n = _key_rows(
            slots_ptr, block_table_ptr, tile, end, i_first_row, request, block_size,
            stride_cache_b, stride_cache_t, stride_slots_row, stride_table_r, IS_DENSE, BLOCK_N)
        p_k = cache_ptr + o_k[:, None]
        b_k_own = tl.load(p_k + o_v[None, :], mask=m_n[:, None], other=0.0).to(DOT_DTYPE)
        b_k_rope = tl.load(p_k + o_r[None, :], mask=m_n[:, None], other=0.0).to(DOT_DTYPE)
        b_s = tl.dot(b_q_own, tl.trans(b_k_own), input_precision="ieee")
        if VALUE_SPLITS == 2:
            b_k_other = tl.load(p_k + o_w[None, :], mask=m_n[:, None], other=0.0)
            b_s = tl.dot(b_q_other, tl.trans(b_k_other.to(DOT_DTYPE)), b_s,
                         input_precision="ieee")
        if SCORES_VIA_MEMORY:
            # Scaled before the sum: Triton folds dot + add into one chained dot otherwise.
            b_s = b_s * score_scale_log2 + tl.dot(b_q_rope, tl.trans(b_k_rope),
                                                  input_precision="ieee") * score_scale_log2
        else:
            b_s = tl.dot(b_q_rope, tl.trans(b_k_rope), b_s, input_precision="ieee")
            b_s = b_s * score_scale_log2
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
        b_acc = tl.dot(b_p.to(DOT_DTYPE), b_k_own, b_acc, input_precision="ieee")
        b_max = b_new_max

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


def check_latent_cache_layout(latent_cache: torch.Tensor) -> None:
    """Raise ValueError unless latent_cache is [num_blocks, block_size, 576], last dim dense."""
    if latent_cache.dim() != 3 or latent_cache.shape[-1] != LATENT_DIM \
            or latent_cache.stride(-1) != 1:
        raise ValueError(
            f"latent_cache must be [num_blocks, block_size, {LATENT_DIM}] with a contiguous "
            f"last dim, got shape {list(latent_cache.shape)} strides {latent_cache.stride()}")


def product_dtype(q: torch.Tensor, latent_cache: torch.Tensor) -> torch.dtype:
    """bf16 products for bf16 queries over a bf16 / fp8 latent; float32 (ieee) when either
    side is float32 (the engine's float32 mode equals the float32 oracle) or interpreted."""
    if runs_on_interpreter(sparse_mla_kernel) or q.dtype == torch.float32 \
            or latent_cache.dtype == torch.float32:
        return torch.float32
    return torch.bfloat16


def choose_mla_tiles(q: torch.Tensor, latent_cache: torch.Tensor, num_groups: int,
                     max_keys: int, rows_per_program: int, **knobs: object) -> MlaTiles:
    """`choose_tiles` for these inputs; knobs: the launcher's tuning arguments (None: choose)."""
    return choose_tiles(q, product_dtype(q, latent_cache) == torch.float32,
                        runs_on_interpreter(sparse_mla_kernel), num_groups, max_keys,
                        rows_per_program, **knobs)


def launch_mla(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    softmax_scale: float,
    slots: torch.Tensor | None,
    block_table: torch.Tensor | None,
    row_request: torch.Tensor | None,
    row_position: torch.Tensor | None,
    max_keys: int,
    tiles: MlaTiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `sparse_mla_kernel` (over `slots`, or dense over the block table when slots is
    None) with `tiles`, then merge the splits; returns out [Nq, H, 512], lse [Nq, H]."""
    num_rows, num_heads, _ = q.shape
    device = q.device
    out = torch.empty(num_rows, num_heads, VALUE_DIM, dtype=torch.float32, device=device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    if q.stride(-1) != 1:
        q = q.contiguous()
    num_key_tiles = max(1, triton.cdiv(max_keys, tiles.block_n))
    keys_per_split = triton.cdiv(num_key_tiles, tiles.num_splits) * tiles.block_n
    num_splits = max(1, triton.cdiv(max_keys, keys_per_split))
    if num_splits == 1:
        partial_out, partial_lse = out[:, :, None, :], lse[:, :, None]
    else:
        partial_out = torch.empty(num_rows, num_heads, num_splits, VALUE_DIM,
                                  dtype=torch.float32, device=device)
        partial_lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32,
                                  device=device)
    is_dense = slots is None
    scale = latent_scale if latent_cache.dtype in FP8_DTYPES else 1.0
    dot_dtype = product_dtype(q, latent_cache)
    num_head_blocks = triton.cdiv(num_heads, tiles.block_h)
    num_groups = triton.cdiv(num_rows, tiles.rows_per_program)
    dummy = out  # placeholder for pointers the constexpr branch never reads
    num_programs = num_groups * num_head_blocks * tiles.value_splits * num_splits
    scratch = dummy
    if tiles.scores_via_memory:
        block_m = tiles.block_h * tiles.rows_per_program
        scratch = torch.empty(num_programs * 2 * block_m * (tiles.block_n + 1),
                              dtype=torch.float32, device=device)
    sparse_mla_kernel[(num_groups * num_head_blocks * tiles.value_splits, num_splits)](
        q, latent_cache,
        dummy if is_dense else slots,
        block_table if is_dense else dummy,
        row_request if is_dense else dummy,
        row_position if is_dense else dummy,
        partial_out, partial_lse, scratch,
        num_rows, num_heads, 0 if is_dense else slots.shape[1], latent_cache.shape[1],
        keys_per_split, num_head_blocks, softmax_scale * scale * LOG2_E, scale,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        0 if is_dense else slots.stride(0), block_table.stride(0) if is_dense else 0,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        IS_DENSE=is_dense, ROWS_PER_PROGRAM=tiles.rows_per_program,
        BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n, VALUE_SPLITS=tiles.value_splits,
        DOT_DTYPE=tl.float32 if dot_dtype == torch.float32 else tl.bfloat16,
        SCORES_VIA_MEMORY=tiles.scores_via_memory,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if num_splits > 1:
        mla_combine(partial_out, partial_lse, out, lse)
    return out, lse


def sparse_mla_triton(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
    num_splits: int | None = None,
    block_h: int | None = None,
    block_n: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    scores_via_memory: bool | None = None,
    value_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.

    q [Nq, H, 576] absorbed queries, latent_cache [num_blocks, block_size, 576] (fp8 / bf16 /
    fp32, contiguous last dim), slots [Nq, k] int (-1 masked). Tuning knobs (None: chosen for
    the target, see mla_tiles.py): `num_splits` (key splits per row), `block_h` (heads per
    program), `block_n` (keys per step), `num_stages` (software pipelining), `num_warps`,
    `scores_via_memory` (probabilities through a scratch buffer, see SCORES_VIA_MEMORY; runs
    one stage) and `value_splits` (1 or 2 programs per query block, see VALUE_SPLITS).
    """
    check_latent_cache_layout(latent_cache)
    if slots.dim() != 2:
        raise ValueError(f"slots must be [Nq, k], got {list(slots.shape)}")
    num_rows = slots.shape[0]
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != LATENT_DIM:
        raise ValueError(f"q must be [Nq={num_rows}, H, {LATENT_DIM}] absorbed queries, got "
                         f"{list(q.shape)}")
    if slots.stride(-1) != 1:
        slots = slots.contiguous()
    tiles = choose_mla_tiles(q, latent_cache, num_rows, slots.shape[1], 1,
                             num_splits=num_splits, block_h=block_h, block_n=block_n,
                             num_warps=num_warps, num_stages=num_stages,
                             scores_via_memory=scores_via_memory, value_splits=value_splits)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, slots, None, None, None,
                      slots.shape[1], tiles)
