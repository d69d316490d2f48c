"""The trainer's gated MLA with the DSA indexer (MODEL_SPEC §4.5, §4.6); checkpoint names under
`self_attn.` and `self_attn.indexer.`.

Attention runs in the expanded form (per-head keys `[W_uk c | k_r]`, values `W_uv c`) through
`scaled_dot_product_attention`: causal and dense while the indexer warms up, or restricted to each
query's top-`index_topk` keys by the indexer's scores (`sparse=True`, the selection the engine
makes; with `p + 1 <= index_topk` every causal key is kept, so short sequences are dense either
way).

The indexer learns as DeepSeek-V3.2's does: its inputs are detached from the main model, and its
loss is the KL divergence from the main attention distribution (the sum over heads, normalised)
to the indexer's distribution `softmax_s I(t, s)`, over all causal keys during the dense
warm-up and over the selected keys afterwards. The loss is computed for a sample of query rows
(`kl_rows`), since the full T x T distributions of a long sequence are not needed to learn it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atomk31.config import ModelConfig
from atomk31.demo.train.layers import RMSNorm, layer_norm

LATENT_NORM_EPS = 1e-6
INDEX_NORM_EPS = 1e-6
FP8_MAX = 448.0            # e4m3fn, the GPU cache format (MODEL_SPEC §6.1)
FP8_SCALE_FLOOR = 1e-4     # §4.6.1
# Query rows scored at a time when the sparse selection is built (bounds [rows, H_I, T] scratch).
SELECTION_ROWS_PER_STEP = 1024


class Indexer(nn.Module):
    """§4.6: `I(t, s) = sum_h w_h(t) relu(q_h(t) . k_s)`, no rotary anywhere."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        heads, head_dim = config.index_n_heads, config.index_head_dim
        assert heads is not None and head_dim is not None, "the indexer needs index_* fields"
        self.num_heads, self.head_dim = heads, head_dim
        self.wq_b = nn.Linear(config.q_lora_rank, heads * head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=INDEX_NORM_EPS)
        self.weights_proj = nn.Linear(config.hidden_size, heads, bias=False)

    def project(self, x: torch.Tensor, q_latent: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, H_I, d_I], k [B, T, d_I], head weights [B, T, H_I]; float32."""
        b, t, _ = x.shape
        q = self.wq_b(q_latent).float().view(b, t, self.num_heads, self.head_dim)
        k = layer_norm(self.wk(x), self.k_norm)
        weights = self.weights_proj(x).float() * (self.num_heads * self.head_dim) ** -0.5
        return q, k, weights


def round_to_fp8(x: torch.Tensor, scale: torch.Tensor | float = 1.0) -> torch.Tensor:
    """x rounded to e4m3fn with `scale` (RNE, saturating), as the engine's FP8 caches store it."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


def fp8_index_values(x: torch.Tensor) -> torch.Tensor:
    """Index keys [.., d_I] or queries [.., H_I, d_I] at their FP8 cache values: one scale
    `max(amax, 1e-4) / 448` per row of 128 (§4.6.1, §9 #4)."""
    rows = x.float().unflatten(-1, (-1, 128))
    scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(FP8_SCALE_FLOOR) / FP8_MAX
    return round_to_fp8(rows, scale).flatten(-2)


def index_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor,
                 query_positions: torch.Tensor) -> torch.Tensor:
    """I [B, R, T] for query rows q [B, R, H_I, d_I] at positions [B, R]; -inf for future keys."""
    scores = torch.einsum("brh,brhs->brs", weights,
                          torch.relu(torch.einsum("brhd,bsd->brhs", q, k)))
    future = torch.arange(k.shape[1], device=k.device).view(1, 1, -1) > query_positions.unsqueeze(-1)
    return scores.masked_fill(future, float("-inf"))


@torch.no_grad()
def topk_selection(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, topk: int
                   ) -> torch.Tensor:
    """Allowed-key mask [B, T, T]: each query's top `min(topk, p + 1)` causal keys by index
    score over FP8 keys and queries (the engine's default index cache), ties to the lower
    position and -0.0 equal to +0.0, as the engine selects (§4.6)."""
    q, k = fp8_index_values(q), fp8_index_values(k)
    b, t = k.shape[:2]
    allowed = torch.zeros(b, t, t, dtype=torch.bool, device=k.device)
    positions = torch.arange(t, device=k.device)
    for start in range(0, t, SELECTION_ROWS_PER_STEP):
        rows = slice(start, min(t, start + SELECTION_ROWS_PER_STEP))
        scores = index_scores(q[:, rows], k, weights[:, rows], positions[rows].expand(b, -1)) + 0.0
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
        chosen = order[..., : min(topk, t)]
        allowed[:, rows].scatter_(-1, chosen, True)
    return allowed & torch.ones(t, t, dtype=torch.bool, device=k.device).tril()


class GatedMla(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads, self.nope, self.rope = heads, config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.kv_rank = config.v_head_dim, config.kv_lora_rank
        self.topk = config.index_topk
        self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, LATENT_NORM_EPS)
        self.q_b_proj = nn.Linear(config.q_lora_rank, heads * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_rank, heads * (self.nope + self.v_dim), bias=False)
        self.g_proj = nn.Linear(hidden, heads * self.v_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=False)
        self.indexer = Indexer(config) if config.has_indexer else None
        self.quantize = False          # latent rows at FP8 values (straight-through), see _qkv

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q_latent [B, T, r_q]; q, k [B, H, T, d_n + d_r]; v [B, H, T, d_v]."""
        b, t, _ = x.shape
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(b, t, self.num_heads, self.nope + self.rope)
        kv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(kv[..., : self.kv_rank])
        k_lane = kv[..., self.kv_rank:].float()                  # raw 64-lane, no rotary (§4.5)
        if self.quantize:     # the FP8 latent cache (static scale 1.0, §7.1), straight-through
            c = c + (round_to_fp8(c.detach()) - c.detach())
            k_lane = k_lane + (round_to_fp8(k_lane.detach()) - k_lane.detach())
        kv_b = self.kv_b_proj(c).view(b, t, self.num_heads, self.nope + self.v_dim)
        k = torch.cat([kv_b[..., : self.nope],
                       k_lane.unsqueeze(2).expand(-1, -1, self.num_heads, -1).to(kv_b.dtype)], -1)
        return q_latent, q.transpose(1, 2), k.transpose(1, 2), kv_b[..., self.nope:].transpose(1, 2)

    def forward(self, x: torch.Tensor, sparse: bool, kl_rows: torch.Tensor | None,
                kl_valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, D] -> (output [B, T, D], indexer KL loss or None).

        kl_rows [B, R] (positions whose distributions train the indexer), kl_valid [B, R] bool.
        """
        b, t, _ = x.shape
        q_latent, q, k, v = self._qkv(x)
        allowed = None
        index_qkw = None
        if self.indexer is not None:
            index_qkw = self.indexer.project(x.detach(), q_latent.detach())
            if sparse and t > self.topk:
                allowed = topk_selection(*index_qkw, self.topk)
        scale = (self.nope + self.rope) ** -0.5
        v_padded = F.pad(v, (0, q.shape[-1] - v.shape[-1]))    # one head dim lets flash kernels run
        if allowed is None:
            o = F.scaled_dot_product_attention(q, k.to(q.dtype), v_padded.to(q.dtype),
                                               is_causal=True, scale=scale)
        else:
            o = F.scaled_dot_product_attention(q, k.to(q.dtype), v_padded.to(q.dtype),
                                               attn_mask=allowed.unsqueeze(1), scale=scale)
        o = o[..., : self.v_dim].transpose(1, 2).reshape(b, t, -1)
        o = o * torch.sigmoid(self.g_proj(x).float())
        loss = None
        if index_qkw is not None and kl_rows is not None:
            loss = self._indexer_kl(q, k, index_qkw, allowed, kl_rows, kl_valid, scale)
        return self.o_proj(o), loss

    def _indexer_kl(self, q: torch.Tensor, k: torch.Tensor, index_qkw: tuple[torch.Tensor, ...],
                    allowed: torch.Tensor | None, rows: torch.Tensor, valid: torch.Tensor,
                    scale: float) -> torch.Tensor:
        """KL(main attention over heads || indexer distribution) at the sampled query rows."""
        b, t = k.shape[0], k.shape[2]
        index_q, index_k, index_w = index_qkw
        gather = rows.view(b, -1, 1, 1)
        with torch.no_grad():
            q_rows = q.transpose(1, 2).gather(1, gather.expand(-1, -1, *q.shape[1:2], q.shape[-1]))
            logits = torch.einsum("brhd,bhsd->bhrs", q_rows.float(), k.float()) * scale
            keep = torch.arange(t, device=k.device).view(1, 1, -1) <= rows.unsqueeze(-1)
            if allowed is not None:
                keep = keep & allowed.gather(1, rows.unsqueeze(-1).expand(-1, -1, t))
            logits = logits.masked_fill(~keep.unsqueeze(1), float("-inf"))
            target = torch.softmax(logits, dim=-1).mean(dim=1)                    # [B, R, T]
        index_rows = index_q.gather(1, gather.expand(-1, -1, *index_q.shape[2:]))
        weight_rows = index_w.gather(1, rows.unsqueeze(-1).expand(-1, -1, index_w.shape[-1]))
        scores = index_scores(index_rows, index_k, weight_rows, rows)
        scores = scores.masked_fill(~keep, float("-inf"))
        log_q = torch.log_softmax(scores, dim=-1)
        terms = torch.where(target > 0, target * (torch.log(target.clamp_min(1e-30)) - log_q), 0.0)
        per_row = terms.sum(dim=-1)                                                 # [B, R]
        return (per_row * valid).sum() / valid.sum().clamp_min(1)
