"""Launching `mla_kernel.sparse_mla_kernel` (sparse and dense MLA): the cache layout it needs,
product types, tiles, the kernel launch and the merge of key splits (the split plan:
mla_splits.py, shared with the Hopper Gluon launchers)."""

import math

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.mla_combine import mla_combine
from atomk31.triton_kernels.mla_fp16_query import mla_fp16_query
from atomk31.triton_kernels.mla_kernel import LATENT_DIM, VALUE_DIM, sparse_mla_kernel
from atomk31.triton_kernels.mla_splits import key_splits, split_outputs
from atomk31.triton_kernels.mla_tiles import MLATileConfig, MlaTiles, choose_tiles
from atomk31.triton_kernels.runtime import runs_on_interpreter

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
LOG2_E = 1.0 / math.log(2.0)


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
                     max_keys: int, rows_per_program: int, config: MLATileConfig | None,
                     is_sparse: bool = False) -> MlaTiles:
    """`choose_tiles` for these inputs; config: the launcher's (None: choose everything)."""
    return choose_tiles(q, product_dtype(q, latent_cache) == torch.float32,
                        runs_on_interpreter(sparse_mla_kernel), num_groups, max_keys,
                        rows_per_program, config or MLATileConfig(), is_sparse)


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
    num_splits, keys_per_split = key_splits(max_keys, tiles.block_n, tiles.num_splits)
    partial_out, partial_lse = split_outputs(out, lse, num_splits)
    is_dense = slots is None
    scale = latent_scale if latent_cache.dtype in FP8_DTYPES else 1.0
    dot_dtype = product_dtype(q, latent_cache)
    # FP16 operands only where they are exact (an FP8 latent) and not in float32 mode.
    fp16_operands = tiles.fp16_operands and latent_cache.dtype in FP8_DTYPES \
        and q.dtype != torch.float32
    if dot_dtype == torch.float32:
        dot_dtype_tl = tl.float32
    else:
        dot_dtype_tl = tl.float16 if fp16_operands else tl.bfloat16
    q_unscale = out  # placeholder unless the queries are scaled into FP16
    if fp16_operands:
        q, q_unscale = mla_fp16_query(q)
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
        partial_out, partial_lse, q_unscale, scratch,
        num_rows, num_heads, 0 if is_dense else slots.shape[1], latent_cache.shape[1],
        keys_per_split, num_head_blocks, softmax_scale * scale * LOG2_E, scale,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        0 if is_dense else slots.stride(0), block_table.stride(0) if is_dense else 0,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        IS_DENSE=is_dense, ROWS_PER_PROGRAM=tiles.rows_per_program,
        BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n, VALUE_SPLITS=tiles.value_splits,
        DOT_DTYPE=dot_dtype_tl, SCORES_VIA_MEMORY=tiles.scores_via_memory,
        PREFETCH=tiles.prefetch, FP16_OPERANDS=fp16_operands,
        FLAT_SLOTS=latent_cache.stride(0) == latent_cache.shape[1] * latent_cache.stride(1),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if num_splits > 1:
        mla_combine(partial_out, partial_lse, out, lse)
    return out, lse
