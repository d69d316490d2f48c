"""Gated MLA with NoPE, in expanded and absorbed form (MODEL_SPEC §4.5).

Dims: T queries, S keys, D hidden, H heads, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim
(the "rope" lane, never rotated), d_v = v_head_dim, r_q = q_lora_rank, r_kv = kv_lora_rank.
The latent row of a token is `[c (r_kv, normed) | k_r (d_r, raw)]`. Softmax scale
1/sqrt(d_n + d_r) in both forms.
"""

from dataclasses import dataclass

import torch

from atomk31.reference.config import MlaDims
from atomk31.reference.formats import round_to_e4m3
from atomk31.reference.indexer import IndexerWeights, indexer_select
from atomk31.reference.norms import rms_norm

MLA_FORMS = ("expanded", "absorbed")
LATENT_FORMATS = ("exact", "fp8")
_LATENT_FP8_SCALE = 1.0             # static per-layer scale, not calibrated (§8 #8, §9 #15)
_LATENT_NORM_EPS = 1e-6             # q_a_layernorm / kv_a_layernorm, §4.2, §9 #3


@dataclass(frozen=True)
class MlaWeights:
    """One gated MLA layer in float32: q_a_proj [r_q, D], q_a_layernorm [r_q],
    q_b_proj [H*(d_n+d_r), r_q] (head-major, [nope | lane] per head),
    kv_a_proj_with_mqa [r_kv+d_r, D] ([c | k_r]), kv_a_layernorm [r_kv],
    kv_b_proj [H*(d_n+d_v), r_kv] (head-major, [k_nope | v] per head),
    g_proj [H*d_v, D] or None (mla_use_output_gate false), o_proj [D, H*d_v]."""

    q_a_proj: torch.Tensor
    q_a_layernorm: torch.Tensor
    q_b_proj: torch.Tensor
    kv_a_proj_with_mqa: torch.Tensor
    kv_a_layernorm: torch.Tensor
    kv_b_proj: torch.Tensor
    g_proj: torch.Tensor | None
    o_proj: torch.Tensor


def mla_projections(
    x: torch.Tensor, weights: MlaWeights, dims: MlaDims
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D] -> (q_latent [T, r_q] normed (also the indexer's input), q [T, H, d_n+d_r],
    latent [T, r_kv+d_r] = [rms_norm(c) | k_r])."""
    q_latent = rms_norm(x @ weights.q_a_proj.T, weights.q_a_layernorm, _LATENT_NORM_EPS)
    q = (q_latent @ weights.q_b_proj.T).view(x.shape[0], dims.num_heads, dims.qk_nope_head_dim + dims.qk_rope_head_dim)
    kv = x @ weights.kv_a_proj_with_mqa.T
    c = rms_norm(kv[:, : dims.kv_lora_rank], weights.kv_a_layernorm, _LATENT_NORM_EPS)
    return q_latent, q, torch.cat([c, kv[:, dims.kv_lora_rank :]], dim=-1)


def _split_kv_b(kv_b_proj: torch.Tensor, dims: MlaDims) -> tuple[torch.Tensor, torch.Tensor]:
    """W_uk [H, d_n, r_kv] and W_uv [H, d_v, r_kv] from kv_b_proj."""
    per_head = kv_b_proj.view(dims.num_heads, dims.qk_nope_head_dim + dims.v_head_dim, dims.kv_lora_rank)
    return per_head[:, : dims.qk_nope_head_dim], per_head[:, dims.qk_nope_head_dim :]


def _masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of scores [H, T, S] restricted to allowed [T, S]."""
    return torch.softmax(scores.masked_fill(~allowed.unsqueeze(0), float("-inf")), dim=-1)


def mla_attention_expanded(
    q: torch.Tensor, latent: torch.Tensor, kv_b_proj: torch.Tensor, allowed: torch.Tensor, dims: MlaDims
) -> torch.Tensor:
    """The definition: per-head keys `[W_uk c_s | k_r_s]` and values `W_uv c_s`.

    q [T, H, d_n+d_r], latent [S, r_kv+d_r], allowed [T, S] bool (every row needs one True).
    Returns o [T, H, d_v].
    """
    w_uk, w_uv = _split_kv_b(kv_b_proj, dims)
    c, k_lane = latent[:, : dims.kv_lora_rank], latent[:, dims.kv_lora_rank :]
    k_nope = torch.einsum("sc,hdc->shd", c, w_uk)                    # [S, H, d_n]
    values = torch.einsum("sc,hdc->shd", c, w_uv)                    # [S, H, d_v]
    q_nope, q_lane = q[..., : dims.qk_nope_head_dim], q[..., dims.qk_nope_head_dim :]
    scores = torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_lane, k_lane)
    scores = scores * (dims.qk_nope_head_dim + dims.qk_rope_head_dim) ** -0.5
    return torch.einsum("hts,shd->thd", _masked_softmax(scores, allowed), values)


def mla_attention_absorbed(
    q: torch.Tensor, latent: torch.Tensor, kv_b_proj: torch.Tensor, allowed: torch.Tensor, dims: MlaDims
) -> torch.Tensor:
    """Weight absorption: MQA with one (r_kv+d_r)-wide key head on the latent rows; W_uk folded
    into the query, W_uv applied after the softmax. Same arguments and result as
    `mla_attention_expanded`; the scale stays 1/sqrt(d_n + d_r)."""
    w_uk, w_uv = _split_kv_b(kv_b_proj, dims)
    q_absorbed = torch.cat(
        [torch.einsum("thd,hdc->thc", q[..., : dims.qk_nope_head_dim], w_uk), q[..., dims.qk_nope_head_dim :]], dim=-1
    )                                                                 # [T, H, r_kv+d_r]
    scores = torch.einsum("thc,sc->hts", q_absorbed, latent) * (dims.qk_nope_head_dim + dims.qk_rope_head_dim) ** -0.5
    latent_out = torch.einsum("hts,sc->thc", _masked_softmax(scores, allowed), latent[:, : dims.kv_lora_rank])
    return torch.einsum("thc,hdc->thd", latent_out, w_uv)


def gated_mla(
    x: torch.Tensor,
    weights: MlaWeights,
    dims: MlaDims,
    indexer: IndexerWeights | None = None,
    index_topk: int | None = None,
    index_key_format: str = "exact",
    latent_format: str = "exact",
    fp8_variant: str = "e4m3fn",
    form: str = "expanded",
) -> torch.Tensor:
    """Gated MLA (+ indexer) of one sequence at positions 0..T-1: x [T, D] normed -> [T, D].

    With `indexer` weights each query attends to its top-`index_topk` keys (§4.6); without,
    dense causal (plain K3, §9 #13). `index_key_format` simulates the index-key cache format;
    `latent_format` "fp8" rounds the latent rows to e4m3 with the static scale 1.0 (§9 #15).
    `form` "expanded" (the definition) or "absorbed". The output gate sigmoid(g_proj x)
    multiplies the H*d_v channels before o_proj.
    """
    if form not in MLA_FORMS:
        raise ValueError(f"form must be one of {MLA_FORMS}, got {form!r}")
    if latent_format not in LATENT_FORMATS:
        raise ValueError(f"latent_format must be one of {LATENT_FORMATS}, got {latent_format!r}")
    num_tokens = x.shape[0]
    q_latent, q, latent = mla_projections(x, weights, dims)
    if latent_format == "fp8":
        latent = round_to_e4m3(latent / _LATENT_FP8_SCALE, fp8_variant) * _LATENT_FP8_SCALE
    if indexer is None:
        allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=x.device).tril()
    elif index_topk is None:
        raise ValueError("gated_mla got indexer weights but index_topk=None; pass the config's index_topk")
    else:
        allowed = indexer_select(x, q_latent, indexer, index_topk, index_key_format, fp8_variant)
    attention = mla_attention_expanded if form == "expanded" else mla_attention_absorbed
    o = attention(q, latent, weights.kv_b_proj, allowed, dims).reshape(num_tokens, dims.num_heads * dims.v_head_dim)
    if weights.g_proj is not None:
        o = o * torch.sigmoid(x @ weights.g_proj.T)
    return o @ weights.o_proj.T
