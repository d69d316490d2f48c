"""sparse_mla in Triton: absorbed MLA attention of query rows over their own latent-cache rows.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5 "Weight absorption", §4.6 "Effect on MLA"):
per query row, H heads of 576-wide absorbed queries attend to the row's selected cache rows
(576-wide keys [c 512 | k_r 64], 512-wide values c); returns out [Nq, H, 512] and the natural
log-sum-exp [Nq, H]. Decode (one row per request), verification rows and prefill rows all
run the same kernel: every row has its own selection.

A program owns one query row, BLOCK_H heads and one split of the row's keys. It gathers
BLOCK_N selected rows at a time (each a contiguous 576-element row of the paged cache),
scores them with two tensor-core products ([BLOCK_H, 512] x [512, BLOCK_N] and the 64-wide
lane) and keeps an online softmax (exp2 with log2(e) folded into the scale) and a
[BLOCK_H, 512] fp32 accumulator. With several splits, each writes its normalized partial
output and lse and `mla_combine_kernel` merges them exactly (the same rule that merges DCP
ranks). `dense_mla` runs this kernel with the slots taken from the block table instead:
every causal slot 0..p of the row's request.

Numbers: keys and values are cast to bf16 for the products (fp8 e4m3 is exact in bf16; a
bf16 query is exact too) with fp32 accumulation; the probabilities are rounded to bf16 for
the second product. The latent scale is folded into the score scale and the output. Under
the interpreter the products run in fp32 (its bf16 dot is wrong).
"""

import math

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import runs_on_interpreter

LATENT_DIM = 576
VALUE_DIM = 512
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
LOG2_E = 1.0 / math.log(2.0)


@triton.jit
def sparse_mla_kernel(
    # pointers
    q_ptr, cache_ptr, slots_ptr, block_table_ptr, row_request_ptr, row_position_ptr,
    out_ptr, lse_ptr,
    # sizes
    num_heads, num_selected, block_size, keys_per_split, num_head_blocks,
    score_scale_log2, value_scale,
    # strides (elements)
    stride_q_row, stride_q_head, stride_cache_b, stride_cache_t,
    stride_slots_row, stride_table_r,
    stride_out_row, stride_out_head, stride_out_split,
    stride_lse_row, stride_lse_head,
    # meta-parameters
    IS_DENSE: tl.constexpr,  # slots = causal positions of the row's request (dense_mla)
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    i_row_head = tl.program_id(0)
    i_split = tl.program_id(1)
    i_row = i_row_head // num_head_blocks
    i_h = i_row_head % num_head_blocks
    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < num_heads
    o_c = tl.arange(0, 512)
    o_r = 512 + tl.arange(0, 64)
    p_q = q_ptr + i_row.to(tl.int64) * stride_q_row + o_h[:, None] * stride_q_head
    b_q_nope = tl.load(p_q + o_c[None, :], mask=m_h[:, None], other=0.0).to(DOT_DTYPE)
    b_q_rope = tl.load(p_q + o_r[None, :], mask=m_h[:, None], other=0.0).to(DOT_DTYPE)

    if IS_DENSE:
        request = tl.load(row_request_ptr + i_row).to(tl.int64)
        num_keys = tl.load(row_position_ptr + i_row).to(tl.int32) + 1
    else:
        num_keys = num_selected
    start = i_split * keys_per_split
    end = tl.minimum(start + keys_per_split, num_keys)

    b_max = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    b_sum = tl.zeros((BLOCK_H,), tl.float32)
    b_acc = tl.zeros((BLOCK_H, 512), tl.float32)
    for tile in range(start, end, BLOCK_N):
        o_n = tile + tl.arange(0, BLOCK_N)
        m_n = o_n < end
        if IS_DENSE:
            b_block = tl.load(block_table_ptr + request * stride_table_r + o_n // block_size,
                              mask=m_n, other=0).to(tl.int64)
            b_offset = (o_n % block_size).to(tl.int64)
        else:
            b_slot = tl.load(slots_ptr + i_row.to(tl.int64) * stride_slots_row + o_n,
                             mask=m_n, other=-1)
            m_n = b_slot >= 0
            b_slot = tl.maximum(b_slot, 0).to(tl.int64)
            b_block = b_slot // block_size
            b_offset = b_slot % block_size
        p_k = cache_ptr + b_block * stride_cache_b + b_offset * stride_cache_t
        b_k_nope = tl.load(p_k[:, None] + o_c[None, :], mask=m_n[:, None], other=0.0)
        b_k_nope = b_k_nope.to(DOT_DTYPE)
        b_k_rope = tl.load(p_k[:, None] + o_r[None, :], mask=m_n[:, None], other=0.0)
        b_k_rope = b_k_rope.to(DOT_DTYPE)
        b_s = tl.dot(b_q_nope, tl.trans(b_k_nope), input_precision="ieee")
        b_s = tl.dot(b_q_rope, tl.trans(b_k_rope), b_s, input_precision="ieee")
        b_s = tl.where(m_n[None, :], b_s * score_scale_log2, float("-inf"))
        # Online softmax in base 2; a row whose keys are all masked so far shifts by 0.
        b_new_max = tl.maximum(b_max, tl.max(b_s, axis=1))
        b_shift = tl.where(b_new_max == float("-inf"), 0.0, b_new_max)
        b_alpha = tl.exp2(b_max - b_shift)
        b_p = tl.exp2(b_s - b_shift[:, None])
        b_sum = b_sum * b_alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * b_alpha[:, None]
        b_acc = tl.dot(b_p.to(DOT_DTYPE), b_k_nope, b_acc, input_precision="ieee")
        b_max = b_new_max

    # Normalized (partial) output and natural lse; no valid key: 0 and -inf.
    b_has_keys = b_sum > 0
    b_out = b_acc * (value_scale / tl.where(b_has_keys, b_sum, 1.0))[:, None]
    b_lse = tl.where(b_has_keys, (b_max + tl.log2(tl.where(b_has_keys, b_sum, 1.0)))
                     * 0.6931471805599453, float("-inf"))  # x ln 2: natural log
    p_out = out_ptr + i_row.to(tl.int64) * stride_out_row + i_split * stride_out_split
    tl.store(p_out + o_h[:, None] * stride_out_head + o_c[None, :], b_out, mask=m_h[:, None])
    tl.store(lse_ptr + i_row.to(tl.int64) * stride_lse_row + o_h * stride_lse_head
             + i_split, b_lse, mask=m_h)


@triton.jit
def mla_combine_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr, lse_ptr,
    num_splits,
    stride_partial_row, stride_partial_head, stride_partial_split,
    stride_plse_row, stride_plse_head,
    stride_out_row, stride_out_head, stride_lse_row,
    SPLITS_PAD: tl.constexpr,
):
    """out = sum_j exp(lse_j - lse) out_j, lse = log sum_j exp(lse_j): one (row, head)."""
    i_row = tl.program_id(0).to(tl.int64)
    i_head = tl.program_id(1)
    o_j = tl.arange(0, SPLITS_PAD)
    m_j = o_j < num_splits
    o_c = tl.arange(0, 512)
    b_lse = tl.load(partial_lse_ptr + i_row * stride_plse_row + i_head * stride_plse_head + o_j,
                    mask=m_j, other=float("-inf"))
    b_max = tl.max(b_lse, axis=0)
    b_shift = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_weight = tl.exp(b_lse - b_shift)
    b_total = tl.sum(b_weight, axis=0)
    b_parts = tl.load(partial_out_ptr + i_row * stride_partial_row
                      + i_head * stride_partial_head + o_j[:, None] * stride_partial_split
                      + o_c[None, :], mask=m_j[:, None], other=0.0)
    b_out = tl.sum(b_parts * b_weight[:, None], axis=0) / tl.where(b_total > 0, b_total, 1.0)
    tl.store(out_ptr + i_row * stride_out_row + i_head * stride_out_head + o_c, b_out)
    tl.store(lse_ptr + i_row * stride_lse_row + i_head,
             tl.where(b_total > 0, b_shift + tl.log(tl.where(b_total > 0, b_total, 1.0)),
                      float("-inf")))


def check_latent_cache_layout(latent_cache: torch.Tensor) -> None:
    """Raise ValueError unless latent_cache is [num_blocks, block_size, 576], last dim dense."""
    if latent_cache.dim() != 3 or latent_cache.shape[-1] != LATENT_DIM \
            or latent_cache.stride(-1) != 1:
        raise ValueError(
            f"latent_cache must be [num_blocks, block_size, {LATENT_DIM}] with a contiguous "
            f"last dim, got shape {list(latent_cache.shape)} strides {latent_cache.stride()}")


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
    num_splits: int | None,
    block_h: int | None,
    block_n: int | None = None,
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `sparse_mla_kernel` (over `slots`, or dense over the block table when slots is
    None) with `num_splits` key splits and the combine; returns out [Nq, H, 512], lse [Nq, H]."""
    num_rows, num_heads, _ = q.shape
    device = q.device
    out = torch.empty(num_rows, num_heads, VALUE_DIM, dtype=torch.float32, device=device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    if q.stride(-1) != 1:
        q = q.contiguous()
    # Triton's interpreter (TRITON_INTERPRET=1 at import) runs fp32 products (its bf16 dot
    # is wrong) on small tiles; a compile-only driver still gets the GPU configuration.
    is_interpreter = runs_on_interpreter(sparse_mla_kernel)
    if block_h is None:
        block_h = 16 if is_interpreter else 64
    block_h = max(16, min(block_h, triton.next_power_of_2(num_heads)))
    num_head_blocks = triton.cdiv(num_heads, block_h)
    if block_n is None:
        # Measured on an H200 (benchmarks/kernels/bench_sparse_mla.py): 64 keys per step win
        # with many (row, head-block) programs, 32 with few (more splits, shorter chains).
        is_busy = block_h >= 64 and num_rows * num_head_blocks >= 64
        block_n = 16 if is_interpreter else 64 if is_busy else 32
    num_key_tiles = max(1, triton.cdiv(max_keys, block_n))
    if num_splits is None:
        # At most one wave of programs over the multiprocessors (one program fills one),
        # each with at least 4 key tiles; the split partials cost a combine pass.
        num_sms = 1 if is_interpreter else _num_sms(device)
        num_splits = num_sms // (num_rows * num_head_blocks)
    num_splits = max(1, min(num_splits, triton.cdiv(num_key_tiles, 4) if not is_interpreter
                            else num_key_tiles))
    keys_per_split = triton.cdiv(num_key_tiles, num_splits) * block_n
    num_splits = max(1, triton.cdiv(max_keys, keys_per_split))

    if num_splits == 1:
        partial_out, partial_lse = out[:, :, None, :], lse[:, :, None]
    else:
        partial_out = torch.empty(num_rows, num_heads, num_splits, VALUE_DIM,
                                  dtype=torch.float32, device=device)
        partial_lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32,
                                  device=device)
    is_dense = slots is None
    is_fp8 = latent_cache.dtype in FP8_DTYPES
    scale = latent_scale if is_fp8 else 1.0
    dummy = out  # placeholder for pointers the constexpr branch never reads
    sparse_mla_kernel[(num_rows * num_head_blocks, num_splits)](
        q, latent_cache,
        dummy if is_dense else slots,
        block_table if is_dense else dummy,
        row_request if is_dense else dummy,
        row_position if is_dense else dummy,
        partial_out, partial_lse,
        num_heads, 0 if is_dense else slots.shape[1], latent_cache.shape[1], keys_per_split,
        num_head_blocks, softmax_scale * scale * LOG2_E, scale,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        0 if is_dense else slots.stride(0), block_table.stride(0) if is_dense else 0,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        IS_DENSE=is_dense, BLOCK_H=block_h, BLOCK_N=block_n,
        DOT_DTYPE=tl.float32 if is_interpreter else tl.bfloat16,
        num_warps=8, num_stages=num_stages,
    )
    if num_splits > 1:
        mla_combine_kernel[(num_rows, num_heads)](
            partial_out, partial_lse, out, lse, num_splits,
            partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
            partial_lse.stride(0), partial_lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0),
            SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=4,
        )
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
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.

    q [Nq, H, 576] absorbed queries, latent_cache [num_blocks, block_size, 576] (fp8 / bf16 /
    fp32, contiguous last dim), slots [Nq, k] int (-1 masked). Tuning knobs: `num_splits`
    (key splits per row, default at most one wave of programs), `block_h` (heads per
    program, 64), `block_n` (keys per step, 32 or 64) and `num_stages` (software pipelining).
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
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, slots, None, None, None,
                      slots.shape[1], num_splits, block_h, block_n, num_stages)


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
