"""Merge partial attention over disjoint key sets by log-sum-exp, heads scattered to their ranks.

Each rank of a DCP group has attended every head of its head group over its own keys:
``out_r [Nq, H, 512]`` (softmax-weighted values) with ``lse_r [Nq, H]`` (log of the softmax
denominator, ``sparse_mla``'s second output). Over the union of the keys

    lse = log sum_r exp(lse_r),    out = sum_r exp(lse_r - lse) * out_r

which is exactly the softmax over all keys (a rank without keys for a row has lse -inf and
weight 0). One all-to-all sends rank s the partials of its H/W heads (its TP heads), so each
rank merges only the heads it projects: per row and rank (W-1)/W x H x (512 values in the
exchange dtype + one fp32 lse).
"""

from __future__ import annotations

import torch

from atomk31.distributed.communicator import LocalCommunicator, TorchCommunicator


def merge_partials(out: torch.Tensor, lse: torch.Tensor,
                   comm: LocalCommunicator | TorchCommunicator,
                   exchange_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """out [Nq, H, Dv] fp32, lse [Nq, H] fp32 of this rank's keys -> the merged out
    [Nq, H/W, Dv] fp32 of this rank's heads (rank w of the group: heads w H/W ..)."""
    world = comm.world_size
    num_rows, heads, width = out.shape
    if heads % world:
        raise ValueError(f"merge_partials: {heads} heads do not split over {world} ranks")
    share = heads // world
    out_send = out.view(num_rows, world, share, width).transpose(0, 1)      # [W, Nq, h, Dv]
    lse_send = lse.view(num_rows, world, share).transpose(0, 1)              # [W, Nq, h]
    out_recv = comm.all_to_all(out_send.to(exchange_dtype)).float()          # from r: r's keys
    lse_recv = comm.all_to_all(lse_send.float())
    return combine(out_recv, lse_recv)


def combine(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """outs [W, ..., Dv], lses [W, ...] of W disjoint key sets -> the merged [..., Dv]."""
    top = lses.amax(dim=0)
    top = torch.where(torch.isfinite(top), top, 0.0)          # no keys anywhere: weights 0
    weights = torch.exp(lses - top)                            # [W, ...]
    total = weights.sum(dim=0)
    merged = (weights[..., None] * outs).sum(dim=0)
    return merged / total.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
