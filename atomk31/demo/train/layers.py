"""Small building blocks of the trainer's model: norms, SiTU-GLU, AttnRes, the dense MLP.

Every function follows MODEL_SPEC §4 and computes its reductions in float32 whatever the autocast
dtype; parameters carry the checkpoint's names (`weight` of a norm, `gate_proj` of an MLP, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x^2) + eps)` (§4.2), computed in float32."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps))


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float | None
             ) -> torch.Tensor:
    """§4.8: `beta tanh(a / beta) sigmoid(a) * linear_beta tanh(b / linear_beta)`, in float32."""
    gate, up = gate.float(), up.float()
    gated = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    return gated * (up if linear_beta is None else linear_beta * torch.tanh(up / linear_beta))


class DenseMlp(nn.Module):
    """`down_proj(situ_glu(gate_proj x, up_proj x))` (§4.9; also the shared experts, §4.7)."""

    def __init__(self, hidden: int, width: int, beta: float, linear_beta: float | None) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.beta, self.linear_beta = beta, linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = situ_glu(self.gate_proj(x), self.up_proj(x), self.beta, self.linear_beta)
        return self.down_proj(hidden)


def res_proj(hidden: int) -> nn.Linear:
    """An AttnRes pseudo-query `*_res_proj` ([1, D]), zero at init so the first mix is uniform
    (§4.3, as fla initialises it)."""
    proj = nn.Linear(hidden, 1, bias=False)
    nn.init.zeros_(proj.weight)
    return proj


def attn_res(blocks: list[torch.Tensor], prefix: torch.Tensor, proj: nn.Linear, norm: RMSNorm
             ) -> torch.Tensor:
    """Mix the candidates `blocks + [prefix]` (each [B, T, D]) per token over depth (§4.3):
    score `w_p . rms_norm(v, w_n)`, softmax over the candidates. Returns [B, T, D] float32,
    before the consumer's norm."""
    if not blocks:
        return prefix.float()
    candidates = torch.stack([*blocks, prefix]).float()                         # [n, B, T, D]
    inverse_rms = torch.rsqrt(candidates.pow(2).mean(dim=-1) + norm.eps)
    scores = (candidates * (norm.weight * proj.weight[0].float())).sum(dim=-1) * inverse_rms
    return (torch.softmax(scores, dim=0).unsqueeze(-1) * candidates).sum(dim=0)


def layer_norm(x: torch.Tensor, module: nn.LayerNorm) -> torch.Tensor:
    """The indexer's key LayerNorm (§4.2, eps 1e-6) in float32."""
    return F.layer_norm(x.float(), module.normalized_shape, module.weight.float(),
                        module.bias.float(), module.eps)
