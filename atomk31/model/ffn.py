"""The feed-forward sublayers in engine form: the dense SiTU-GLU MLP (§4.9, §9 #12) and the
latent MoE (§4.7) with MXFP4 (or dequantized BF16) routed experts and the shared experts."""

from __future__ import annotations

from collections.abc import Callable

import torch

from atomk31.config import ModelConfig
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable
from atomk31.ops.moe import mxfp4_scales_allow_one_factor

ROUTED_NORM_NAME = "routed_expert_norm.weight"


class DenseMLP:
    """y = W_down · situ_glu(W_gate x, W_up x); gate and up fused as [gate | up] (§4.8)."""

    OPS = ("situ_glu", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str):
        self.beta = config.activation_situ_beta
        self.linear_beta = config.activation_situ_linear_beta
        self.gate_up_proj = weights.take_linear(
            [prefix + "gate_proj.weight", prefix + "up_proj.weight"])
        self.down_proj = weights.take_linear(prefix + "down_proj.weight")

    def forward(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        gate, up = self.gate_up_proj(x, ops).chunk(2, dim=-1)
        return self.down_proj(ops.situ_glu(gate, up, self.beta, self.linear_beta), ops)


class LatentMoE:
    """Router -> experts on the latent z = W_down x -> RMSNorm -> W_up, plus shared experts (§4.7).

    Experts are kept as the checkpoint stores them: MXFP4 bytes + E8M0 scales stacked over
    experts ([E, 2F, Dl/2] for w1|w3, [E, Dl, F/2] for w2), or dequantized BF16 when the
    checkpoint is the dequantized variant (§3.2).
    """

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str):
        e = prefix + "block_sparse_moe."
        self.top_k = config.num_experts_per_token
        self.renormalize = config.moe_renormalize
        self.scaling = config.routed_scaling_factor
        self.beta = config.activation_situ_beta
        self.linear_beta = config.activation_situ_linear_beta
        self.eps = config.rms_norm_eps
        self.w_router = weights.take_fp32(e + "gate.weight")          # fp32 logits (§4.7)
        self.correction_bias = weights.take_fp32(e + "gate.e_score_correction_bias")
        self.is_latent = config.routed_expert_hidden_size is not None   # §9 #10
        if self.is_latent:
            self.w_latent_down = weights.take(e + "routed_expert_down_proj.weight")
            self.w_latent_up = weights.take(e + "routed_expert_up_proj.weight")
        self.latent_norm = (weights.take_fp32(e + ROUTED_NORM_NAME)
                            if self.is_latent and config.latent_moe_use_norm else None)
        self.shared = (DenseMLP(config, weights, e + "shared_experts.")
                       if config.num_shared_experts else None)
        experts = [f"{e}experts.{i}." for i in range(config.num_experts)]
        self.is_mxfp4 = weights.has(experts[0] + "w1.weight_packed")
        if self.is_mxfp4:
            self.w13_packed = _stack_experts(weights.take_raw, experts,
                                             ("w1.weight_packed", "w3.weight_packed"))
            self.w13_scales = _stack_experts(weights.take_raw, experts,
                                             ("w1.weight_scale", "w3.weight_scale"))
            self.w2_packed = _stack_experts(weights.take_raw, experts, ("w2.weight_packed",))
            self.w2_scales = _stack_experts(weights.take_raw, experts, ("w2.weight_scale",))
            # Once per layer, at load (one host sync here, none per step): whether every
            # scale byte allows the kernels' one-multiply decode (ops/moe.py's docstring).
            self.one_factor_exact = mxfp4_scales_allow_one_factor(self.w13_scales,
                                                                  self.w2_scales)
        else:
            self.w13 = _stack_experts(weights.take, experts, ("w1.weight", "w3.weight"))
            self.w2 = _stack_experts(weights.take, experts, ("w2.weight",))

    @property
    def ops_called(self) -> tuple[str, ...]:
        """The ops ``forward`` calls (which graph steps must be able to capture)."""
        experts = "moe_experts_mxfp4" if self.is_mxfp4 else "moe_experts_dense"
        shared = DenseMLP.OPS if self.shared is not None else ()
        return ("moe_route", experts, "rms_norm") + shared

    def forward(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        weights, ids = ops.moe_route(x, self.w_router, self.correction_bias, self.top_k,
                                     self.renormalize, self.scaling)
        z = x @ self.w_latent_down.T if self.is_latent else x
        if self.is_mxfp4:
            u = ops.moe_experts_mxfp4(z, weights, ids, self.w13_packed, self.w13_scales,
                                      self.w2_packed, self.w2_scales, self.beta, self.linear_beta,
                                      one_factor_exact=self.one_factor_exact)
        else:
            u = ops.moe_experts_dense(z, weights, ids, self.w13, self.w2, self.beta,
                                      self.linear_beta)
        if self.latent_norm is not None:
            u = ops.rms_norm(u, self.latent_norm, self.eps)
        u = u.to(x.dtype)
        y = u @ self.w_latent_up.T if self.is_latent else u
        return y + self.shared.forward(x, ops) if self.shared is not None else y


def _stack_experts(take: Callable[[str], torch.Tensor], prefixes: list[str],
                   parts: tuple[str, ...]) -> torch.Tensor:
    """[E, rows, ...]: each expert's ``parts`` concatenated along their rows, written expert by
    expert into one tensor while each source tensor is dropped after its copy, so one layer's
    experts are never held twice (a list of per-expert tensors then a stack would)."""
    out = None
    for e, prefix in enumerate(prefixes):
        pieces = [take(prefix + part) for part in parts]
        if out is None:
            rows = sum(piece.shape[0] for piece in pieces)
            out = torch.empty((len(prefixes), rows, *pieces[0].shape[1:]),
                              dtype=pieces[0].dtype, device=pieces[0].device)
        torch.cat(pieces, out=out[e])
    return out
