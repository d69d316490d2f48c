"""The trainable DSpark draft (MODEL_SPEC §5.3-§5.5), batched over many blocks per sequence.

Parameters carry the checkpoint's names (§5.2), so `state_dict()` is the draft checkpoint. The
target's embedding and LM head are passed in, never owned (the engine shares the target's).

`block_logits` runs the training form of the block pass: every sequence of a padded batch has
its context rows (positions 0..T-1, from the tapped target states) and K blocks of Tb rows
`[anchor, mask, ...]` at positions a_k..a_k+Tb-1. Block k's rows attend to context rows
0..a_k-1 and to the Tb rows of block k only, non-causally, which is the key set of one engine
block pass with p = a_k - 1; the K blocks of a sequence share one attention call through a
mask. MLA runs absorbed (queries and outputs mapped through kv_b_proj, attention over the
576-wide latent rows), which equals the oracle's expanded form (`atomk31.reference.dspark`, whose
YaRN rotation this reuses) and costs a fraction of it over long contexts. Float32 throughout.

Dims: B sequences, T context positions, Q = K * Tb block rows, D hidden, H heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from atomk31.demo.train.layers import RMSNorm
from atomk31.reference.dspark import DraftReferenceConfig, apply_yarn_rope, yarn_mscale
from atomk31.speculative_config import DraftConfig


def reference_config(config: DraftConfig) -> DraftReferenceConfig:
    """The rope and shape fields the oracle's helpers read, from the engine's draft config."""
    rope = config.rope
    return DraftReferenceConfig(
        num_hidden_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
        qk_nope_head_dim=config.qk_nope_head_dim, qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim, kv_lora_rank=config.kv_lora_rank,
        rms_norm_eps=config.rms_norm_eps, rope_theta=rope.theta, rope_factor=rope.factor,
        rope_original_length=rope.original_max_position_embeddings,
        beta_fast=rope.beta_fast, beta_slow=rope.beta_slow, mscale=rope.mscale,
        mscale_all_dim=rope.mscale_all_dim, rope_interleave=config.rope_interleave,
        target_layer_ids=config.target_layer_ids, mask_token_id=config.mask_token_id)


def _rope(x: torch.Tensor, positions: torch.Tensor, config: DraftReferenceConfig) -> torch.Tensor:
    """x [B, N, ..., d_r] rotated at positions [B, N]."""
    flat = apply_yarn_rope(x.reshape(-1, *x.shape[2:]), positions.reshape(-1), config)
    return flat.view(x.shape)


class DraftAttention(nn.Module):
    """Ungated MLA with YaRN RoPE on the 64-lane of queries and keys (§5.3)."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        d, h, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
        self.heads, self.nope, self.rope = h, config.qk_nope_head_dim, config.qk_rope_head_dim
        self.value, self.rank = config.v_head_dim, config.kv_lora_rank
        self.q_a_proj = nn.Linear(d, config.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, h * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank, eps)
        self.kv_b_proj = nn.Linear(self.rank, h * (self.nope + self.value), bias=False)
        self.o_proj = nn.Linear(h * self.value, d, bias=False)

    def latent_rows(self, x: torch.Tensor, positions: torch.Tensor,
                    rope: DraftReferenceConfig) -> torch.Tensor:
        """[rms_norm(c) | rope(k_r)] of x [B, N, D] at positions [B, N] (§5.4)."""
        kv = self.kv_a_proj_with_mqa(x)
        return torch.cat([self.kv_a_layernorm(kv[..., :self.rank]),
                          _rope(kv[..., self.rank:], positions, rope)], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                visible: torch.Tensor, rope: DraftReferenceConfig) -> torch.Tensor:
        """Block rows x [B, Q, D] (normed) at positions [B, Q] over latent keys [B, S, r+d_r]
        where visible [B, Q, S] -> [B, Q, D]."""
        b, q_len, s = x.shape[0], x.shape[1], keys.shape[1]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, q_len, self.heads, -1)
        kv_b = self.kv_b_proj.weight.view(self.heads, self.nope + self.value, self.rank)
        q_latent = torch.einsum("bqhd,hdc->bhqc", q[..., :self.nope], kv_b[:, :self.nope])
        q_lane = _rope(q[..., self.nope:], positions, rope).transpose(1, 2)
        query = torch.cat([q_latent, q_lane], dim=-1)                     # [B, H, Q, r+d_r]
        scale = (self.nope + self.rope) ** -0.5 * yarn_mscale(rope.rope_factor,
                                                             rope.mscale_all_dim) ** 2
        key = keys.unsqueeze(1).expand(b, self.heads, s, keys.shape[-1])
        o_latent = F.scaled_dot_product_attention(query, key, key[..., :self.rank],
                                                  attn_mask=visible.unsqueeze(1), scale=scale)
        o = torch.einsum("bhqc,hdc->bqhd", o_latent, kv_b[:, self.nope:])
        return self.o_proj(o.reshape(b, q_len, -1))


class SwiGlu(nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.mlp = SwiGlu(config.hidden_size, config.intermediate_size)


class MarkovHead(nn.Module):
    """The low-rank first-order bias W1[x_{j-1}] W2ᵀ (§5.5)."""

    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Embedding(vocab, rank)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(previous) @ self.markov_w2.weight.T


class TrainableDraft(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.config = config
        self.rope_config = reference_config(config)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.context_proj = nn.Linear(len(config.target_layer_ids) * config.target_hidden_size,
                                      d, bias=False)
        self.context_norm = RMSNorm(d, eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = RMSNorm(d, eps)
        self.markov_head = MarkovHead(config.vocab_size, config.markov_rank)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Linears N(0, 1/fan-in), the sublayer outputs a further 1/sqrt(2 L); the Markov head
        starts as a zero bias (W2 = 0) with W1 ~ N(0, 1), so its gradient is not zero."""
        depth_scale = 1 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = module.in_features ** -0.5
                nn.init.normal_(module.weight, std=std * (depth_scale if name.endswith(
                    ("o_proj", "down_proj")) else 1.0))
        nn.init.normal_(self.markov_head.markov_w1.weight)
        nn.init.zeros_(self.markov_head.markov_w2.weight)

    def block_logits(self, aux: torch.Tensor, block_ids: torch.Tensor, block_positions: torch.Tensor,
                     visible: torch.Tensor, embed: torch.Tensor, lm_head: torch.Tensor
                     ) -> torch.Tensor:
        """aux [B, T, n*D] (taps at positions 0..T-1); block_ids, block_positions [B, Q];
        visible [B, Q, T + Q] (context columns, then block columns) -> base logits U [B, Q, V]."""
        b, t = aux.shape[0], aux.shape[1]
        ctx = self.context_norm(self.context_proj(aux))
        context_positions = torch.arange(t, device=aux.device).expand(b, t)
        h = embed[block_ids].float()
        for layer in self.layers:
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            keys = torch.cat([attn.latent_rows(ctx, context_positions, self.rope_config),
                              attn.latent_rows(x, block_positions, self.rope_config)], dim=1)
            h = h + attn(x, block_positions, keys, visible, self.rope_config)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.final_norm(h) @ lm_head.float().T
