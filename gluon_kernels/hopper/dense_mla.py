"""Dense MLA on Hopper (sm_90): the warp-specialized sparse kernel in its dense mode.

Contract: `atomk31.ops.dense_mla` (MODEL_SPEC §4.5; the dense case of §4.6): each row at
position p attends to positions 0..p of its request through the block table; returns out
[Nq, H, 512] and lse [Nq, H] fp32, exactly as `sparse_mla` over the full causal selection. The
op checks its arguments first; the registry runs this on sm_90 with bf16 / fp16 queries over
an FP8 e4m3fn latent.

How. sparse_mla_kernel.py with DENSE set: its key producer computes the slot of position t
(block_table[request, t // block_size] * block_size + t % block_size) instead of reading a
selection, so dense decode gets the sparse kernel's schedule (a producer converting FP8 rows
to FP16, a scorer, a value worker) with no slot list in memory. Rows that share a request (a
speculative step's verification rows) share a CTA's keys: q [Nq, H, 576] is viewed as
[Nq / R, R * H, 576] (R = 4 or 2 consecutive rows of one request, from the host's
`rows_per_request`), so R = 4 rows of 96 heads are six 64-vector head blocks, no padding (one
row of 96 heads pads to 128: 1.33x the products). A vector of row r sees keys up to that
row's position: the scorer masks the last tiles per vector. Keys are split across CTAs
(flash-decoding) and merged by log-sum-exp (`mla_combine`).

Why not the Triton kernel on Hopper: dense decode with an FP8 latent is bound by the matrix
rate (2 * 96 * (576 + 512) / 576 = 363 FLOP per byte against the H200's BF16 ridge of ~180),
where the warp-specialized kernel reaches about twice the Triton kernel's fraction of it
(benchmarks/NOTES.md).
"""

import torch
import triton

from atomk31.triton_kernels.mla_combine import mla_combine
from atomk31.triton_kernels.mla_launch import LOG2_E
from atomk31.triton_kernels.mla_splits import rows_per_program, split_outputs
from atomk31.triton_kernels.mla_tiles import MLATileConfig
from gluon_kernels.hopper.sparse_mla import check_cache_rows, plan_splits
from gluon_kernels.hopper.sparse_mla_kernel import (
    BLOCK_H, ROLE_WARPS, VALUE_DIM, sparse_mla_hopper_kernel,
)


def dense_mla_hopper(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    softmax_scale: float,
    *,
    max_position: int | None = None,
    rows_per_request: int | None = None,
    config: MLATileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H])
    fp32. Arguments as `dense_mla_triton` (max_position and rows_per_request are the op's
    host-side hints: no device read); latent_cache [num_blocks, block_size, 576]
    float8_e4m3fn with 16-byte aligned rows, q bf16 / fp16. config: only its num_splits (key
    splits per CTA; None: the fewest filling the GPU)."""
    check_cache_rows(latent_cache)
    num_rows, num_heads = q.shape[0], q.shape[1]
    out = torch.empty(num_rows, num_heads, int(VALUE_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    group = rows_per_program(rows_per_request, num_rows)
    if q.stride(-1) != 1 or q.stride(0) != num_heads * q.stride(1):
        q = q.contiguous()  # a group's vectors are consecutive heads of consecutive rows
    num_groups, vectors = num_rows // group, group * num_heads
    q_groups = q.view(num_groups, vectors, q.shape[2])
    max_keys = block_table.shape[1] * block_size if max_position is None else max_position + 1
    num_head_blocks = triton.cdiv(vectors, int(BLOCK_H))
    num_splits, keys_per_split = plan_splits(num_groups * num_head_blocks, max_keys, config,
                                             q.device)
    out_groups, lse_groups = out.view(num_groups, vectors, -1), lse.view(num_groups, vectors)
    partial_out, partial_lse = split_outputs(out_groups, lse_groups, num_splits)
    block_table = block_table if block_table.dtype == torch.int32 else block_table.int()
    sparse_mla_hopper_kernel[(num_groups * num_head_blocks, num_splits)](
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
