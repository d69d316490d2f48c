"""Latent MoE: sigmoid router, routed experts in the latent, shared experts (MODEL_SPEC §4.7).

Dims: T tokens, D hidden, E routed experts, k experts per token, D_l latent width
(routed_expert_hidden_size; D_l = D when there is no latent, §9 #10), I expert width.
Routed experts arrive dequantized from MXFP4 (§3.3) in float32.
"""

from dataclasses import dataclass

import torch

from atomk31.reference.mlp import MlpWeights, dense_mlp, situ_glu
from atomk31.reference.norms import rms_norm

_RENORMALIZE_EPS = 1e-20            # §8 #11


@dataclass(frozen=True)
class MoeWeights:
    """One latent-MoE layer in float32.

    gate [E, D] router; e_score_correction_bias [E] or None; routed_expert_down_proj [D_l, D],
    routed_expert_up_proj [D, D_l] (both None without a latent); routed_expert_norm [D_l] or
    None (latent_moe_use_norm); experts_w1 (gate), experts_w3 (up) [E, I, D_l] and
    experts_w2 (down) [E, D_l, I]; shared_experts or None (num_shared_experts = 0).
    """

    gate: torch.Tensor
    e_score_correction_bias: torch.Tensor | None
    routed_expert_down_proj: torch.Tensor | None
    routed_expert_norm: torch.Tensor | None
    routed_expert_up_proj: torch.Tensor | None
    experts_w1: torch.Tensor
    experts_w3: torch.Tensor
    experts_w2: torch.Tensor
    shared_experts: MlpWeights | None


def route(
    x: torch.Tensor,
    gate: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    top_k: int,
    renormalize: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: x [T, D] -> (expert ids [T, k] int64, routing weights [T, k]).

    Scores `sigmoid(x @ gate.T)`; the bias steers the selection only, the weights use the
    unbiased scores; ties -> lower expert id; renormalise iff `renormalize`, then always
    multiply by `routed_scaling_factor` (§4.7, §9 #11).
    """
    scores = torch.sigmoid(x @ gate.T)                                   # [T, E]
    selection = scores if e_score_correction_bias is None else scores + e_score_correction_bias
    expert_ids = torch.sort(selection, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(-1, expert_ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + _RENORMALIZE_EPS)
    return expert_ids, weights * routed_scaling_factor


def latent_moe(
    x: torch.Tensor,
    weights: MoeWeights,
    top_k: int,
    renormalize: bool,
    routed_scaling_factor: float,
    eps: float,
    situ_beta: float = 1.0,
    situ_linear_beta: float | None = None,
) -> torch.Tensor:
    """Latent MoE of x [T, D] (post-attention normed mix) -> [T, D].

    `z = routed_expert_down_proj x`; `u = sum_j w_j expert_{e_j}(z)`;
    `u = rms_norm(u, routed_expert_norm, eps)` if present; `y = routed_expert_up_proj u +
    shared(x)`, the shared experts acting on the full width. `expert_e(z) = W2_e
    situ_glu(W1_e z, W3_e z)`.
    """
    expert_ids, routing_weights = route(
        x, weights.gate, weights.e_score_correction_bias, top_k, renormalize, routed_scaling_factor
    )
    latent = x if weights.routed_expert_down_proj is None else x @ weights.routed_expert_down_proj.T
    routed = torch.zeros_like(latent)                                    # u [T, D_l], fp32 sum
    for expert in range(weights.experts_w1.shape[0]):
        token_index, slot = torch.nonzero(expert_ids == expert, as_tuple=True)
        if token_index.numel() == 0:
            continue
        z = latent[token_index]
        gate, up = z @ weights.experts_w1[expert].T, z @ weights.experts_w3[expert].T
        hidden = situ_glu(gate, up, situ_beta, situ_linear_beta)
        contribution = routing_weights[token_index, slot].unsqueeze(-1) * (hidden @ weights.experts_w2[expert].T)
        routed.index_add_(0, token_index, contribution)
    if weights.routed_expert_norm is not None:
        routed = rms_norm(routed, weights.routed_expert_norm, eps)
    output = routed if weights.routed_expert_up_proj is None else routed @ weights.routed_expert_up_proj.T
    if weights.shared_experts is not None:
        output = output + dense_mlp(x, weights.shared_experts, situ_beta, situ_linear_beta)
    return output
