"""The trainer's latent MoE (MODEL_SPEC §4.7); checkpoint names under `block_sparse_moe.`.

Routing as the engine does it: sigmoid scores, top-k of `scores + e_score_correction_bias`,
weights from the unbiased scores, renormalised, times `routed_scaling_factor`. The bias is not
learned by gradient: it balances the experts' loads as DeepSeek-V3's auxiliary-loss-free method
does (`update_bias`, after each optimiser step).

Every expert runs on every token of the latent and the routing weights (zero off the top-k) mix
them: with 16 small experts this is a few batched matmuls instead of a gather per expert, and the
router still learns only through the selected experts' weights. The routed experts are stored
as MXFP4 (§3.3); with `quantize` on, the forward uses their MXFP4 values (quantize, dequantize,
straight-through gradient), so the loss is the shipped model's loss (quantization-aware training).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from atomk31.config import ModelConfig
from atomk31.demo.train.layers import DenseMlp, RMSNorm, situ_glu
from atomk31.quant import dequantize_mxfp4, quantize_mxfp4

RENORMALIZE_EPS = 1e-20
BIAS_UPDATE_RATE = 1e-3


def mxfp4_straight_through(weight: torch.Tensor) -> torch.Tensor:
    """The MXFP4 values of `weight` [..., in] (blocks of 32 along `in`), gradient passed as is."""
    packed, scales = quantize_mxfp4(weight.detach().float())
    quantized = dequantize_mxfp4(packed, scales).to(weight.dtype)
    return weight + (quantized - weight).detach()


class Router(nn.Module):
    """`gate.weight` [E, D] and the load-balancing `gate.e_score_correction_bias` [E]."""

    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        nn.init.normal_(self.weight, std=hidden**-0.5)
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))


class LatentMoe(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, experts = config.hidden_size, config.num_experts
        width, latent = config.moe_intermediate_size, config.routed_expert_hidden_size
        assert latent is not None, "the demo model uses the latent MoE (routed_expert_hidden_size)"
        self.top_k, self.renormalize = config.num_experts_per_token, config.moe_renormalize
        self.scaling = config.routed_scaling_factor
        self.beta, self.linear_beta = config.activation_situ_beta, config.activation_situ_linear_beta
        self.gate = Router(hidden, experts)
        self.routed_expert_down_proj = nn.Linear(hidden, latent, bias=False)
        self.routed_expert_norm = RMSNorm(latent, config.rms_norm_eps)
        self.routed_expert_up_proj = nn.Linear(latent, hidden, bias=False)
        # experts.{e}.w1 (gate), w3 (up): [E, I, D_l]; w2 (down): [E, D_l, I]
        self.experts_w1 = nn.Parameter(torch.randn(experts, width, latent) / math.sqrt(latent))
        self.experts_w3 = nn.Parameter(torch.randn(experts, width, latent) / math.sqrt(latent))
        self.experts_w2 = nn.Parameter(torch.randn(experts, latent, width) / math.sqrt(width))
        self.shared_experts = DenseMlp(hidden, width * config.num_shared_experts, self.beta,
                                       self.linear_beta) if config.num_shared_experts else None
        self.quantize = False
        self.last_load: torch.Tensor | None = None

    def route(self, x: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
        """Dense routing weights [N, E] (zero off each token's top-k) for x [N, D]; the loads of
        the tokens in `token_mask` [N] (padding excluded) are kept for `update_bias`."""
        with torch.autocast(x.device.type, enabled=False):     # router logits in fp32 (§4.7)
            scores = torch.sigmoid(x.float() @ self.gate.weight.float().T)
        chosen = (scores + self.gate.e_score_correction_bias).topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORMALIZE_EPS)
        if self.training:
            counted = chosen if token_mask is None else chosen[token_mask]
            self.last_load = torch.zeros_like(scores[0]).scatter_add_(
                0, counted.flatten(), torch.ones_like(counted.flatten(), dtype=scores.dtype))
        return torch.zeros_like(scores).scatter(-1, chosen, weights * self.scaling)

    def expert_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weights = (self.experts_w1, self.experts_w3, self.experts_w2)
        return tuple(mxfp4_straight_through(w) for w in weights) if self.quantize else weights

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] (post-attention normed mix), token_mask [B, T] -> [B, T, D]."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        routing = self.route(flat, None if token_mask is None else token_mask.reshape(-1))                                         # [N, E]
        z = self.routed_expert_down_proj(flat)                               # [N, D_l]
        w1, w3, w2 = self.expert_weights()
        dtype = z.dtype
        gate = torch.einsum("nd,eid->nei", z, w1.to(dtype))
        up = torch.einsum("nd,eid->nei", z, w3.to(dtype))
        hidden = situ_glu(gate, up, self.beta, self.linear_beta).to(dtype)
        routed = torch.einsum("nei,edi->ned", hidden, w2.to(dtype))          # [N, E, D_l]
        mixed = torch.einsum("ne,ned->nd", routing.to(dtype), routed).float()
        output = self.routed_expert_up_proj(self.routed_expert_norm(mixed))
        if self.shared_experts is not None:
            output = output + self.shared_experts(flat)
        return output.reshape(shape)

    @torch.no_grad()
    def update_bias(self) -> None:
        """Auxiliary-loss-free balancing: raise the bias of under-loaded experts, lower the rest."""
        if self.last_load is None:
            return
        load = self.last_load
        self.gate.e_score_correction_bias += BIAS_UPDATE_RATE * torch.sign(load.mean() - load)
        self.last_load = None
