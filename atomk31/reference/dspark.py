"""The DSpark draft of one request in float32, straight from MODEL_SPEC §5.3-§5.5.

No cache, no batching: the context rows of every position are recomputed from the target's
hidden states, the block pass attends over them and the block rows with the expanded MLA
(§4.5 without the output gate, with YaRN RoPE on the 64-lane), and the Markov head picks the
drafts one by one. Reads its own config and weights (no engine import), like the rest of the
oracle. The engine's draft is judged against it.

Dims: P = positions with final target states (0..p), Tb = block rows, D = hidden size,
H = heads, d_n / d_r / d_v = nope / rope-lane / value head dims, r_kv = kv_lora_rank, V = vocab.
"""

import json
import math
import os
from dataclasses import dataclass

import torch

from atomk31.reference.norms import rms_norm
from atomk31.reference.safetensors_io import read_text_tensors


@dataclass(frozen=True)
class DraftReferenceConfig:
    """The draft config.json fields the oracle reads (§5.1)."""

    num_hidden_layers: int
    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    rms_norm_eps: float
    rope_theta: float
    rope_factor: float
    rope_original_length: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float
    rope_interleave: bool
    target_layer_ids: tuple[int, ...]
    mask_token_id: int


def load_draft_config(path: str | os.PathLike) -> DraftReferenceConfig:
    """Read `<path>/config.json` of a DSpark draft."""
    with open(os.path.join(os.fspath(path), "config.json"), encoding="utf-8") as handle:
        raw = json.load(handle)
    rope = raw["rope_parameters"]
    if rope.get("rope_type") != "yarn":
        raise ValueError(f"the reference draft implements YaRN only (§5.3), got {rope.get('rope_type')!r}")
    return DraftReferenceConfig(
        num_hidden_layers=raw["num_hidden_layers"], num_heads=raw["num_attention_heads"],
        qk_nope_head_dim=raw["qk_nope_head_dim"], qk_rope_head_dim=raw["qk_rope_head_dim"],
        v_head_dim=raw["v_head_dim"], kv_lora_rank=raw["kv_lora_rank"],
        rms_norm_eps=float(raw["rms_norm_eps"]), rope_theta=float(rope["rope_theta"]),
        rope_factor=float(rope["factor"]), rope_original_length=int(rope["original_max_position_embeddings"]),
        beta_fast=float(rope["beta_fast"]), beta_slow=float(rope["beta_slow"]),
        mscale=float(rope["mscale"]), mscale_all_dim=float(rope["mscale_all_dim"]),
        rope_interleave=bool(raw.get("rope_interleave", True)),
        target_layer_ids=tuple(raw["target_layer_ids"]), mask_token_id=raw["mask_token_id"],
    )


def yarn_mscale(factor: float, mscale: float) -> float:
    """`ms(s, μ) = 0.1 μ ln s + 1` for s > 1, else 1 (§5.3)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_frequencies(config: DraftReferenceConfig) -> torch.Tensor:
    """The d_r / 2 rotary frequencies (float64) after YaRN's ramp between θ^(-2i/d_r) and that
    / s. Angles are formed in float64: at position 2^20 an fp32 angle is off by ~0.06 rad."""
    d_r, theta = config.qk_rope_head_dim, config.rope_theta
    i = torch.arange(d_r // 2, dtype=torch.float64)
    base = theta ** (-2.0 * i / d_r)

    def dim_of(rotations: float) -> float:
        return d_r * math.log(config.rope_original_length / (2 * math.pi * rotations)) / (2 * math.log(theta))

    low = max(math.floor(dim_of(config.beta_fast)), 0)
    high = min(math.ceil(dim_of(config.beta_slow)), d_r - 1)
    span = (high - low) if high != low else 0.001
    ramp = ((i - low) / span).clamp(0.0, 1.0)
    return base / config.rope_factor * ramp + base * (1.0 - ramp)


def apply_yarn_rope(x: torch.Tensor, positions: torch.Tensor, config: DraftReferenceConfig) -> torch.Tensor:
    """Rotate the rope lane x [T, ..., d_r] at absolute positions [T] (interleaved pairs
    (2i, 2i+1), or NeoX halves when rope_interleave is false), cos and sin scaled by
    ms(s, mscale) / ms(s, mscale_all_dim)."""
    frequencies = yarn_frequencies(config).to(positions.device)
    angle = positions.double()[:, None] * frequencies[None, :]                 # [T, d_r/2]
    scale = yarn_mscale(config.rope_factor, config.mscale) / yarn_mscale(config.rope_factor, config.mscale_all_dim)
    cos, sin = (torch.cos(angle) * scale).float(), (torch.sin(angle) * scale).float()
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.view(shape), sin.view(shape)
    if config.rope_interleave:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


class ReferenceDraft:
    """The draft's weights (float32, names as §5.2) and its forward for one request."""

    def __init__(self, config: DraftReferenceConfig, tensors: dict[str, torch.Tensor]) -> None:
        self.config = config
        self.w = tensors

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "ReferenceDraft":
        return cls(load_draft_config(path), read_text_tensors(path))

    def _latent_row(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[rms_norm(c) | rope(k_r)] of x [T, D] (§5.4): the row a position writes."""
        c = self.config
        kv = x @ self.w[f"layers.{layer}.self_attn.kv_a_proj_with_mqa.weight"].T
        latent = rms_norm(kv[:, : c.kv_lora_rank], self.w[f"layers.{layer}.self_attn.kv_a_layernorm.weight"], c.rms_norm_eps)
        return torch.cat([latent, apply_yarn_rope(kv[:, c.kv_lora_rank :], positions, c)], dim=-1)

    def context_rows(self, aux: torch.Tensor) -> list[torch.Tensor]:
        """aux [P, n*D]: the target's prefix after each tapped layer (§4.3), concatenated in
        target_layer_ids order, at positions 0..P-1 -> per draft layer the rows [P, r_kv+d_r]."""
        ctx = rms_norm(aux @ self.w["context_proj.weight"].T, self.w["context_norm.weight"], self.config.rms_norm_eps)
        positions = torch.arange(aux.shape[0])
        return [self._latent_row(i, ctx, positions) for i in range(self.config.num_hidden_layers)]

    def _attention(self, layer: int, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Ungated expanded MLA of the block rows x [Tb, D] (normed) over keys [S, r_kv+d_r],
        every key visible to every row (non-causal block, §5.5) -> [Tb, D]."""
        c, a = self.config, f"layers.{layer}.self_attn."
        d_n, d_r, H = c.qk_nope_head_dim, c.qk_rope_head_dim, c.num_heads
        q_latent = rms_norm(x @ self.w[a + "q_a_proj.weight"].T, self.w[a + "q_a_layernorm.weight"], c.rms_norm_eps)
        q = (q_latent @ self.w[a + "q_b_proj.weight"].T).view(x.shape[0], H, d_n + d_r)
        q_lane = apply_yarn_rope(q[..., d_n:], positions, c)
        kv_b = self.w[a + "kv_b_proj.weight"].view(H, d_n + c.v_head_dim, c.kv_lora_rank)
        latent, k_lane = keys[:, : c.kv_lora_rank], keys[:, c.kv_lora_rank :]
        k_nope = torch.einsum("sc,hdc->shd", latent, kv_b[:, :d_n])
        values = torch.einsum("sc,hdc->shd", latent, kv_b[:, d_n:])
        scores = torch.einsum("thd,shd->hts", q[..., :d_n], k_nope) + torch.einsum("thd,sd->hts", q_lane, k_lane)
        scale = (d_n + d_r) ** -0.5 * yarn_mscale(c.rope_factor, c.mscale_all_dim) ** 2
        o = torch.einsum("hts,shd->thd", torch.softmax(scores * scale, dim=-1), values)
        return o.reshape(x.shape[0], -1) @ self.w[a + "o_proj.weight"].T

    def block_logits(self, aux: torch.Tensor, anchor: int, num_rows: int, embed: torch.Tensor,
                     lm_head: torch.Tensor) -> torch.Tensor:
        """The base logits U [Tb, V] of one block pass (§5.5): rows [anchor, mask, ...] at
        positions P..P+Tb-1 after the P context positions of aux; embed and lm_head are the
        target's [V, D]."""
        c = self.config
        p = aux.shape[0]
        contexts = self.context_rows(aux)
        positions = torch.arange(p, p + num_rows)
        ids = torch.tensor([anchor] + [c.mask_token_id] * (num_rows - 1))
        h = embed[ids]
        for i in range(c.num_hidden_layers):
            p_ = f"layers.{i}."
            x = rms_norm(h, self.w[p_ + "input_layernorm.weight"], c.rms_norm_eps)
            keys = torch.cat([contexts[i], self._latent_row(i, x, positions)], dim=0)
            h = h + self._attention(i, x, positions, keys)
            x = rms_norm(h, self.w[p_ + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = x @ self.w[p_ + "mlp.gate_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * (x @ self.w[p_ + "mlp.up_proj.weight"].T)) @ self.w[p_ + "mlp.down_proj.weight"].T
        return rms_norm(h, self.w["final_norm.weight"], c.rms_norm_eps) @ lm_head.T

    def markov_logits(self, base: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """z_j = U_j + W1[x_{j-1}] · W2ᵀ for base U [Tb, V] and the previous tokens [Tb]."""
        return base + self.w["markov_head.markov_w1.weight"][previous] @ self.w["markov_head.markov_w2.weight"].T

    def greedy_drafts(self, base: torch.Tensor, anchor: int) -> list[int]:
        """The Markov head's argmax drafts (ties -> lowest id), one position at a time."""
        previous, drafts = anchor, []
        for j in range(base.shape[0]):
            z = self.markov_logits(base[j : j + 1], torch.tensor([previous]))[0]
            previous = int(torch.argmax(z))
            drafts.append(previous)
        return drafts
