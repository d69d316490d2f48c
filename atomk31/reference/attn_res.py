"""Attention residuals: the per-token softmax over depth that feeds each sublayer (MODEL_SPEC §4.3)."""

import torch

from atomk31.reference.norms import rms_norm


def attn_res(
    blocks: list[torch.Tensor],
    prefix: torch.Tensor,
    query_weight: torch.Tensor | None,
    key_norm_weight: torch.Tensor | None,
    out_norm_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Mix the candidates `blocks + [prefix]` (each [T, D]) per token and normalise -> [T, D].

    query_weight is `*_res_proj.weight[0]` ([D], the pseudo-query `w_p`), key_norm_weight is
    `*_res_norm.weight` ([D], `w_n`), out_norm_weight the consumer's norm (input_layernorm,
    post_attention_layernorm or norm). The score of candidate `v` is `w_p . rms_norm(v, w_n)`;
    the softmax runs over depth (the candidates), never across tokens. With no banked block
    the softmax is trivially 1 and the site is `rms_norm(prefix, out_norm_weight)`, so the two
    AttnRes weights may be None then (a config without AttnRes has none).
    """
    if not blocks:
        return rms_norm(prefix, out_norm_weight, eps)
    if query_weight is None or key_norm_weight is None:
        raise ValueError("attn_res with banked blocks needs the *_res_proj and *_res_norm weights, got None")
    candidates = torch.stack(blocks + [prefix])                            # [B+1, T, D]
    inverse_rms = torch.rsqrt(candidates.pow(2).mean(dim=-1) + eps)        # [B+1, T]
    scores = (candidates * (key_norm_weight * query_weight)).sum(dim=-1) * inverse_rms
    mix_weights = torch.softmax(scores, dim=0)                             # over depth, per token
    mixed = (mix_weights.unsqueeze(-1) * candidates).sum(dim=0)            # [T, D]
    return rms_norm(mixed, out_norm_weight, eps)
