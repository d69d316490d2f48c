"""sparse_mla in Triton: absorbed MLA attention of query rows over their own latent-cache rows.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5, §4.6). The kernel and how it tiles the
work: mla_kernel.py; its launch (product types, key splits and their merge): mla_launch.py;
the tile defaults per target, from the H200 benchmarks: mla_tiles.py. On Hopper (compute
capability 9.x, bf16 / fp16 queries over an FP8 e4m3fn latent with 16-byte aligned rows) the
default is a Gluon kernel instead (wgmma; Gluon ships inside the triton wheel, so it is this
backend's Hopper path): since session 6 the warp-specialized one,
gluon_kernels/sparse_mla_hopper_ws.py ("gluon_hopper_ws"); the one-role kernel of session 5,
gluon_kernels/sparse_mla_hopper.py, stays as "gluon_hopper". H200 (graph-timed, 96 heads,
2048 keys, session 6 round 2): 64 rows 87.4 us (ws, 42.9% of the BF16 GEMM rate) vs 122.6
(one-role) vs the Triton kernel's 154.8; 16 rows 32.3 vs 39.7 vs 47.7.
"""

import torch

from atomk31.triton_kernels.mla_kernel import LATENT_DIM
from atomk31.triton_kernels.mla_launch import (
    check_latent_cache_layout,
    choose_mla_tiles,
    launch_mla,
)


def gluon_hopper_applies(q: torch.Tensor, latent_cache: torch.Tensor) -> bool:
    """Whether the Gluon kernels (gluon_kernels/sparse_mla_hopper.py, sparse_mla_hopper_ws.py)
    run these inputs (an NVIDIA Hopper GPU, bf16 / fp16 queries, an FP8 e4m3fn latent with
    16-byte aligned rows)."""
    if not q.is_cuda or torch.version.hip is not None:
        return False
    from gluon_kernels.sparse_mla_hopper import why_not_hopper

    return why_not_hopper(q, latent_cache) is None


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
    prefetch: int | None = None,
    fp16_operands: bool | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32.

    q [Nq, H, 576] absorbed queries, latent_cache [num_blocks, block_size, 576] (fp8 / bf16 /
    fp32, contiguous last dim), slots [Nq, k] int (-1 masked). Tuning knobs (None: chosen for
    the target, see mla_tiles.py): `num_splits` (key splits per row), `block_h` (heads per
    program), `block_n` (keys per step), `num_stages` (software pipelining), `num_warps`,
    `scores_via_memory` (probabilities through a scratch buffer, see SCORES_VIA_MEMORY; runs
    one stage), `value_splits` (1 or 2 programs per query block, see VALUE_SPLITS),
    `prefetch` (0 or 1, see PREFETCH) and `fp16_operands` (FP16 products over an FP8
    latent, see FP16_OPERANDS; ignored for other latents and float32 queries). `kernel`:
    "triton" (mla_kernel.py, every target), "gluon_hopper" (compute capability 9.x, bf16 /
    fp16 queries over an FP8 e4m3fn latent, FP16 products; takes `num_splits` only),
    "gluon_hopper_ws" (the same inputs, the warp-specialized Gluon kernel:
    gluon_kernels/sparse_mla_hopper_ws.py) or None: "gluon_hopper_ws" where it applies and no
    tile knob is set, else the Triton kernel.
    """
    tile_knobs = dict(block_h=block_h, block_n=block_n, num_stages=num_stages,
                      num_warps=num_warps, scores_via_memory=scores_via_memory,
                      value_splits=value_splits, prefetch=prefetch, fp16_operands=fp16_operands)
    fixed = [name for name, value in tile_knobs.items() if value is not None]
    kernel = kernel or "triton"
    if kernel in ("gluon_hopper", "gluon_hopper_ws"):
        from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper

        if fixed:
            raise ValueError(f"kernel={kernel!r} takes num_splits only, got {fixed}")

        return sparse_mla_hopper(q, latent_cache, latent_scale, slots, softmax_scale,
                                 num_splits=num_splits,
                                 warp_specialized=kernel == "gluon_hopper_ws")
    if kernel != "triton":
        raise ValueError(f"kernel must be 'triton', 'gluon_hopper' or 'gluon_hopper_ws', got "
                         f"{kernel!r}")
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
                             scores_via_memory=scores_via_memory, value_splits=value_splits,
                             prefetch=prefetch, fp16_operands=fp16_operands,
                             is_sparse=True)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, slots, None, None, None,
                      slots.shape[1], tiles)
