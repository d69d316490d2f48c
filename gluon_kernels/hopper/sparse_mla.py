"""Sparse MLA on Hopper (sm_90): the launcher of the warp-specialized Gluon kernel
(sparse_mla_kernel.py: design, numerics).

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5, §4.6); the op checks its arguments before
this launcher runs and the registry runs it only on sm_90 with bf16 / fp16 queries over an FP8
e4m3fn latent. What the kernel further needs of the tensors themselves, the launcher checks
(host metadata only): cache rows on 16-byte boundaries for its 16-byte loads (every engine
cache: 576-byte rows in 256-byte aligned pages). One CTA owns one query row, 64 heads and one
key split; the splits (mla_splits.py, shared with the Triton launchers) fill the GPU and are
merged by log-sum-exp (`mla_combine`).
"""

import torch
import triton

from atomk31.triton_kernels.mla_combine import mla_combine
from atomk31.triton_kernels.mla_launch import LOG2_E
from atomk31.triton_kernels.mla_splits import default_splits, key_splits, split_outputs
from atomk31.triton_kernels.mla_tiles import MLATileConfig
from atomk31.triton_kernels.runtime import num_sms
from gluon_kernels.hopper.sparse_mla_kernel import (
    BLOCK_H, BLOCK_N, ROLE_WARPS, VALUE_DIM, sparse_mla_hopper_kernel,
)


def check_cache_rows(latent_cache: torch.Tensor) -> None:
    """Raise ValueError unless the cache's rows lie on 16-byte boundaries, last dim dense."""
    size = latent_cache.element_size()
    if latent_cache.stride(-1) != 1 or latent_cache.data_ptr() % 16 \
            or (latent_cache.stride(1) * size) % 16 or (latent_cache.stride(0) * size) % 16:
        raise ValueError(f"the Hopper MLA kernel needs cache rows on 16-byte boundaries "
                         f"(16-byte loads), got strides {latent_cache.stride()} at address "
                         f"{latent_cache.data_ptr():#x}; pass a page view of the engine's pool")


def plan_splits(num_programs: int, num_keys: int, config: MLATileConfig | None,
                device: torch.device) -> tuple[int, int]:
    """(splits, keys per split) for `num_programs` CTAs a split: config.num_splits, or the
    fewest splits filling the GPU. The kernel's tiles are fixed: another knob is an error."""
    config = config or MLATileConfig()
    other = [name for name in config.fixed() if name != "num_splits"]
    if other:
        raise ValueError(f"the Hopper MLA kernel takes num_splits only (its tiles are fixed), "
                         f"got {other}")
    num_splits = config.num_splits
    if num_splits is None:
        num_splits = default_splits(num_programs, num_keys, int(BLOCK_N), num_sms(device))
    return key_splits(num_keys, int(BLOCK_N), num_splits)


def sparse_mla_hopper(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
    config: MLATileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.
    q [Nq, H, 576] bf16 / fp16, latent_cache [num_blocks, block_size, 576] float8_e4m3fn
    (16-byte aligned rows, any block stride), slots [Nq, k] int32 (-1 masked). config: only
    its num_splits (key splits a row; None: the fewest filling the GPU)."""
    check_cache_rows(latent_cache)
    num_rows, num_selected = slots.shape
    num_heads = q.shape[1]
    out = torch.empty(num_rows, num_heads, int(VALUE_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    slots = slots if slots.dtype == torch.int32 and slots.stride(-1) == 1 \
        else slots.to(torch.int32).contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    num_head_blocks = triton.cdiv(num_heads, int(BLOCK_H))
    num_splits, keys_per_split = plan_splits(num_rows * num_head_blocks, num_selected, config,
                                             q.device)
    partial_out, partial_lse = split_outputs(out, lse, num_splits)
    block_size = latent_cache.shape[1]
    sparse_mla_hopper_kernel[(num_rows * num_head_blocks, num_splits)](
        q, latent_cache, slots, partial_out, partial_lse,
        num_heads, num_selected, keys_per_split, block_size, num_head_blocks,
        softmax_scale * latent_scale * LOG2_E, latent_scale,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        slots.stride(0), partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        slots, slots, 1, 1,  # the dense mode's arguments, unused here
        FLAT_SLOTS=latent_cache.stride(0) == block_size * latent_cache.stride(1),
        DENSE=False, num_warps=int(ROLE_WARPS),
    )
    if num_splits > 1:
        mla_combine(partial_out, partial_lse, out, lse)
    return out, lse
