"""Attention-residual mixing site (MODEL_SPEC §4.3).

Contract: ``attn_res(candidates [B+1, T, D], query [D], out_weight [D], eps) -> [T, D]``

* ``candidates`` stacks the B completed block sums and the running prefix (last), any float
  dtype (BF16 in the engine's residual stream).
* ``query`` is the folded pseudo-query ``w_n * w_p`` (``*_res_norm.weight`` times
  ``*_res_proj.weight[0]``), so the depth score ``w_p . rms_norm(V, w_n)`` becomes
  ``(V . query) * rsqrt(mean(V^2) + eps)``.
* Per token: softmax over depth (dim 0) of those scores, mix the candidates with the weights,
  then ``rms_norm(mix, out_weight, eps)`` with the consumer's norm weight (``input_layernorm``,
  ``post_attention_layernorm`` or the final ``norm``). One ``eps`` (``rms_norm_eps``, §9 #3)
  serves the candidate norm and the consumer norm.

Everything is computed in fp32 and rounded once to ``candidates.dtype``. With B = 0 the site
reduces to ``rms_norm(prefix, out_weight, eps)``. Tests: fp32 within 1e-5 relative of a
per-token loop.
"""

import torch

from atomk31.ops.registry import register
from atomk31.ops.requirements import needs_gpu


def attn_res_torch(
    candidates: torch.Tensor, query: torch.Tensor, out_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Mix B+1 candidates per token over depth. candidates: [B+1, T, D] -> [T, D]."""
    if candidates.dim() != 3 or candidates.shape[0] < 1:
        raise ValueError(
            "attn_res: candidates must be [B+1, T, D] with at least the prefix, "
            f"got shape {tuple(candidates.shape)}"
        )
    hidden_size = candidates.shape[-1]
    for name, vector in (("query", query), ("out_weight", out_weight)):
        if vector.shape != (hidden_size,):
            raise ValueError(
                f"attn_res: {name} must have shape [{hidden_size}] (D of the candidates), "
                f"got {tuple(vector.shape)}"
            )
    values = candidates.float()                                            # [B+1, T, D]
    inverse_rms = torch.rsqrt(values.square().mean(dim=-1) + eps)          # [B+1, T]
    scores = torch.einsum("btd,d->bt", values, query.float()) * inverse_rms
    weights = torch.softmax(scores, dim=0)                                 # over depth
    mixed = torch.einsum("bt,btd->td", weights, values)                    # [T, D]
    normed = mixed * torch.rsqrt(mixed.square().mean(dim=-1, keepdim=True) + eps)
    return (normed * out_weight.float()).to(candidates.dtype)


register("attn_res", "torch", attn_res_torch)
register("attn_res", "triton", "atomk31.triton_kernels.attn_res:attn_res_triton",
         why_not=needs_gpu)
