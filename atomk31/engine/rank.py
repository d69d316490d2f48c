"""What every rank holds to run steps: its kernels, its model shard, its cache pools, a runner.

`build_rank` is the device side of start-up, the same on every rank (the first rank's engine
adds the scheduler, the tokenizer and the sampler's inputs on top):

    kernels -> model shard (this rank's slices of the checkpoint, read as the layers take
    them) -> cache layout and KDA state shape (this rank's KDA heads) -> memory plan -> pools
    -> runner, with its decode graphs on a GPU (every rank replays the same ones).

Every rank must plan the same pools, since the first rank's scheduler hands out blocks and
state slots for all of them: the budget is the smallest over the ranks (one all-reduce).
Under DCP a request's blocks hold ``block_size x W`` tokens (each rank holds block_size of
them per block), so one ``max_model_len`` request needs W times fewer blocks per rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from atomk31.cache import (
    CacheLayoutSpec, KDAStatePool, KDAStateSpec, MLACacheView, PackedLayout, plan_cache,
)
from atomk31.cache.planner import CachePlan
from atomk31.checkpoint.slices import CheckpointSlices
from atomk31.config import EngineConfig, ModelConfig, ResolvedEngineConfig
from atomk31.distributed.memory_plan import weight_bytes_per_rank
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.engine.cuda_graphs import GRAPH_BATCH_SIZES, DecodeGraphs, why_no_decode_graphs
from atomk31.engine.model_runner import ModelRunner
from atomk31.engine.speculative import load_draft
from atomk31.engine.step_message import MirroredStatePool
from atomk31.model import K31Model
from atomk31.model.dspark import DSparkDraft
from atomk31.ops import KernelContext, Kernels, Target, select_kernels

logger = logging.getLogger(__name__)

CPU_CACHE_BYTES = 512 << 20   # cache budget on CPU when --kv-cache-memory is not given


@dataclass
class RankParts:
    kernels: Kernels
    model: K31Model
    layout: PackedLayout
    state_spec: KDAStateSpec
    plan: CachePlan
    kv_pool: torch.Tensor
    kv_views: list[MLACacheView]
    state_pool: KDAStatePool
    runner: ModelRunner
    why_eager: str | None          # why decode steps do not replay graphs (None: they do)
    draft: DSparkDraft | None = None       # the DSpark draft (speculative decoding), if any
    state_slots_per_request: int = 1       # 1 + num_speculative_tokens with a draft (§5.7)


def kernel_context(target: Target, config: ResolvedEngineConfig,
                   block_size: int) -> KernelContext:
    """What kernels are chosen against: the device's target and the engine's fixed formats."""
    return KernelContext(target, config.compute_dtype, config.latent_cache_dtype,
                         config.index_cache_format, block_size)


def load_model(options: EngineConfig, model_config: ModelConfig, config: ResolvedEngineConfig,
               device: torch.device, parallel: ParallelContext) -> K31Model:
    """This rank's model shard, its slices read from the safetensors files as taken."""
    tensors = CheckpointSlices.open(
        options.model, model_config, device=device,
        expected_bytes=weight_bytes_per_rank(model_config, parallel.layout),
        description=f"loading checkpoint (rank {parallel.rank})")
    try:
        return K31Model(model_config, tensors, config.compute_dtype, device,
                        config.index_cache_format, config.fp8_variant, parallel,
                        options.online_quant_config, config.dequantize_experts)
    finally:
        tensors.close()


def build_rank(options: EngineConfig, model_config: ModelConfig, config: ResolvedEngineConfig,
               device: torch.device, parallel: ParallelContext,
               suppressed_token_ids: Callable = lambda seq: []) -> RankParts:
    kernels = select_kernels(options.kernel_backend, kernel_context(
        Target.of_device(device), config, options.block_size))
    for step, table in (("eager", kernels.eager), ("graph", kernels.graph)):
        for op, shape, target, kernel, passed_over in table.describe():
            logger.debug("%s %s [%s] -> %s %s (%s)", step, op, shape, target, kernel,
                         passed_over)
    model = load_model(options, model_config, config, device, parallel)
    mc, layout_info, spec = model_config, parallel.layout, config.speculative
    # the draft's latent pages live in the target's block rows (§5.2; one rank only)
    draft = load_draft(spec, model, config.compute_dtype, device) if spec else None
    layout = PackedLayout(CacheLayoutSpec(
        block_size=options.block_size, num_mla_layers=len(mc.mla_layer_ids),
        num_draft_layers=spec.draft.num_hidden_layers if spec else 0,
        latent_dim=mc.latent_dim, latent_dtype=config.latent_cache_dtype,
        index_format=config.index_cache_format if mc.has_indexer else None,
        fp8_variant=config.fp8_variant))
    heads = mc.kda_num_heads // layout_info.tp_size
    state_spec = KDAStateSpec(
        num_kda_layers=len(mc.kda_layer_ids), num_heads=heads, head_dim=mc.kda_head_dim,
        conv_width=mc.short_conv_kernel_size, conv_channels=heads * mc.kda_head_dim,
        # the conv history is BF16 in the engine (§4.4); float32 compute keeps it exact
        conv_dtype=config.compute_dtype)
    why_eager = why_no_decode_graphs(kernels, options.enforce_eager,
                                     model.ops_called | (set(draft.OPS) if draft else set()))
    # CUDA-graph decode (engine/cuda_graphs.py) needs a scratch block and two KDA state
    # slots (padding rows; the first replay's check), outside the pools, paid from the budget
    graphs = why_eager is None
    scratch_bytes = layout.row_bytes + 2 * state_spec.bytes_per_slot() if graphs else 0
    budget = _agreed_budget(options, device, parallel)
    dcp = layout_info.dcp_size
    slots_per_request = 1 + (spec.num_speculative_tokens if spec else 0)
    plan = plan_cache(budget - scratch_bytes, layout, state_spec, options.max_num_seqs,
                      -(-config.max_model_len // dcp), options.snapshot_fraction,
                      slots_per_request)
    logger.info("cache: %d blocks of %d tokens, %d state slots, %d snapshot slots",
                plan.num_blocks, options.block_size * dcp, plan.num_state_slots,
                plan.num_snapshot_slots)
    kv_pool = layout.allocate(plan.num_blocks + int(graphs), device)
    kv_views = [layout.layer_view(kv_pool, i) for i in range(len(mc.mla_layer_ids))]
    pool_class = MirroredStatePool if layout_info.is_distributed and parallel.rank == 0 \
        else KDAStatePool
    state_pool = pool_class(state_spec, plan.num_state_slots, device,
                            num_scratch_slots=2 * int(graphs))
    runner = ModelRunner(model, kernels, kv_views, state_pool, options.block_size, device,
                         suppressed_token_ids, parallel)
    parts = RankParts(kernels, model, layout, state_spec, plan, kv_pool, kv_views, state_pool,
                      runner, why_eager, draft, slots_per_request)
    if graphs and spec is None:     # speculative steps have their own (speculative_graphs.py)
        runner.graphs = DecodeGraphs(
            runner.forward, kernels, scratch_slot=state_pool.scratch_slot(0),
            backup_slot=state_pool.scratch_slot(1), comm=parallel.tp,
            dcp_size=layout_info.dcp_size, dcp_rank=layout_info.dcp_rank,
            **graph_shapes(parts, options, mc, config))
    return parts


def graph_shapes(parts: RankParts, options: EngineConfig, model_config: ModelConfig,
                 config: ResolvedEngineConfig) -> dict:
    """What decode and speculative graphs are sized and placed by: batch and context limits,
    the model's path split (``index_topk``), the scratch block and this rank's state copy."""
    return dict(block_size=options.block_size,
                max_batch=min(options.max_num_seqs, GRAPH_BATCH_SIZES[-1]),
                max_context=config.max_model_len,
                split_points=[model_config.index_topk] if model_config.has_indexer else [],
                scratch_block=parts.plan.num_blocks, device=parts.kv_pool.device,
                copy_state=parts.state_pool.copy_states)


def _agreed_budget(options: EngineConfig, device: torch.device,
                   parallel: ParallelContext) -> int:
    """The cache budget of this rank (--kv-cache-memory, else the share of free memory), the
    smallest over all ranks."""
    if options.kv_cache_memory is not None:
        budget = options.kv_cache_memory
    elif device.type == "cpu":
        budget = CPU_CACHE_BYTES
    else:
        free, _ = torch.cuda.mem_get_info(device)
        total = torch.cuda.get_device_properties(device).total_memory
        budget = int(free - (1 - options.gpu_memory_utilization) * total)
        if budget <= 0:
            raise ValueError(
                f"no GPU memory left for the cache: {free / 2**30:.1f} GiB of "
                f"{total / 2**30:.1f} GiB are free after loading the model, and "
                f"--gpu-memory-utilization {options.gpu_memory_utilization} keeps "
                f"{(1 - options.gpu_memory_utilization) * total / 2**30:.1f} GiB in reserve; "
                "raise it, pass --kv-cache-memory, or free the memory another engine or "
                "process holds on this device")
    if not parallel.layout.is_distributed:
        return budget
    agreed = torch.tensor([budget], dtype=torch.int64, device=device)
    return int(parallel.tp.all_reduce(agreed, op="min").item())
