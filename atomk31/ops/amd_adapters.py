"""Thin adapters that fit AMD kernels to their ops' contracts (registered in the op modules).

Each imports its kernel package on first call: aiter and FlyDSL exist only in ROCm installs,
so importing the ops must not need them.
"""

from __future__ import annotations

import torch

from atomk31.ops.topk import positions_to_slots_torch


def rms_norm_aiter(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` through aiter, whose kernel takes contiguous 2-D rows: x is viewed (or
    copied) as [rows, D] and the result shaped back."""
    import aiter

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return aiter.rms_norm(rows, weight.to(x.dtype), eps).view(x.shape)


def topk_slots_radix(scores: torch.Tensor, k: int, lengths: torch.Tensor,
                     block_table: torch.Tensor, row_request: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """`topk_slots` as the Gluon multi-workgroup radix select (positions) followed by the
    position -> slot mapping (a few element-wise torch ops, capturable)."""
    from gluon_kernels.amd.radix_topk import topk_positions_gluon

    positions = topk_positions_gluon(scores, k, lengths)
    return positions_to_slots_torch(positions, block_table, row_request, block_size)


def moe_experts_mxfp4_flydsl(z: torch.Tensor, topk_weights: torch.Tensor,
                             topk_ids: torch.Tensor, w13_packed: torch.Tensor,
                             w13_scales: torch.Tensor, w2_packed: torch.Tensor,
                             w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
                             one_factor_exact: bool = False) -> torch.Tensor:
    """`moe_experts_mxfp4` through the FlyDSL kernels. ``one_factor_exact`` (a promise about
    the weights that lets the Triton kernels decode with one multiply) does not apply: FlyDSL
    decodes every scale exactly."""
    from flydsl_kernels.moe_mxfp4 import moe_experts_mxfp4_flydsl as launch

    return launch(z, topk_weights, topk_ids, w13_packed, w13_scales, w2_packed, w2_scales,
                  beta, linear_beta)
