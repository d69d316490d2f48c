"""Bytes per rank, from config.json alone: the weights a rank reads, and its caches.

`weight_bytes_per_rank`, `cache_bytes_per_token`, `kda_state_bytes_per_request` and
`rank_capacity` are what `atomk31 info --model DIR --tensor-parallel-size N` prints.

`rank_shard(name, config, layout)` restates, per checkpoint tensor, which slice the model
layers take on a rank (``model/parallel_linear.py`` and the layers' ``Shard``s); the loader
test checks it against the bytes a rank really reads. `weight_bytes_per_rank` sums it over the
checkpoint (``atomk31 info`` and the load's progress bar use it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atomk31.cache import CacheLayoutSpec, KDAStateSpec, PackedLayout
from atomk31.checkpoint.schema import TensorSpec, expected_tensors
from atomk31.config import ModelConfig
from atomk31.distributed.layout import ParallelLayout

SKIP = "skip"          # another rank's tensor: not read here
WHOLE = "whole"        # replicated: read whole

_KDA_ROWS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight",
             "f_b_proj.weight", "b_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
             "v_conv1d.weight", "dt_bias")
_MLP_ROWS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "shared_experts.gate_proj.weight",
             "shared_experts.up_proj.weight")
_MLP_COLS = ("mlp.down_proj.weight", "shared_experts.down_proj.weight")


def rank_shard(name: str, config: ModelConfig,
               layout: ParallelLayout) -> tuple[int, int, int] | str:
    """(dim, parts, index): the slice of ``name`` this rank reads (dim cut into ``parts``
    equal parts, part ``index``), or WHOLE, or SKIP."""
    tp, t = layout.tp_size, layout.tp_rank
    if name.endswith("lm_head.weight"):
        return (0, tp, t)
    head, found, rest = name.partition(".layers.")
    if not found:
        return WHOLE
    layer_text, _, rest = rest.partition(".")
    expert_head, is_expert, expert_rest = rest.partition(".experts.")
    if is_expert:          # the bulk of the checkpoint: experts.{e}.w{1,2,3}.*
        expert, _, matrix = expert_rest.partition(".")
        if layout.expert_parallel:
            start, stop = layout.expert_range(config.num_experts)
            return WHOLE if start <= int(expert) < stop else SKIP
        return (1, tp, t) if matrix.startswith("w2.") else (0, tp, t)
    attention, is_attention, field = rest.partition("self_attn.")
    if is_attention:
        if field == "o_proj.weight":
            return (1, tp, t)
        if config.is_mla_layer(int(layer_text)):
            if field in ("q_b_proj.weight", "kv_b_proj.weight"):
                return (0, layout.num_head_groups, layout.head_group)
            return (0, tp, t) if field == "g_proj.weight" else WHOLE
        return (0, tp, t) if field in _KDA_ROWS else WHOLE
    if rest.endswith(_MLP_ROWS):
        return (0, tp, t)
    if rest.endswith(_MLP_COLS):
        return (1, tp, t)
    return WHOLE


def shard_bytes(spec: TensorSpec, shard: tuple[int, int, int] | str) -> int:
    """Bytes of ``shard`` of a tensor stored as ``spec`` (its preferred dtype)."""
    if shard == SKIP:
        return 0
    if shard == WHOLE:
        return spec.nbytes
    _, parts, _ = shard
    return spec.nbytes // parts


def weight_bytes_per_rank(config: ModelConfig, layout: ParallelLayout,
                          specs: dict[str, TensorSpec] | None = None) -> int:
    """The checkpoint bytes one rank reads (routed experts as stored: MXFP4). ``specs``:
    ``expected_tensors(config)``, when the caller has it (half a million entries for K3.1)."""
    specs = expected_tensors(config) if specs is None else specs
    return sum(shard_bytes(spec, rank_shard(name, config, layout))
               for name, spec in specs.items())


@dataclass(frozen=True)
class RankCapacity:
    """One rank's cache capacity for one latent / index-key format pair."""

    latent: str                     # "fp8" | "bf16"
    index_keys: str                 # "fp8" | "mxfp4"
    bytes_per_token: int            # latent rows + index keys of one token held on this rank
    num_tokens: int                 # tokens whose rows fit beside the weights (no KDA states)
    num_full_contexts: int          # max_position_embeddings-token requests, KDA state included


def cache_bytes_per_token(config: ModelConfig, latent: str, index_keys: str | None,
                          dcp_size: int = 1) -> float:
    """Latent rows + index keys (None: latent rows only) of one token on one rank (§7.2):
    every TP rank holds the whole row of each token it holds, and a DCP rank 1/W of the
    tokens."""
    dtype = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[latent]
    layout = PackedLayout(CacheLayoutSpec(
        block_size=128, num_mla_layers=len(config.mla_layer_ids), latent_dim=config.latent_dim,
        latent_dtype=dtype, index_format=index_keys if config.has_indexer else None))
    return layout.bytes_per_token() / dcp_size


def kda_state_bytes_per_request(config: ModelConfig, tp_size: int) -> int:
    """One request's KDA state on one rank (§7.3: its KDA heads; conv BF16, state fp32)."""
    heads = config.kda_num_heads // tp_size
    return KDAStateSpec(len(config.kda_layer_ids), heads, config.kda_head_dim,
                        config.short_conv_kernel_size, heads * config.kda_head_dim,
                        conv_dtype=torch.bfloat16).bytes_per_slot()


def rank_capacity(config: ModelConfig, layout: ParallelLayout, gpu_bytes: int,
                  utilization: float, latent: str, index_keys: str,
                  weight_bytes: int | None = None) -> RankCapacity:
    """What fits on one rank of ``gpu_bytes`` at ``utilization`` beside its weights (weights
    and caches only: no activation workspace). ``weight_bytes``: the rank's, if known."""
    if weight_bytes is None:
        weight_bytes = weight_bytes_per_rank(config, layout)
    budget = int(gpu_bytes * utilization) - weight_bytes
    per_token = cache_bytes_per_token(config, latent, index_keys, layout.dcp_size)
    context = config.max_position_embeddings * per_token + \
        kda_state_bytes_per_request(config, layout.tp_size)
    return RankCapacity(latent, index_keys, int(per_token), max(0, int(budget // per_token)),
                        max(0, int(budget // context)))
