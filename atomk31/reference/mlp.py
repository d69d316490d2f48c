"""SiTU-GLU and the dense SiTU-GLU MLP (MODEL_SPEC §4.8, §4.9, §9 #12, §9 #14)."""

from dataclasses import dataclass

import torch


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta: float = 1.0, linear_beta: float | None = None) -> torch.Tensor:
    """SiTU-GLU of gate [..., n] and up [..., n] -> [..., n].

    `beta * tanh(gate / beta) * sigmoid(gate)` (SiLU with the gate soft-capped at +-beta) times
    `linear_beta * tanh(up / linear_beta)`, or `up` when `linear_beta` is None (§4.8). The
    config maps `activation_situ_beta: null` to 1.0 (§9 #14).
    """
    gated = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    capped_up = up if linear_beta is None else linear_beta * torch.tanh(up / linear_beta)
    return gated * capped_up


@dataclass(frozen=True)
class MlpWeights:
    """A SiTU-GLU MLP: gate_proj, up_proj [width, D]; down_proj [D, width] (float32)."""

    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor


def dense_mlp(
    x: torch.Tensor, weights: MlpWeights, beta: float = 1.0, linear_beta: float | None = None
) -> torch.Tensor:
    """`down_proj(situ_glu(gate_proj x, up_proj x))`; x [T, D] -> [T, D] (§4.9).

    Also the shared-experts MLP of §4.7 (width moe_intermediate_size * num_shared_experts).
    """
    hidden = situ_glu(x @ weights.gate_proj.T, x @ weights.up_proj.T, beta, linear_beta)
    return hidden @ weights.down_proj.T
