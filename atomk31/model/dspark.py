"""The DSpark draft in engine form (MODEL_SPEC §5.3-§5.5): context rows and the block pass.

The draft's latent rows live in the target's packed cache rows as extra per-layer pages (no
index keys; `cache/layout.py`), written through the target's block tables and slot mapping:

* `write_context(aux, positions, slots, caches, ops)`: after every target forward, each token's
  context row per draft layer, `[rms_norm(c) | rope(k_r)]` of the projected tapped target
  states (§5.4); every layer projects the same context vector with its own `kv_a_proj`.
* `block_logits(batch, caches, ops)`: one parallel pass over the block rows `[x_a, mask, ...]`
  of every request (§5.5): each layer writes its block rows at p+1..p+Tb, then attends
  non-causally over the request's rows 0..p+Tb (the dense MLA bound of every block row is the
  block's last position), ungated, with YaRN RoPE on the 64-lane of queries and cached keys.
  Returns the base logits U through the target's LM head.
* `markov_bias(previous)`: the first-order Markov term `W1[x_{j-1}] W2ᵀ` added to U_j before
  each pick (the proposer in engine/speculative.py does the sequential part).

Precision: activations in the compute dtype, norms and softmax in fp32 (ops), rotary angles
in float64 (positions reach 2^20: an fp32 angle would be off by ~0.06 rad there), logits fp32.
The Markov bias is a compute-dtype GEMV returned as fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from atomk31.cache import MLACacheView
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable
from atomk31.quant import quantize_fp8
from atomk31.speculative_config import DraftConfig


@dataclass
class DraftBatch:
    """The block rows of one block pass: request r's rows are `cu_seqlens[r]:cu_seqlens[r+1]`.

    positions: the row's absolute position (p+1+j), for RoPE and the slot it writes;
    key_positions: the last key each row sees (p+Tb: the block is non-causal, §5.5).
    """

    input_ids: torch.Tensor        # int64 [T]: the anchor, then mask tokens
    positions: torch.Tensor        # int64 [T]
    key_positions: torch.Tensor    # int64 [T]
    token_request: torch.Tensor    # int32 [T]
    block_tables: torch.Tensor     # int32 [N, max_blocks], -1 padded
    slot_mapping: torch.Tensor     # int64 [T]
    block_size: int
    max_position: int              # max(key_positions), on the host
    rows_per_request: int = 1      # gcd of the requests' row counts (dense_mla's hint)


def yarn_mscale(factor: float, mscale: float) -> float:
    """`0.1 μ ln s + 1` for s > 1, else 1 (§5.3)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_inverse_frequencies(config: DraftConfig) -> torch.Tensor:
    """float64 [d_r / 2]: θ^(-2i/d_r) blended towards that / factor by YaRN's ramp (§5.3)."""
    rope, d_r = config.rope, config.qk_rope_head_dim
    base = rope.theta ** (-torch.arange(0, d_r, 2, dtype=torch.float64) / d_r)

    def correction_dim(rotations: float) -> float:
        return (d_r * math.log(rope.original_max_position_embeddings / (2 * math.pi * rotations))
                / (2 * math.log(rope.theta)))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), d_r - 1)
    ramp = ((torch.arange(d_r // 2, dtype=torch.float64) - low)
            / (high - low if high != low else 0.001)).clamp(0, 1)
    return base * (1 - ramp) + base / rope.factor * ramp


class DraftLayer:
    """One draft decoder layer: ungated MLA with YaRN RoPE, then a SwiGLU MLP (§5.3)."""

    def __init__(self, config: DraftConfig, weights: WeightSource, layer: int):
        p, a = f"layers.{layer}.", f"layers.{layer}.self_attn."
        self.num_heads, self.nope_dim = config.num_attention_heads, config.qk_nope_head_dim
        self.kv_rank, self.v_dim = config.kv_lora_rank, config.v_head_dim
        self.eps = config.rms_norm_eps
        self.input_norm = weights.take(p + "input_layernorm.weight")
        self.post_norm = weights.take(p + "post_attention_layernorm.weight")
        self.q_a_proj = weights.take_linear(a + "q_a_proj.weight")
        self.q_a_norm = weights.take(a + "q_a_layernorm.weight")
        self.q_b_proj = weights.take_linear(a + "q_b_proj.weight")
        self.kv_a_proj = weights.take_linear(a + "kv_a_proj_with_mqa.weight")
        self.kv_a_norm = weights.take(a + "kv_a_layernorm.weight")
        kv_b = weights.take(a + "kv_b_proj.weight").view(self.num_heads, -1, self.kv_rank)
        self.w_uk = kv_b[:, : self.nope_dim].contiguous()                  # [H, d_n, r_kv]
        self.w_uv = kv_b[:, self.nope_dim:].contiguous()                   # [H, d_v, r_kv]
        self.o_proj = weights.take_linear(a + "o_proj.weight")
        self.gate_up_proj = weights.take_linear([p + "mlp.gate_proj.weight",
                                                 p + "mlp.up_proj.weight"])
        self.down_proj = weights.take_linear(p + "mlp.down_proj.weight")

    def latent_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    rope_interleave: bool, ops: OpTable) -> torch.Tensor:
        """[rms_norm(c) | rope(k_r)] [T, 576] of x [T, D] (a context or a block row)."""
        kv = self.kv_a_proj(x, ops)
        latent = ops.rms_norm(kv[:, : self.kv_rank], self.kv_a_norm, self.eps)
        return torch.cat([latent, rotate(kv[:, self.kv_rank:], cos, sin, rope_interleave)], -1)

    def mlp(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        gate, up = self.gate_up_proj(x, ops).chunk(2, dim=-1)
        return self.down_proj((F.silu(gate.float()) * up.float()).to(x.dtype), ops)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """Rotary embedding of x [T, ..., d_r] by cos, sin [T, d_r/2] (fp32): pairs (2i, 2i+1), or
    the halves (i, i + d_r/2) when not interleaved (§5.3); fp32 math, x's dtype out."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin, xf = cos.view(shape), sin.view(shape), x.float()
    if interleaved:
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    else:
        x0, x1 = xf.chunk(2, dim=-1)
        out = torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.to(x.dtype)


def write_latent_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, cache: MLACacheView) -> None:
    """Store latent rows [T, 576] at slots [T] (all valid) of one draft layer's pages: an fp8
    latent as kv_write stores the target's (clamp / scale, RNE, §6.1), no index key (§5.4).
    Plain indexing: no host read, so a graph may capture it."""
    block_size = cache.latent.shape[1]
    values = rows.float()
    if cache.latent.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        variant = "e4m3fnuz" if cache.latent.dtype == torch.float8_e4m3fnuz else "e4m3fn"
        values = quantize_fp8(values, cache.latent_scale, variant)
    cache.latent[slot_mapping // block_size, slot_mapping % block_size] = values.to(
        cache.latent.dtype)


class DSparkDraft:
    """The draft's weights in the compute dtype and its two passes (module docstring)."""

    OPS = ("rms_norm", "dense_mla")

    def __init__(self, config: DraftConfig, tensors: dict[str, torch.Tensor],
                 embed: torch.Tensor, lm_head: torch.Tensor, dtype: torch.dtype,
                 device: torch.device):
        weights = WeightSource(dict(tensors), dtype, device)
        self.config = config
        self.embed, self.lm_head = embed, lm_head           # the target's, shared (§5.2)
        self.eps = config.rms_norm_eps
        self.context_proj = weights.take_linear("context_proj.weight")
        self.context_norm = weights.take("context_norm.weight")
        self.layers = [DraftLayer(config, weights, i) for i in range(config.num_hidden_layers)]
        self.final_norm = weights.take("final_norm.weight")
        self.markov_w1 = weights.take("markov_head.markov_w1.weight")
        self.markov_w2 = weights.take("markov_head.markov_w2.weight")
        self.inverse_frequencies = yarn_inverse_frequencies(config).to(device)
        rope = config.rope
        self.rope_scale = (yarn_mscale(rope.factor, rope.mscale)
                           / yarn_mscale(rope.factor, rope.mscale_all_dim))
        self.softmax_scale = ((config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
                              * yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos, sin [T, d_r/2] at int64 positions [T], angles formed in float64."""
        angle = positions.double()[:, None] * self.inverse_frequencies[None, :]
        return ((angle.cos() * self.rope_scale).float(), (angle.sin() * self.rope_scale).float())

    @torch.inference_mode()
    def write_context(self, aux: torch.Tensor, positions: torch.Tensor,
                      slot_mapping: torch.Tensor, caches: list[MLACacheView],
                      ops: OpTable) -> None:
        """aux [T, n*D]: the target's prefix after each tapped layer, concatenated in
        target_layer_ids order, of the tokens at `positions` [T] -> their context rows in
        every draft layer's pages at `slot_mapping` [T] (§5.4)."""
        ctx = ops.rms_norm(self.context_proj(aux, ops), self.context_norm, self.eps)
        cos, sin = self.rope_tables(positions)
        for layer, cache in zip(self.layers, caches):
            rows = layer.latent_rows(ctx, cos, sin, self.config.rope_interleave, ops)
            write_latent_rows(rows, slot_mapping, cache)

    @torch.inference_mode()
    def block_logits(self, batch: DraftBatch, caches: list[MLACacheView],
                     ops: OpTable) -> torch.Tensor:
        """The base logits U [T, V] fp32 of every block row (§5.5)."""
        interleave, H = self.config.rope_interleave, self.config.num_attention_heads
        cos, sin = self.rope_tables(batch.positions)
        h = self.embed[batch.input_ids]
        for layer, cache in zip(self.layers, caches):
            x = ops.rms_norm(h, layer.input_norm, self.eps)
            write_latent_rows(layer.latent_rows(x, cos, sin, interleave, ops),
                              batch.slot_mapping, cache)
            cq = ops.rms_norm(layer.q_a_proj(x, ops), layer.q_a_norm, self.eps)
            q = layer.q_b_proj(cq, ops).view(x.shape[0], H, -1)          # [T, H, d_n + d_r]
            q_nope = torch.einsum("thd,hdc->thc", q[..., : layer.nope_dim], layer.w_uk)
            q_abs = torch.cat([q_nope, rotate(q[..., layer.nope_dim:], cos, sin, interleave)], -1)
            o_latent, _ = ops.dense_mla(q_abs, cache.latent, cache.latent_scale,
                                        batch.block_tables, batch.token_request,
                                        batch.key_positions, batch.block_size,
                                        self.softmax_scale, max_position=batch.max_position,
                                        rows_per_request=batch.rows_per_request)
            o = torch.einsum("thc,hdc->thd", o_latent.to(x.dtype), layer.w_uv)
            h = _add(h, layer.o_proj(o.reshape(x.shape[0], -1), ops))
            h = _add(h, layer.mlp(ops.rms_norm(h, layer.post_norm, self.eps), ops))
        return (ops.rms_norm(h, self.final_norm, self.eps) @ self.lm_head.T).float()

    def markov_bias(self, previous: torch.Tensor) -> torch.Tensor:
        """W1[previous] · W2ᵀ: fp32 [N, V] for previous tokens int64 [N] (§5.5)."""
        return (self.markov_w1[previous] @ self.markov_w2.T).float()


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Residual adds in fp32, rounded once to the stream's dtype (as the target's, §4.3)."""
    return (a.float() + b.float()).to(a.dtype)
