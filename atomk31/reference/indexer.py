"""The DSA lightning indexer: scores and top-k selection (MODEL_SPEC §4.6, §9 #4-#6).

Dims: T queries, S keys, D hidden, H_I index heads, d_I index head dim, r_q q-LoRA rank.
No rotary anywhere (NoPE), no Hadamard rotation (§8 #4).
"""

from dataclasses import dataclass

import torch

from atomk31.reference.formats import fake_quant_fp8_groups, fake_quant_mxfp4
from atomk31.reference.norms import layer_norm

INDEX_KEY_FORMATS = ("exact", "fp8", "mxfp4")
_INDEX_LAYER_NORM_EPS = 1e-6       # §9 #3


@dataclass(frozen=True)
class IndexerWeights:
    """One MLA layer's indexer in float32: wq_b [H_I*d_I, r_q], wk [d_I, D],
    k_norm_weight, k_norm_bias [d_I], weights_proj [H_I, D]."""

    wq_b: torch.Tensor
    wk: torch.Tensor
    k_norm_weight: torch.Tensor
    k_norm_bias: torch.Tensor
    weights_proj: torch.Tensor

    @property
    def num_heads(self) -> int:
        return self.weights_proj.shape[0]

    @property
    def head_dim(self) -> int:
        return self.wk.shape[0]


def indexer_projections(
    x: torch.Tensor, q_latent: torch.Tensor, weights: IndexerWeights
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index queries, keys and head weights of T tokens.

    x [T, D] is the layer input (output of input_layernorm); q_latent [T, r_q] is the normed
    q-LoRA latent `cq` (§8 #3). Returns (q [T, H_I, d_I], k [T, d_I],
    head_weights [T, H_I] = weights_proj(x) / sqrt(H_I) / sqrt(d_I)).
    """
    num_heads, head_dim = weights.num_heads, weights.head_dim
    q = (q_latent @ weights.wq_b.T).view(q_latent.shape[0], num_heads, head_dim)
    k = layer_norm(x @ weights.wk.T, weights.k_norm_weight, weights.k_norm_bias, _INDEX_LAYER_NORM_EPS)
    head_weights = (x @ weights.weights_proj.T) * num_heads**-0.5 * head_dim**-0.5
    return q, k, head_weights


def simulate_index_quantization(t: torch.Tensor, key_format: str, fp8_variant: str) -> torch.Tensor:
    """Round index keys [S, d_I] or queries [T, H_I, d_I] the way the cache stores keys (§9 #4).

    "exact" returns `t`; "fp8" uses one scale per 128 values (a key row, a query head);
    "mxfp4" one E8M0 scale per 32 values (§6.3).
    """
    if key_format == "exact":
        return t
    if key_format == "fp8":
        return fake_quant_fp8_groups(t, fp8_variant)
    if key_format == "mxfp4":
        return fake_quant_mxfp4(t)
    raise ValueError(f"index_key_format must be one of {INDEX_KEY_FORMATS}, got {key_format!r}")


def indexer_scores(
    q: torch.Tensor, k: torch.Tensor, head_weights: torch.Tensor, query_positions: torch.Tensor
) -> torch.Tensor:
    """`I(t, s) = sum_h w_h(t) relu(q_h(t) . k_s)`, -inf where s > query_positions[t].

    q [T, H_I, d_I], k [S, d_I] (key s sits at position s), head_weights [T, H_I],
    query_positions [T] (int). Returns I [T, S] float.
    """
    scores = torch.einsum("th,ths->ts", head_weights, torch.relu(torch.einsum("thd,sd->ths", q, k)))
    key_positions = torch.arange(k.shape[0], device=k.device)
    is_future = key_positions.unsqueeze(0) > query_positions.unsqueeze(1)
    return scores.masked_fill(is_future, float("-inf"))


def select_topk(scores: torch.Tensor, query_positions: torch.Tensor, index_topk: int) -> torch.Tensor:
    """Allowed-key mask [T, S] (bool) of the top `min(index_topk, p + 1)` keys of each row.

    scores [T, S] from `indexer_scores` (future keys at -inf), query_positions [T]. Order:
    higher score first, equal scores -> lower position first (§4.6, §8 #6); -0.0 equals +0.0
    (§9 #6). No position is force-included.
    """
    canonical = scores + 0.0                                    # -0.0 + 0.0 = +0.0 under RNE
    order = torch.sort(canonical, dim=-1, descending=True, stable=True).indices   # stable: lower position first
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device).expand_as(order))
    keep = torch.clamp(query_positions + 1, max=index_topk)     # k = min(topk, p + 1)
    return rank < keep.unsqueeze(-1)


def indexer_select(
    x: torch.Tensor,
    q_latent: torch.Tensor,
    weights: IndexerWeights,
    index_topk: int,
    key_format: str = "exact",
    fp8_variant: str = "e4m3fn",
) -> torch.Tensor:
    """Allowed-key mask [T, T] for one sequence at positions 0..T-1 (§4.6).

    With `key_format` "fp8" or "mxfp4", keys and queries are quantized the same way before
    scoring (the engine's cache format, §9 #4); the head weights are not.
    """
    q, k, head_weights = indexer_projections(x, q_latent, weights)
    q = simulate_index_quantization(q, key_format, fp8_variant)
    k = simulate_index_quantization(k, key_format, fp8_variant)
    positions = torch.arange(x.shape[0], device=x.device)
    return select_topk(indexer_scores(q, k, head_weights, positions), positions, index_topk)
