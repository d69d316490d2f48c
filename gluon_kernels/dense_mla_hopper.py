"""Dense MLA decode on Hopper: the warp-specialized sparse kernel in its dense mode.

Contract: `atomk31.ops.dense_mla` (MODEL_SPEC §4.5; the dense case of §4.6): each row at
position p attends to positions 0..p of its request through the block table; returns out
[Nq, H, 512] and lse [Nq, H] fp32, exactly as `sparse_mla` over the full causal selection.

How. gluon_kernels/sparse_mla_hopper_ws.py with DENSE set: its key producer computes the slot
of position t (block_table[request, t // block_size] * block_size + t % block_size) instead of
reading a selection, so dense decode gets the sparse kernel's schedule (a producer converting
FP8 rows to FP16, a scorer, a value worker) with no slot list in memory. Rows that share a
request (a speculative step's verification rows) share a CTA's keys: q [Nq, H, 576] is viewed
as [Nq / R, R * H, 576] (R = 4 or 2 consecutive rows of one request), so R = 4 rows of 96
heads are six 64-vector head blocks, no padding (one row of 96 heads pads to 128: 1.33x the
products). A vector of row r sees keys up to that row's position: the scorer masks the last
tiles per vector. Keys are split across CTAs (flash-decoding) and merged by log-sum-exp
(`mla_combine`).

Why not the Triton kernel on Hopper: dense decode with an FP8 latent is bound by the matrix
rate (2 * 96 * (576 + 512) / 576 = 363 FLOP per byte against the H200's BF16 ridge of ~180),
and the Triton kernel reached ~23% of the BF16 rate (session 3) where the warp-specialized
sparse kernel reaches ~42% at 64 rows.
"""

import torch
import triton

from atomk31.triton_kernels.dense_mla import GROUPABLE_ROWS  # rows a CTA, largest first
from gluon_kernels.sparse_mla_hopper import (
    BLOCK_H,
    VALUE_DIM,
    key_splits,
    split_outputs,
    why_not_hopper,
)


def rows_per_group(num_rows: int, rows_per_request: int | None) -> int:
    """Consecutive rows of one request that share a CTA: the largest of GROUPABLE_ROWS that
    divides both the run length the caller promises and the row count, else 1."""
    if rows_per_request is None:
        return 1
    return next((rows for rows in GROUPABLE_ROWS
                 if rows_per_request % rows == 0 and num_rows % rows == 0), 1)


def dense_mla_hopper(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    softmax_scale: float,
    max_position: int | None = None,
    rows_per_request: int | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys with the Hopper Gluon kernel:
    (out [Nq, H, 512], lse [Nq, H]) fp32. Arguments as `dense_mla_triton` (max_position and
    rows_per_request are host-side hints: no device read); latent_cache [num_blocks,
    block_size, 576] float8_e4m3fn with 16-byte aligned rows, q bf16 / fp16. `num_splits`:
    key splits per CTA (None: the fewest filling the GPU)."""
    from atomk31.ops.sparse_mla import check_mla_query
    from atomk31.triton_kernels.mla_combine import mla_combine
    from atomk31.triton_kernels.mla_launch import LOG2_E, check_latent_cache_layout
    from gluon_kernels.sparse_mla_hopper_ws import ROLE_WARPS, sparse_mla_hopper_ws_kernel

    check_latent_cache_layout(latent_cache)
    num_rows = row_request.shape[0]
    check_mla_query(q, num_rows)
    reason = why_not_hopper(q, latent_cache)
    if reason is not None:
        raise ValueError(f"dense_mla_hopper {reason}")
    if latent_cache.shape[1] != block_size:
        raise ValueError(f"latent cache pages hold {latent_cache.shape[1]} tokens but "
                         f"block_size is {block_size}")
    num_heads = q.shape[1]
    out = torch.empty(num_rows, num_heads, int(VALUE_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    group = rows_per_group(num_rows, rows_per_request)
    if q.stride(-1) != 1 or q.stride(0) != num_heads * q.stride(1):
        q = q.contiguous()  # a group's vectors are consecutive heads of consecutive rows
    num_groups, vectors = num_rows // group, group * num_heads
    q_groups = q.view(num_groups, vectors, q.shape[2])
    max_keys = block_table.shape[1] * block_size if max_position is None else max_position + 1
    num_head_blocks = triton.cdiv(vectors, int(BLOCK_H))
    num_splits, keys_per_split = key_splits(num_groups * num_head_blocks, max_keys, num_splits,
                                            q.device)
    out_groups, lse_groups = out.view(num_groups, vectors, -1), lse.view(num_groups, vectors)
    partial_out, partial_lse = split_outputs(out_groups, lse_groups, num_splits)
    block_table = block_table if block_table.dtype == torch.int32 else block_table.int()
    sparse_mla_hopper_ws_kernel[(num_groups * num_head_blocks, num_splits)](
        q_groups, latent_cache, block_table, partial_out, partial_lse,
        vectors, max_keys, keys_per_split, block_size, num_head_blocks,
        softmax_scale * latent_scale * LOG2_E, latent_scale,
        q_groups.stride(0), q_groups.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        block_table.stride(0), partial_out.stride(0), partial_out.stride(1),
        partial_out.stride(2), partial_lse.stride(0), partial_lse.stride(1),
        row_request, row_position, num_heads, group,
        FLAT_SLOTS=latent_cache.stride(0) == block_size * latent_cache.stride(1),
        DENSE=True, num_warps=int(ROLE_WARPS),
    )
    if num_splits > 1:
        mla_combine(partial_out, partial_lse, out_groups, lse_groups)
    return out, lse
