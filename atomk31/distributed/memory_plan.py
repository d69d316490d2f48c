"""Bytes per rank, from config.json alone: the weights a rank reads, and its caches.

`rank_shard(name, config, layout)` restates, per checkpoint tensor, which slice the model
layers take on a rank (``model/parallel_linear.py`` and the layers' ``Shard``s); the loader
test checks it against the bytes a rank really reads. `weight_bytes_per_rank` sums it over the
checkpoint (``atomk31 info`` and the load's progress bar use it).
"""

from __future__ import annotations

import re

from atomk31.checkpoint.schema import TensorSpec, expected_tensors
from atomk31.config import ModelConfig
from atomk31.distributed.layout import ParallelLayout

SKIP = "skip"          # another rank's tensor: not read here
WHOLE = "whole"        # replicated: read whole

_LAYER = re.compile(r"layers\.(\d+)\.(.*)$")
_KDA_ROWS = re.compile(r"self_attn\.(q_proj|k_proj|v_proj|g_proj|f_b_proj|b_proj|"
                       r"[qkv]_conv1d)\.weight$|self_attn\.dt_bias$")
_MLP_ROWS = re.compile(r"(mlp|shared_experts)\.(gate_proj|up_proj)\.weight$")
_MLP_COLS = re.compile(r"(mlp|shared_experts)\.down_proj\.weight$")
_EXPERT = re.compile(r"experts\.(\d+)\.(w1|w2|w3)\.")


def rank_shard(name: str, config: ModelConfig,
               layout: ParallelLayout) -> tuple[int, int, int] | str:
    """(dim, parts, index): the slice of ``name`` this rank reads (dim cut into ``parts``
    equal parts, part ``index``), or WHOLE, or SKIP."""
    tp, t = layout.tp_size, layout.tp_rank
    if name.endswith("lm_head.weight"):
        return (0, tp, t)
    match = _LAYER.search(name)
    if match is None:
        return WHOLE
    layer, rest = int(match.group(1)), match.group(2)
    if config.is_mla_layer(layer):
        if re.search(r"self_attn\.(q_b_proj|kv_b_proj)\.weight$", rest):
            return (0, layout.num_head_groups, layout.head_group)
        if rest.endswith("self_attn.g_proj.weight"):
            return (0, tp, t)
        if rest.endswith("self_attn.o_proj.weight"):
            return (1, tp, t)
    elif _KDA_ROWS.search(rest):
        return (0, tp, t)
    elif rest.endswith("self_attn.o_proj.weight"):
        return (1, tp, t)
    if _MLP_ROWS.search(rest):
        return (0, tp, t)
    if _MLP_COLS.search(rest):
        return (1, tp, t)
    expert = _EXPERT.search(rest)
    if expert is not None:
        if layout.expert_parallel:
            start, stop = layout.expert_range(config.num_experts)
            return WHOLE if start <= int(expert.group(1)) < stop else SKIP
        return (1, tp, t) if expert.group(2) == "w2" else (0, tp, t)
    return WHOLE


def shard_bytes(spec: TensorSpec, shard: tuple[int, int, int] | str) -> int:
    """Bytes of ``shard`` of a tensor stored as ``spec`` (its preferred dtype)."""
    if shard == SKIP:
        return 0
    if shard == WHOLE:
        return spec.nbytes
    _, parts, _ = shard
    return spec.nbytes // parts


def weight_bytes_per_rank(config: ModelConfig, layout: ParallelLayout) -> int:
    """The checkpoint bytes one rank reads (routed experts as stored: MXFP4)."""
    return sum(shard_bytes(spec, rank_shard(name, config, layout))
               for name, spec in expected_tensors(config).items())
