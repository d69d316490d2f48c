"""sparse_mla in Triton: absorbed MLA attention of query rows over their own latent-cache rows.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5 "Weight absorption", §4.6 "Effect on MLA"):
per query row, H heads of 576-wide absorbed queries attend to the row's selected cache rows
(576-wide keys [c 512 | k_r 64], 512-wide values c); returns out [Nq, H, 512] and the natural
log-sum-exp [Nq, H]. Decode (one row per request), verification rows and prefill rows all
run the same kernel: every row has its own selection.

A program owns BLOCK_M = ROWS_PER_PROGRAM x BLOCK_H query vectors (ROWS_PER_PROGRAM consecutive
rows, BLOCK_H heads of each) and one split of their keys. It gathers BLOCK_N key rows at a time
(each a contiguous 576-element row of the paged cache), scores them with two tensor-core
products ([BLOCK_M, 512] x [512, BLOCK_N] and the 64-wide lane) and keeps an online softmax
(exp2 with log2(e) folded into the scale) and a [BLOCK_M, 512] fp32 accumulator; with 8 warps
and BLOCK_M = 64 the Hopper layout gives each warpgroup 256 of the 512 value columns, as
FlashMLA does; but Triton then runs the score product on both warpgroups over the same 64 rows
(its layout for a dot feeding a dot), unless SCORES_VIA_MEMORY hands the probabilities over
through a scratch buffer (each warpgroup then takes half the keys: half the score products and
no spills in the sm_90 build; the barrier turns pipelining off, so PREFETCH_KEYS loads the next
key tile a step ahead). Both are off by default until the H200 benchmark decides. With several
splits (flash-decoding: they fill the multiprocessors when rows are few), each writes its
normalized partial output and lse, and `mla_combine` merges them exactly. `dense_mla` runs this
kernel with the keys taken from the block table (every causal slot 0..p); there the rows of one
program must share a request (verification rows), so their keys are read once for all of them
and 96 heads tile exactly (4 rows x 16 heads or 2 x 32 = 64 vectors) instead of padding 96 to
128.

Numbers: with bf16 queries and a bf16 or fp8 latent the products are bf16 (fp8 e4m3 is
exact in bf16) with fp32 accumulation, and the probabilities are rounded to bf16 for the
second product; the latent scale is applied once to the scores and once to the output, never
per element. With a float32 query or latent every product is float32 (ieee), as it is under
the interpreter (whose bf16 dot is wrong).
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from atomk31.triton_kernels.mla_combine import mla_combine
from atomk31.triton_kernels.runtime import runs_on_interpreter

LATENT_DIM = 576
VALUE_DIM = 512
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
LOG2_E = 1.0 / math.log(2.0)
MIN_TILES_PER_SPLIT = 4  # shorter splits cost more in partial writes and merging than they win


@triton.jit
def _load_key_tile(
    cache_ptr, slots_ptr, block_table_ptr, tile, end, i_first_row, request, block_size,
    stride_cache_b, stride_cache_t, stride_slots_row, stride_table_r,
    IS_DENSE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Key rows tile..tile + BLOCK_N - 1 (before `end`) as stored: [BLOCK_N, 512] latent,
    [BLOCK_N, 64] rope lane, the valid-key mask and the key indices (causal positions)."""
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
    p_k = cache_ptr + b_block * stride_cache_b + b_offset * stride_cache_t
    b_k_nope = tl.load(p_k[:, None] + tl.arange(0, 512)[None, :], mask=m_n[:, None], other=0.0)
    b_k_rope = tl.load(p_k[:, None] + 512 + tl.arange(0, 64)[None, :], mask=m_n[:, None],
                       other=0.0)
    return b_k_nope, b_k_rope, m_n, o_n


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
    DOT_DTYPE: tl.constexpr,  # bf16 (bf16 / fp8 inputs) or fp32 (fp32 inputs, interpreter)
    # Hand the probabilities and the rescale factors to the value product through memory:
    # Triton then lays out the score product on its own (the two warpgroups of 8 warps split
    # its keys) instead of the flash-attention layout that runs it on both over the same rows.
    SCORES_VIA_MEMORY: tl.constexpr,
    PREFETCH_KEYS: tl.constexpr,  # load the next key tile into registers one step ahead
):
    i_group_head = tl.program_id(0)
    i_split = tl.program_id(1)
    i_group = i_group_head // num_head_blocks
    i_h = i_group_head % num_head_blocks
    BLOCK_M: tl.constexpr = ROWS_PER_PROGRAM * BLOCK_H
    # Query vector m is head (i_h * BLOCK_H + m % BLOCK_H) of row (first + m // BLOCK_H).
    o_m = tl.arange(0, BLOCK_M)
    i_first_row = i_group * ROWS_PER_PROGRAM
    o_row = (i_first_row + o_m // BLOCK_H).to(tl.int64)
    o_h = i_h * BLOCK_H + o_m % BLOCK_H
    m_m = (o_row < num_rows) & (o_h < num_heads)
    o_c = tl.arange(0, 512)
    o_r = 512 + tl.arange(0, 64)
    p_q = q_ptr + o_row[:, None] * stride_q_row + o_h[:, None] * stride_q_head
    b_q_nope = tl.load(p_q + o_c[None, :], mask=m_m[:, None], other=0.0).to(DOT_DTYPE)
    b_q_rope = tl.load(p_q + o_r[None, :], mask=m_m[:, None], other=0.0).to(DOT_DTYPE)

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
    b_acc = tl.zeros((BLOCK_M, 512), tl.float32)
    if SCORES_VIA_MEMORY:
        i_program = i_group_head * tl.num_programs(1) + i_split
        p_scratch = scratch_ptr + i_program.to(tl.int64) * (2 * BLOCK_M * (BLOCK_N + 1)) \
            + o_m * (BLOCK_N + 1)
        o_scratch_n = tl.arange(0, BLOCK_N)
    if PREFETCH_KEYS:
        b_next_nope, b_next_rope, m_next, o_next = _load_key_tile(
            cache_ptr, slots_ptr, block_table_ptr, start, end, i_first_row, request, block_size,
            stride_cache_b, stride_cache_t, stride_slots_row, stride_table_r, IS_DENSE, BLOCK_N)
    for tile in range(start, end, BLOCK_N):
        if PREFETCH_KEYS:
            # Registers hold the next tile while this one is multiplied: the gather's latency
            # hides behind a tile of products without the pipeliner (which the barrier of
            # SCORES_VIA_MEMORY turns off).
            b_k_nope, b_k_rope, m_n, o_n = b_next_nope, b_next_rope, m_next, o_next
            b_next_nope, b_next_rope, m_next, o_next = _load_key_tile(
                cache_ptr, slots_ptr, block_table_ptr, tile + BLOCK_N, end, i_first_row,
                request, block_size, stride_cache_b, stride_cache_t, stride_slots_row,
                stride_table_r, IS_DENSE, BLOCK_N)
        else:
            b_k_nope, b_k_rope, m_n, o_n = _load_key_tile(
                cache_ptr, slots_ptr, block_table_ptr, tile, end, i_first_row, request,
                block_size, stride_cache_b, stride_cache_t, stride_slots_row, stride_table_r,
                IS_DENSE, BLOCK_N)
        b_k_nope = b_k_nope.to(DOT_DTYPE)
        b_k_rope = b_k_rope.to(DOT_DTYPE)
        b_s = tl.dot(b_q_nope, tl.trans(b_k_nope), input_precision="ieee")
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
        b_acc = tl.dot(b_p.to(DOT_DTYPE), b_k_nope, b_acc, input_precision="ieee")
        b_max = b_new_max

    # Normalized (partial) output and natural lse; no valid key: 0 and -inf.
    b_has_keys = b_sum > 0
    b_out = b_acc * (value_scale / tl.where(b_has_keys, b_sum, 1.0))[:, None]
    b_lse = tl.where(b_has_keys, (b_max + tl.log2(tl.where(b_has_keys, b_sum, 1.0)))
                     * 0.6931471805599453, float("-inf"))  # x ln 2: natural log
    p_out = out_ptr + o_row[:, None] * stride_out_row + i_split * stride_out_split
    tl.store(p_out + o_h[:, None] * stride_out_head + o_c[None, :], b_out, mask=m_m[:, None])
    tl.store(lse_ptr + o_row * stride_lse_row + o_h * stride_lse_head + i_split, b_lse,
             mask=m_m)


@dataclass(frozen=True)
class MlaTiles:
    """How `sparse_mla_kernel` tiles the work: one program = rows_per_program x block_h query
    vectors over one of num_splits key ranges, block_n keys per step."""

    block_h: int
    block_n: int
    rows_per_program: int
    num_splits: int
    num_warps: int
    num_stages: int
    scores_via_memory: bool = False
    prefetch_keys: bool = False


def choose_tiles(
    q: torch.Tensor,
    dot_dtype: torch.dtype,
    num_groups: int,
    max_keys: int,
    rows_per_program: int,
    num_splits: int | None,
    block_h: int | None,
    block_n: int | None,
    num_warps: int | None,
    num_stages: int | None,
    scores_via_memory: bool = False,
    prefetch_keys: bool = False,
) -> MlaTiles:
    """The tile configuration: what the caller fixed, the rest chosen for the target."""
    num_heads = q.shape[1]
    is_interpreter = runs_on_interpreter(sparse_mla_kernel)
    is_hip = not is_interpreter and driver.active.get_current_target().backend == "hip"
    is_fp32 = dot_dtype == torch.float32
    if block_h is None:
        # 64 query vectors per program: the smallest Hopper warpgroup product (wgmma M = 64).
        # AMD keeps both dot operands in registers (no shared-memory operand), and float32
        # products run on FMA units with register operands: smaller tiles there. On gfx942 /
        # gfx950, 16 vectors x 16 keys x 8 warps is the largest tile that compiles without
        # spills within two waves per SIMD (tests/amd_compile; 32 x 16 spills on gfx942).
        block_m = 16 if is_interpreter or is_fp32 or is_hip else 64
        block_h = block_m // rows_per_program
    # tl.dot needs at least 16 query vectors per program.
    block_h = max(min(block_h, triton.next_power_of_2(num_heads)), 16 // rows_per_program)
    num_head_blocks = triton.cdiv(num_heads, block_h)
    num_programs = num_groups * num_head_blocks
    if block_n is None:
        # Measured on an H200 (benchmarks/kernels/bench_sparse_mla.py): 64 keys per step win
        # with many programs, 32 with few (more splits, shorter chains).
        is_busy = block_h * rows_per_program >= 64 and num_programs >= 64
        block_n = 16 if is_interpreter or is_fp32 or is_hip else 64 if is_busy else 32
    if num_warps is None:
        num_warps = 8
    if num_stages is None:
        num_stages = 1 if is_interpreter or is_fp32 or is_hip else 2
    if scores_via_memory:
        num_stages = 1  # a pipelined scratch load would run ahead of the tile's stores
    num_key_tiles = max(1, triton.cdiv(max_keys, block_n))
    if num_splits is None:
        max_splits = triton.cdiv(num_key_tiles, MIN_TILES_PER_SPLIT)
        num_sms = 1 if is_interpreter else _num_sms(q.device)
        num_splits = fewest_splits_filling_waves(num_programs, num_sms, max_splits)
    num_splits = max(1, min(num_splits, num_key_tiles))
    return MlaTiles(block_h, block_n, rows_per_program, num_splits, num_warps, num_stages,
                    scores_via_memory, prefetch_keys)


def fewest_splits_filling_waves(num_programs: int, num_sms: int, max_splits: int) -> int:
    """Key splits per program: the fewest (each costs a partial write and the merge) whose
    waves of programs (one program fills a multiprocessor) keep >= 85% of them busy, else
    the best filling one up to max_splits."""
    def busy_fraction(splits: int) -> float:
        num_waves = triton.cdiv(num_programs * splits, num_sms)
        return num_programs * splits / (num_waves * num_sms)

    if num_programs == 0:
        return 1
    candidates = range(1, max(1, max_splits) + 1)
    good = [s for s in candidates if busy_fraction(s) >= 0.85]
    return good[0] if good else max(candidates, key=busy_fraction)


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
    num_programs = num_groups * num_head_blocks * num_splits
    scratch = dummy
    if tiles.scores_via_memory:
        block_m = tiles.block_h * tiles.rows_per_program
        scratch = torch.empty(num_programs * 2 * block_m * (tiles.block_n + 1),
                              dtype=torch.float32, device=device)
    sparse_mla_kernel[(num_groups * num_head_blocks, num_splits)](
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
        BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n,
        DOT_DTYPE=tl.float32 if dot_dtype == torch.float32 else tl.bfloat16,
        SCORES_VIA_MEMORY=tiles.scores_via_memory, PREFETCH_KEYS=tiles.prefetch_keys,
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
    scores_via_memory: bool = False,
    prefetch_keys: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.

    q [Nq, H, 576] absorbed queries, latent_cache [num_blocks, block_size, 576] (fp8 / bf16 /
    fp32, contiguous last dim), slots [Nq, k] int (-1 masked). Tuning knobs (None: chosen for
    the target): `num_splits` (key splits per row, default at most one wave of programs),
    `block_h` (heads per program), `block_n` (keys per step), `num_stages` (software
    pipelining), `num_warps` and `scores_via_memory` (probabilities through a scratch
    buffer, see SCORES_VIA_MEMORY; runs one stage) and `prefetch_keys` (the next key tile
    loaded into registers one step ahead).
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
    tiles = choose_tiles(q, product_dtype(q, latent_cache), num_rows, slots.shape[1], 1,
                         num_splits, block_h, block_n, num_warps, num_stages,
                         scores_via_memory, prefetch_keys)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, slots, None, None, None,
                      slots.shape[1], tiles)


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
