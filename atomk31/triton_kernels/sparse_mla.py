"""sparse_mla in Triton: absorbed MLA attention of query rows over their own latent-cache rows.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5, §4.6); the op checks its arguments before
this launcher runs. The kernel and how it tiles the work: mla_kernel.py; its launch (product
types, key splits and their merge): mla_launch.py; the tile defaults per target: mla_tiles.py.
"""

import torch

from atomk31.triton_kernels.mla_launch import (
    check_latent_cache_layout,
    choose_mla_tiles,
    launch_mla,
)
from atomk31.triton_kernels.mla_tiles import MLATileConfig


def sparse_mla_triton(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
    config: MLATileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.

    q [Nq, H, 576] absorbed queries, latent_cache [num_blocks, block_size, 576] (fp8 / bf16 /
    fp32, contiguous last dim, any block and token strides), slots [Nq, k] int (-1 masked).
    config: tile knobs a caller fixes (None: chosen for the target, mla_tiles.py).
    """
    check_latent_cache_layout(latent_cache)
    if slots.stride(-1) != 1:
        slots = slots.contiguous()
    tiles = choose_mla_tiles(q, latent_cache, slots.shape[0], slots.shape[1], 1, config,
                             is_sparse=True)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, slots, None, None, None,
                      slots.shape[1], tiles)
