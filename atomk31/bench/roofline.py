"""Roofline models of engine steps, from the config: the bytes a decode step must read and the
FLOPs a prefill must compute. `atomk31 bench latency` divides them by the measured step time and
the ceilings measured in the same run (MBU, MFU).

Bytes of a decode step of B requests (`decode_step_bytes`), each at its own context n (keys
attended, the new token included):
- every non-expert weight the step's layers touch, once, as the engine stores it
  (`StorageFormat`): the compute dtype (BF16 on a GPU), FP8 + one fp32 scale per output
  channel for PTPC-quantized linears, fp32 for what `model/` keeps in fp32 (router, norms that
  weight fp32 math, AttnRes queries, KDA gates and conv weights); the embedding contributes the
  B rows it gathers; the indexer's query-side weights (`wq_b`, `weights_proj`) count only on
  sparse steps (some context over `index_topk`), where the indexer scores keys.
- the distinct routed experts the batch routes to (measured: the caller counts them), each at
  its stored size (MXFP4 bytes with their E8M0 scale bytes, or the dense compute dtype).
- per request and MLA layer: dense step: its n latent rows; sparse step: its n index keys (values
  and scales) and min(n, index_topk) latent rows; plus the new latent row and index key written.
- per request: its KDA state (recurrent + conv, every KDA layer), read and written once.
Activations are left out (kilobytes per token).

FLOPs of prefilling a fresh T-token prompt (`prefill_flops`), 2 per multiply-add, matrix work
only (norms, gates, AttnRes mixing and the short convolutions are elementwise and left out):
- projections of every layer, MLA's absorbed factors (q·W_uk, o·W_uv) included;
- MLA attention in the absorbed form (576-wide keys, 512-wide values), query at position p over
  min(p + 1, index_topk) keys (all causal keys where sparse equals dense);
- the indexer: key projection for every token; query and head-weight projections and scores
  over the p + 1 causal keys only for rows p >= index_topk (where the top-k selects);
- KDA's recurrence, 6 K V per token and head (k·S, the rank-1 write, q·S);
- MoE: router, latent projections, the top-k routed experts per token, the shared experts;
- the LM head for the one sampled row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from atomk31.cache.layout import CacheLayoutSpec
from atomk31.cache.state_pool import KDAStateSpec
from atomk31.checkpoint.schema import expected_tensors
from atomk31.config import ModelConfig
from atomk31.quant.ptpc import is_ptpc_eligible, parse_online_quant_config

FP32_BYTES = 4
# Tensors model/ keeps in fp32 whatever the compute dtype (WeightSource.take_fp32).
FP32_TENSORS = re.compile(
    r"(_res_norm\.weight|input_layernorm\.weight|post_attention_layernorm\.weight"
    r"|model\.norm\.weight|block_sparse_moe\.gate\.weight|e_score_correction_bias"
    r"|routed_expert_norm\.weight|_conv1d\.weight|\.A_log|\.dt_bias|self_attn\.o_norm\.weight)$")
# AttnRes folds w_n * w_p into one fp32 query at load (model/k31.py): the proj costs nothing more.
FOLDED_TENSORS = re.compile(r"_res_proj\.weight$")
# Dequantized at load even when PTPC quantized it (MLA's absorbed factors, model/mla_layer.py).
ALWAYS_COMPUTE_DTYPE = re.compile(r"kv_b_proj\.weight$")
INDEX_QUERY_TENSORS = re.compile(r"indexer\.(wq_b|weights_proj)\.weight$")
EMBEDDING = re.compile(r"embed_tokens\.weight$")
EXPERT = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True)
class StorageFormat:
    """How the engine stores weights and cache (what a step reads): the compute dtype, the
    online quantization config (None: weights as stored), routed experts MXFP4 or dense, the
    latent dtype and the index-key format (None: a model without indexer)."""

    compute_dtype: torch.dtype = torch.bfloat16
    online_quant_config: dict | None = None
    experts_mxfp4: bool = True
    latent_dtype: torch.dtype = torch.float8_e4m3fn
    index_format: str | None = "fp8"
    fp8_variant: str = "e4m3fn"


@dataclass(frozen=True)
class WeightBytes:
    """The model's weights as stored, split by who reads them in a decode step."""

    embedding_row: int   # one row of embed_tokens (a step gathers one per request)
    always: int          # read in full by every decode step (embedding excluded)
    index_query: int     # read only by sparse steps (the indexer's query side)
    expert: int          # one routed expert of one layer
    num_moe_layers: int
    total: int           # every stored weight byte (whole embedding, every expert)


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes one decode step must move, by kind."""

    weights: int     # non-expert weights (embedding rows included)
    experts: int     # the distinct routed experts
    kv: int          # latent rows and index keys, read and written
    kda_state: int   # KDA states, read and written

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.kv + self.kda_state


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs of prefilling one fresh prompt, by part (module docstring)."""

    projections: int
    attention: int
    indexer: int
    kda: int
    moe: int
    lm_head: int

    @property
    def total(self) -> int:
        return (self.projections + self.attention + self.indexer + self.kda + self.moe
                + self.lm_head)


def stored_bytes(name: str, shape: tuple[int, ...], fmt: StorageFormat) -> int:
    """Bytes the engine keeps for the checkpoint tensor `name` of logical `shape`."""
    numel = math.prod(shape)
    if FOLDED_TENSORS.search(name):
        return 0
    if FP32_TENSORS.search(name):
        return numel * FP32_BYTES
    if name.endswith(("weight_packed", "weight_scale")):
        return numel                                  # MXFP4 codes and E8M0 bytes, as stored
    compute = fmt.compute_dtype.itemsize
    if fmt.online_quant_config is not None and not ALWAYS_COMPUTE_DTYPE.search(name):
        probe = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        if is_ptpc_eligible(name, probe, parse_online_quant_config(fmt.online_quant_config)):
            return numel + shape[0] * FP32_BYTES    # FP8 codes + one scale per output row
    return numel * compute


def weight_bytes(config: ModelConfig, fmt: StorageFormat) -> WeightBytes:
    """The stored weights of `config`, split as WeightBytes."""
    always = index_query = total = first_experts = embedding_row = 0
    for name, spec in expected_tensors(config).items():
        shape = spec.shape
        if not fmt.experts_mxfp4 and EXPERT.search(name):
            if name.endswith("weight_scale"):
                continue
            name, shape = name.removesuffix("_packed"), shape[:-1] + (shape[-1] * 2,)
        size = stored_bytes(name, shape, fmt)
        total += size
        if EXPERT.search(name):
            first_experts += size if ".experts.0." in name else 0
        elif EMBEDDING.search(name):
            embedding_row = size // shape[0]
        elif INDEX_QUERY_TENSORS.search(name):
            index_query += size
        else:
            always += size
    num_moe_layers = sum(config.is_moe_layer(layer) for layer in range(config.num_hidden_layers))
    per_expert = first_experts // max(num_moe_layers, 1)
    return WeightBytes(embedding_row, always, index_query, per_expert, num_moe_layers, total)


def cache_layout_spec(config: ModelConfig, fmt: StorageFormat) -> CacheLayoutSpec:
    """The engine's block-row layout for `config` (bytes per token of latent rows and keys)."""
    return CacheLayoutSpec(block_size=1, num_mla_layers=len(config.mla_layer_ids),
                           latent_dim=config.latent_dim, latent_dtype=fmt.latent_dtype,
                           index_format=fmt.index_format if config.has_indexer else None,
                           fp8_variant=fmt.fp8_variant)


def kda_state_spec(config: ModelConfig, fmt: StorageFormat) -> KDAStateSpec:
    """One request's KDA state as the engine keeps it (conv history in the compute dtype)."""
    return KDAStateSpec(num_kda_layers=len(config.kda_layer_ids), num_heads=config.kda_num_heads,
                        head_dim=config.kda_head_dim, conv_width=config.short_conv_kernel_size,
                        conv_channels=config.kda_num_heads * config.kda_head_dim,
                        conv_dtype=fmt.compute_dtype)


def is_sparse_step(config: ModelConfig, contexts: list[int]) -> bool:
    """Whether a step whose requests attend `contexts` keys runs the indexer and sparse MLA
    (model/mla_layer.py: some request past index_topk)."""
    return config.has_indexer and max(contexts) > config.index_topk


def decode_step_bytes(config: ModelConfig, fmt: StorageFormat, contexts: list[int],
                      num_distinct_experts: int) -> DecodeBytes:
    """Bytes of one decode step whose request r attends contexts[r] keys and whose MoE layers
    route to `num_distinct_experts` distinct experts in all (summed over layers)."""
    weights = weight_bytes(config, fmt)
    sparse = is_sparse_step(config, contexts)
    non_expert = weights.always + len(contexts) * weights.embedding_row
    if sparse:
        non_expert += weights.index_query
    layout = cache_layout_spec(config, fmt)
    latent_row = layout.latent_bytes_per_token
    index_key = layout.index_value_bytes_per_token + layout.index_scale_bytes_per_token
    kv_per_layer = 0
    for n in contexts:
        if sparse:
            kv_per_layer += n * index_key + min(n, config.index_topk) * latent_row
        else:
            kv_per_layer += n * latent_row
        kv_per_layer += latent_row + index_key            # the new token's row and key
    state = 2 * kda_state_spec(config, fmt).bytes_per_slot() * len(contexts)
    return DecodeBytes(weights=non_expert, experts=num_distinct_experts * weights.expert,
                       kv=kv_per_layer * len(config.mla_layer_ids), kda_state=state)


def prefill_flops(config: ModelConfig, num_tokens: int) -> PrefillFlops:
    """FLOPs of prefilling one fresh prompt of `num_tokens` tokens (module docstring)."""
    t = num_tokens
    projections = attention = indexer = kda = moe = 0
    for layer in range(config.num_hidden_layers):
        if config.is_mla_layer(layer):
            projections += 2 * t * _mla_projection_macs(config)
            attention += 2 * config.num_attention_heads * (config.latent_dim
                                                           + config.kv_lora_rank) \
                * _attended_keys(t, config.index_topk)
            indexer += _indexer_flops(config, t)
        else:
            projections += 2 * t * _kda_projection_macs(config)
            kda += 6 * t * config.kda_num_heads * config.kda_head_dim ** 2
        if config.is_moe_layer(layer):
            moe += 2 * t * _moe_macs(config)
        else:
            projections += 2 * t * 3 * config.hidden_size * config.intermediate_size
    lm_head = 2 * config.hidden_size * config.vocab_size
    return PrefillFlops(projections, attention, indexer, kda, moe, lm_head)


def _attended_keys(num_tokens: int, index_topk: int | None) -> int:
    """Sum over positions p < num_tokens of min(p + 1, index_topk)."""
    if index_topk is None or num_tokens <= index_topk:
        return num_tokens * (num_tokens + 1) // 2
    return index_topk * (index_topk + 1) // 2 + (num_tokens - index_topk) * index_topk


def _mla_projection_macs(c: ModelConfig) -> int:
    """Multiply-adds per token of one MLA layer's projections (the indexer's key included)."""
    d, h = c.hidden_size, c.num_attention_heads
    macs = d * c.q_lora_rank + c.q_lora_rank * h * c.qk_head_dim + d * c.latent_dim
    macs += h * c.qk_nope_head_dim * c.kv_lora_rank + h * c.kv_lora_rank * c.v_head_dim
    macs += d * h * c.v_head_dim * (2 if c.mla_use_output_gate else 1)   # g_proj, o_proj
    if c.has_indexer:
        macs += d * c.index_head_dim
    return macs


def _indexer_flops(c: ModelConfig, t: int) -> int:
    """The indexer's query side and scores for the rows p >= index_topk."""
    if not c.has_indexer or t <= c.index_topk:
        return 0
    rows = t - c.index_topk
    width = c.index_n_heads * c.index_head_dim
    projections = 2 * rows * (c.q_lora_rank * width + c.hidden_size * c.index_n_heads)
    keys = (t * (t + 1) - c.index_topk * (c.index_topk + 1)) // 2   # sum of p + 1, p >= topk
    return projections + 2 * width * keys


def _kda_projection_macs(c: ModelConfig) -> int:
    d, hk, k = c.hidden_size, c.kda_num_heads * c.kda_head_dim, c.kda_head_dim
    return d * 3 * hk + d * k + k * hk + d * c.kda_num_heads + d * hk + hk * d


def _moe_macs(c: ModelConfig) -> int:
    d, f = c.hidden_size, c.moe_intermediate_size
    latent = c.routed_expert_hidden_size or d
    macs = d * c.num_experts                                  # router
    if c.routed_expert_hidden_size is not None:
        macs += 2 * d * latent                                # latent down and up
    macs += c.num_experts_per_token * 3 * latent * f          # w1, w3, w2 of each routed expert
    macs += 3 * d * f * c.num_shared_experts                  # the shared experts' MLP
    return macs
