"""The gated NoPE MLA mixer with its DSA lightning indexer, in engine form (MODEL_SPEC §4.5–4.6).

Per step: write each new token's 576-wide latent row and its index key into the paged cache,
then attend. Attention always runs in the absorbed form (MQA over the cached latent rows), for
prefill and decode alike. Every query row attends either to all its causal keys (when the whole
batch is within `index_topk`, where sparse equals dense, §4.6) or to the top-k positions its
indexer scores select (k = min(index_topk, p + 1), ties to the lower position).

Tensor parallel (``distributed/layout.py``): q_a, kv_a and the indexer are replicated (every
rank writes the whole latent row and index key of every token, and selects the same rows).
A rank computes the queries and attention of its head group (``q_b_proj`` rows, ``W_uk``) and
projects the outputs of its TP heads (``W_uv``, ``g_proj`` rows, ``o_proj`` columns: one
all-reduce). Without DCP the two sets are the same. Which rows a rank attends, and over which
keys, is one of three plans: head-sharded (every token, this rank's heads: the default),
token-sharded prefill (``mla_sharding.py``: long prefill steps under TP) and decode context
parallel (``dcp_attention.py``: this rank's share of every request's keys, all of its head
group's heads, merged by log-sum-exp).
"""

from __future__ import annotations

import torch

from atomk31.cache import MLACacheView
from atomk31.checkpoint.slices import Shard
from atomk31.config import ModelConfig
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.batch import AttentionRows, ForwardBatch
from atomk31.model.dcp_attention import dcp_attend
from atomk31.model.mla_sharding import token_sharded_attend
from atomk31.model.parallel_linear import ColumnParallelLinear, RowParallelLinear
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable

LATENT_NORM_EPS = 1e-6   # q_a_layernorm / kv_a_layernorm (§9 #3)
INDEX_KEY_NORM_EPS = 1e-6


class MLAMixer:
    OPS = ("rms_norm", "layer_norm", "kv_write", "dense_mla", "sparse_mla", "indexer_score",
           "topk_slots", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str,
                 index_format: str, fp8_variant: str, parallel: ParallelContext | None = None):
        a = prefix + "self_attn."
        self.parallel = parallel = parallel or ParallelContext.single()
        a0, a1 = parallel.layout.attention_head_range(config.num_attention_heads)
        t0, t1 = parallel.layout.tp_range(config.num_attention_heads)
        self.num_heads = a1 - a0          # heads attended here (queries, W_uk)
        self.num_out_heads = t1 - t0      # heads projected here (W_uv, gate, o_proj)
        self.nope_dim = config.qk_nope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        qk_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        self.softmax_scale = qk_dim ** -0.5
        self.has_gate = config.mla_use_output_gate
        self.q_a_proj = weights.take_linear(a + "q_a_proj.weight")
        self.q_a_norm = weights.take(a + "q_a_layernorm.weight")
        self.q_b_proj = ColumnParallelLinear(weights, a + "q_b_proj.weight", a0 * qk_dim,
                                             a1 * qk_dim)
        self.kv_a_proj = weights.take_linear(a + "kv_a_proj_with_mqa.weight")
        self.kv_a_norm = weights.take(a + "kv_a_layernorm.weight")
        # kv_b rows are head-major [k_nope 128 | v 128] (§3.2): split into the absorbed factors
        # (never applied as a linear, so a PTPC-quantized kv_b is used weight-only)
        kv_dim = self.nope_dim + self.v_dim
        kv_b = weights.take_linear(a + "kv_b_proj.weight", Shard(0, a0 * kv_dim, a1 * kv_dim))
        kv_b = kv_b.dequantized(weights.dtype).view(self.num_heads, -1, self.kv_rank)
        self.w_uk = kv_b[:, : self.nope_dim].contiguous()                 # [Ha, 128, 512]
        self.w_uv = kv_b[t0 - a0:t1 - a0, self.nope_dim:].contiguous()    # [Ht, 128, 512]
        v_rows = (t0 * self.v_dim, t1 * self.v_dim)
        self.g_proj = (ColumnParallelLinear(weights, a + "g_proj.weight", *v_rows)
                       if self.has_gate else None)
        self.o_proj = RowParallelLinear(weights, a + "o_proj.weight", *v_rows, parallel.tp)
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
        """x: [T, D] normed layer input -> [T, D]; writes the batch's rows into `cache` (the
        rows ``batch.slot_mapping`` gives a slot: under DCP those this rank holds)."""
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
        q_abs = torch.cat([q_nope, q[..., self.nope_dim:]], dim=-1)       # [T, Ha, 576]
        o_latent = self._attend(x, cq, q_abs, batch, cache, ops)          # [T, Ht, 512]
        Ht = self.num_out_heads
        o = torch.einsum("thc,hdc->thd", o_latent.to(x.dtype), self.w_uv)  # [T, Ht, 128]
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x, ops)).view(T, Ht, self.v_dim)
        return self.o_proj(o.reshape(T, Ht * self.v_dim), ops)

    def _attend(self, x: torch.Tensor, cq: torch.Tensor, q_abs: torch.Tensor,
                batch: ForwardBatch, cache: MLACacheView, ops: OpTable) -> torch.Tensor:
        """Latent attention outputs [T, Ht, 512] fp32 of this rank's TP heads (module doc)."""
        parallel = self.parallel
        if parallel.layout.dcp_size > 1:
            return dcp_attend(self, x, cq, q_abs, batch, cache, ops)
        if parallel.layout.is_distributed and \
                x.shape[0] >= parallel.token_sharded_prefill_min_tokens:
            return token_sharded_attend(self, x, cq, q_abs, batch, cache, ops)
        rows = AttentionRows.of_batch(batch)
        return self.attend_rows(x, cq, q_abs, rows, cache, ops)

    def attend_rows(self, x: torch.Tensor, cq: torch.Tensor, q_abs: torch.Tensor,
                    rows: AttentionRows, cache: MLACacheView, ops: OpTable) -> torch.Tensor:
        """Attention [n, heads, 512] fp32 of n query rows (x, cq, q_abs: [n, ...]) over all
        their causal keys in this rank's cache: dense, or the top-k their indexer selects."""
        if self.index_topk is None or rows.max_position + 1 <= self.index_topk:
            o_latent, _ = ops.dense_mla(q_abs, cache.latent, cache.latent_scale,
                                        rows.block_tables, rows.request, rows.position,
                                        rows.block_size, self.softmax_scale,
                                        max_position=rows.max_position,
                                        rows_per_request=rows.rows_per_request)
            return o_latent
        scores = self.index_scores(x, cq, rows.request, rows.position, rows.max_position + 1,
                                   rows.block_tables, rows.block_size, cache, ops)
        k = min(self.index_topk, rows.max_position + 1)
        slots = ops.topk_slots(scores, k, rows.position + 1, rows.block_tables, rows.request,
                               rows.block_size)
        o_latent, _ = ops.sparse_mla(q_abs, cache.latent, cache.latent_scale, slots,
                                     self.softmax_scale)
        return o_latent

    def index_scores(self, x: torch.Tensor, cq: torch.Tensor, row_request: torch.Tensor,
                     row_position: torch.Tensor, num_positions: int,
                     block_tables: torch.Tensor, block_size: int, cache: MLACacheView,
                     ops: OpTable) -> torch.Tensor:
        """Indexer scores [n, num_positions] of n query rows over the keys in ``cache``
        (§4.6); ``row_position``: the last key position each row sees in this cache."""
        n = x.shape[0]
        q_index = (cq @ self.w_index_q.T).view(n, self.index_heads, self.index_dim)
        head_weights = (x @ self.w_index_weights.T).float() * (
            self.index_heads ** -0.5 * self.index_dim ** -0.5)
        return ops.indexer_score(q_index, head_weights, cache.index_values, cache.index_scales,
                                 self.index_format, self.fp8_variant, block_tables,
                                 row_request, row_position, block_size,
                                 num_positions=num_positions)
