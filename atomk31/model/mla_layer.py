"""The gated NoPE MLA mixer with its DSA lightning indexer, in engine form (MODEL_SPEC §4.5–4.6).

Per step: write each new token's 576-wide latent row and its index key into the paged cache,
then attend. Attention always runs in the absorbed form (MQA over the cached latent rows), for
prefill and decode alike. Every query row attends either to all its causal keys (when the whole
batch is within `index_topk`, where sparse equals dense, §4.6) or to the top-k positions its
indexer scores select (k = min(index_topk, p + 1), ties to the lower position).
"""

from __future__ import annotations

import torch

from atomk31.cache import MLACacheView
from atomk31.config import ModelConfig
from atomk31.model.batch import ForwardBatch
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable

LATENT_NORM_EPS = 1e-6   # q_a_layernorm / kv_a_layernorm (§9 #3)
INDEX_KEY_NORM_EPS = 1e-6


class MLAMixer:
    OPS = ("rms_norm", "layer_norm", "kv_write", "dense_mla", "sparse_mla", "indexer_score",
           "topk_slots", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str,
                 index_format: str, fp8_variant: str):
        a = prefix + "self_attn."
        self.num_heads = config.num_attention_heads
        self.nope_dim = config.qk_nope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        self.softmax_scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
        self.has_gate = config.mla_use_output_gate
        self.q_a_proj = weights.take_linear(a + "q_a_proj.weight")
        self.q_a_norm = weights.take(a + "q_a_layernorm.weight")
        self.q_b_proj = weights.take_linear(a + "q_b_proj.weight")
        self.kv_a_proj = weights.take_linear(a + "kv_a_proj_with_mqa.weight")
        self.kv_a_norm = weights.take(a + "kv_a_layernorm.weight")
        # kv_b rows are head-major [k_nope 128 | v 128] (§3.2): split into the absorbed factors
        # (never applied as a linear, so a PTPC-quantized kv_b is used weight-only)
        kv_b = weights.take_linear(a + "kv_b_proj.weight").dequantized(weights.dtype)
        kv_b = kv_b.view(self.num_heads, -1, self.kv_rank)
        self.w_uk = kv_b[:, : self.nope_dim].contiguous()                 # [H, 128, 512]
        self.w_uv = kv_b[:, self.nope_dim:].contiguous()                  # [H, 128, 512]
        self.g_proj = weights.take_linear(a + "g_proj.weight") if self.has_gate else None
        self.o_proj = weights.take_linear(a + "o_proj.weight")
        self.index_topk = config.index_topk
        if config.has_indexer:
            i = a + "indexer."
            self.index_heads = config.index_n_heads
            self.index_dim = config.index_head_dim
            self.w_index_q = weights.take(i + "wq_b.weight")
            self.w_index_k = weights.take(i + "wk.weight")
            self.index_k_norm_w = weights.take(i + "k_norm.weight")
            self.index_k_norm_b = weights.take(i + "k_norm.bias")
            self.w_index_weights = weights.take(i + "weights_proj.weight")
        self.index_format = index_format
        self.fp8_variant = fp8_variant

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: MLACacheView,
                ops: OpTable) -> torch.Tensor:
        """x: [T, D] normed layer input -> [T, D]; writes the batch's rows into `cache`."""
        H = self.num_heads
        T = x.shape[0]
        cq = ops.rms_norm(self.q_a_proj(x, ops), self.q_a_norm, LATENT_NORM_EPS)
        q = self.q_b_proj(cq, ops).view(T, H, -1)                      # [T, H, 192]
        kv = self.kv_a_proj(x, ops)                                      # [T, 576]
        latent = torch.cat([ops.rms_norm(kv[:, : self.kv_rank], self.kv_a_norm, LATENT_NORM_EPS),
                            kv[:, self.kv_rank:]], dim=-1)
        index_key = None
        if self.index_topk is not None:
            index_key = ops.layer_norm(x @ self.w_index_k.T, self.index_k_norm_w,
                                       self.index_k_norm_b, INDEX_KEY_NORM_EPS)
        # index keys are written even where scoring is skipped (§4.6)
        ops.kv_write(latent, index_key, batch.slot_mapping, cache.latent, cache.latent_scale,
                     cache.index_values, cache.index_scales, self.index_format, self.fp8_variant)
        # absorbed query: [q_nope · W_uk | q_lane] (§4.5 "Weight absorption")
        q_nope = torch.einsum("thd,hdc->thc", q[..., : self.nope_dim], self.w_uk)
        q_abs = torch.cat([q_nope, q[..., self.nope_dim:]], dim=-1)       # [T, H, 576]
        if self.index_topk is None or batch.max_position + 1 <= self.index_topk:
            o_latent, _ = ops.dense_mla(q_abs, cache.latent, cache.latent_scale,
                                        batch.block_tables, batch.token_request, batch.positions,
                                        batch.block_size, self.softmax_scale,
                                        max_position=batch.max_position,
                                        rows_per_request=batch.rows_per_request)
        else:
            slots = self._select(x, cq, batch, cache, ops)
            o_latent, _ = ops.sparse_mla(q_abs, cache.latent, cache.latent_scale, slots,
                                         self.softmax_scale)
        o = torch.einsum("thc,hdc->thd", o_latent.to(x.dtype), self.w_uv)  # [T, H, 128]
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x, ops)).view(T, H, self.v_dim)
        return self.o_proj(o.reshape(T, H * self.v_dim), ops)

    def _select(self, x: torch.Tensor, cq: torch.Tensor, batch: ForwardBatch,
                cache: MLACacheView, ops: OpTable) -> torch.Tensor:
        """The cache slots each query row attends to: top-k of its indexer scores (§4.6)."""
        T = x.shape[0]
        q_index = (cq @ self.w_index_q.T).view(T, self.index_heads, self.index_dim)
        head_weights = (x @ self.w_index_weights.T).float() * (
            self.index_heads ** -0.5 * self.index_dim ** -0.5)
        scores = ops.indexer_score(q_index, head_weights, cache.index_values, cache.index_scales,
                                   self.index_format, self.fp8_variant, batch.block_tables,
                                   batch.token_request, batch.positions, batch.block_size,
                                   num_positions=batch.max_position + 1)
        k = min(self.index_topk, batch.max_position + 1)
        return ops.topk_slots(scores, k, batch.positions + 1, batch.block_tables,
                              batch.token_request, batch.block_size)
