"""LLMEngine: the loop that admits requests, runs steps and returns outputs.

Build order at start-up: config -> device choices -> checkpoint -> ops table -> model ->
memory plan -> cache pools -> scheduler and runner. Every later step is
`schedule -> run -> append tokens and check stops -> release finished sequences`.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from atomk31.cache import (
    BlockPool, CacheLayoutSpec, KDAStatePool, KDAStateSpec, PackedLayout, SnapshotIndex,
    plan_cache,
)
from atomk31.checkpoint import Tokenizer, load_checkpoint
from atomk31.config import EngineConfig, ModelConfig, ResolvedEngineConfig
from atomk31.engine.cuda_graphs import GRAPH_BATCH_SIZES, DecodeGraphs, why_no_decode_graphs
from atomk31.engine.model_runner import ModelRunner
from atomk31.engine.outputs import RequestMetrics, RequestOutput
from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.scheduler import Scheduler
from atomk31.engine.sequence import Sequence, SequenceStatus
from atomk31.engine.stop_checker import StopChecker
from atomk31.model import K31Model
from atomk31.ops import KernelContext, Target, select_kernels
from atomk31.quant.ptpc import quantize_linears_ptpc

logger = logging.getLogger(__name__)

CPU_CACHE_BYTES = 512 << 20   # cache budget on CPU when --kv-cache-memory is not given


class PromptTooLongError(ValueError):
    """A prompt (plus the tokens it asks for) does not fit the context length."""


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    seqs: list[Sequence]


def kernel_context(target: Target, config: ResolvedEngineConfig,
                   block_size: int) -> KernelContext:
    """What kernels are chosen against: the device's target and the engine's fixed formats."""
    return KernelContext(target, config.compute_dtype, config.latent_cache_dtype,
                         config.index_cache_format, block_size)


class LLMEngine:
    def __init__(self, options: EngineConfig):
        device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_config = ModelConfig.from_pretrained(options.model)
        self.config: ResolvedEngineConfig = options.resolve(self.model_config, device)
        self.device = device
        self.tokenizer = Tokenizer.from_pretrained(options.model)
        self.kernels = select_kernels(options.kernel_backend, kernel_context(
            Target.of_device(device), self.config, options.block_size))
        for step, table in (("eager", self.kernels.eager), ("graph", self.kernels.graph)):
            for op, shape, target, kernel, passed_over in table.describe():
                logger.debug("%s %s [%s] -> %s %s (%s)", step, op, shape, target, kernel,
                             passed_over)
        # straight onto the device: the bytes are read as the progress bar counts them (a
        # CPU load of mmapped files reads them only when first touched), no host-memory copy
        # of the checkpoint, and the online PTPC quantizer then runs on the GPU
        tensors = load_checkpoint(options.model, self.model_config, device=device)
        if options.online_quant_config is not None:
            tensors = quantize_linears_ptpc(tensors, options.online_quant_config,
                                            self.config.fp8_variant)
        self.model = K31Model(self.model_config, tensors, self.config.compute_dtype, device,
                              self.config.index_cache_format, self.config.fp8_variant)
        self.stop_checker = StopChecker(self.tokenizer, self._eos_token_ids(options.model))
        self._build_cache(options)
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    # -- start-up -----------------------------------------------------------------------
    def _build_cache(self, options: EngineConfig) -> None:
        mc, rc = self.model_config, self.config
        layout = PackedLayout(CacheLayoutSpec(
            block_size=options.block_size, num_mla_layers=len(mc.mla_layer_ids),
            latent_dim=mc.latent_dim, latent_dtype=rc.latent_cache_dtype,
            index_format=rc.index_cache_format if mc.has_indexer else None,
            fp8_variant=rc.fp8_variant))
        state_spec = KDAStateSpec(
            num_kda_layers=len(mc.kda_layer_ids), num_heads=mc.kda_num_heads,
            head_dim=mc.kda_head_dim, conv_width=mc.short_conv_kernel_size,
            conv_channels=mc.kda_num_heads * mc.kda_head_dim,
            # the conv history is BF16 in the engine (§4.4); float32 compute keeps it exact
            conv_dtype=rc.compute_dtype)
        # CUDA-graph decode (engine/cuda_graphs.py) needs a scratch block and two KDA state
        # slots (padding rows; the first replay's check), outside the pools, paid from the budget
        self.why_eager = why_no_decode_graphs(self.kernels, options.enforce_eager,
                                              self.model.ops_called)
        graphs = self.why_eager is None
        scratch_bytes = layout.row_bytes + 2 * state_spec.bytes_per_slot() if graphs else 0
        plan = plan_cache(self._cache_budget(options) - scratch_bytes, layout, state_spec,
                          options.max_num_seqs, rc.max_model_len, options.snapshot_fraction)
        logger.info("cache: %d blocks of %d tokens, %d state slots, %d snapshot slots",
                    plan.num_blocks, options.block_size, plan.num_state_slots,
                    plan.num_snapshot_slots)
        self.kv_pool = layout.allocate(plan.num_blocks + int(graphs), self.device)
        kv_views = [layout.layer_view(self.kv_pool, i) for i in range(len(mc.mla_layer_ids))]
        self.state_pool = KDAStatePool(state_spec, plan.num_state_slots + plan.num_snapshot_slots,
                                       self.device, num_scratch_slots=2 * int(graphs))
        self.block_pool = BlockPool(plan.num_blocks, options.block_size,
                                    options.enable_prefix_caching)
        self.snapshots = SnapshotIndex(self.state_pool, plan.num_snapshot_slots
                                       if options.enable_prefix_caching else 0)
        self.scheduler = Scheduler(self.block_pool, self.state_pool, self.snapshots,
                                   options.max_num_seqs, options.max_num_batched_tokens,
                                   options.kda_snapshot_interval // options.block_size,
                                   copy_block=self._copy_block)
        self.runner = ModelRunner(self.model, self.kernels, kv_views, self.state_pool,
                                  options.block_size, self.device,
                                  self.stop_checker.suppressed_token_ids)
        if graphs:
            self.runner.graphs = DecodeGraphs(
                self.runner.forward, self.kernels, options.block_size,
                max_batch=min(options.max_num_seqs, GRAPH_BATCH_SIZES[-1]),
                max_context=rc.max_model_len,
                split_points=[mc.index_topk] if mc.has_indexer else [],
                scratch_block=plan.num_blocks, scratch_slot=self.state_pool.scratch_slot(0),
                backup_slot=self.state_pool.scratch_slot(1), device=self.device,
                copy_state=self.state_pool.copy)
        else:
            logger.info("decode steps run eagerly: %s", self.why_eager)

    def _copy_block(self, src: int, dst: int) -> None:
        """One block's row of the packed pool (every MLA layer's pages) into another."""
        self.kv_pool[dst].copy_(self.kv_pool[src])

    def _cache_budget(self, options: EngineConfig) -> int:
        if options.kv_cache_memory is not None:
            return options.kv_cache_memory
        if self.device.type == "cpu":
            return CPU_CACHE_BYTES
        free, _ = torch.cuda.mem_get_info(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(free - (1 - options.gpu_memory_utilization) * total)

    def _eos_token_ids(self, model_dir: str) -> set[int]:
        """The tokenizer's `[EOS]` plus generation_config.json's eos ids (`<|end_of_msg|>`,
        which ends every message, CHAT_FORMAT.md §1)."""
        eos = {self.tokenizer.eos_token_id} - {None}
        file = Path(model_dir) / "generation_config.json"
        if file.is_file():
            ids = json.loads(file.read_text()).get("eos_token_id")
            eos.update(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        return eos

    # -- requests -----------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        return self.add_requests([(prompt, params, request_id)])[0]

    def add_requests(self, requests: list[tuple[str | list[int], SamplingParams, str | None]]
                     ) -> list[str]:
        """Admit several `(prompt, params, request_id or None)` at once, so that the next step
        can batch them all; every request is checked first and none is added if one fails.
        A request with n > 1 queues its first completion; the others fork from it once its
        prompt is computed (scheduler.py)."""
        built = []
        for prompt, params, request_id in requests:
            request_id = request_id if request_id is not None else str(next(self._ids))
            if request_id in self.requests or any(r.request_id == request_id for r in built):
                raise ValueError(f"request id {request_id!r} is already in use")
            text = prompt if isinstance(prompt, str) else None
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            self._check_prompt(ids, params)
            seqs = [Sequence(request_id, ids, params, index=i) for i in range(params.n)]
            seqs[0].forks = seqs[1:]
            built.append(_Request(request_id, text, seqs))
        for request in built:
            self.requests[request.request_id] = request
            self.scheduler.add(request.seqs[0])
        return [request.request_id for request in built]

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        limit = self.config.max_model_len
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got {bad[:5]}")
        wanted = len(ids) + (params.max_tokens or 1)
        if wanted > limit:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens and asks for {params.max_tokens or 1} more "
                f"({wanted} in all), over the context length of {limit} tokens; shorten the "
                "prompt or lower max_tokens")

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks and state slots."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish(SequenceStatus.FINISHED_ABORTED)
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; -> the outputs of every request that got a new token."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        sampled = self.runner.run(scheduled)
        # n > 1: prefills that just ended; their other completions continue from this prompt
        forking = [item.seq for item in scheduled if item.seq.forks and item.is_last_chunk]
        self.scheduler.complete(scheduled)
        touched: dict[str, _Request] = {}
        for seq, token, logprobs in sampled:
            seq.append_token(token, logprobs)
            self.stop_checker.check(seq, self.config.max_model_len)
            touched[seq.request_id] = self.requests[seq.request_id]
        for parent in forking:
            self.scheduler.fork(parent)
        for seq, _, _ in sampled:
            if seq.is_finished:
                self.scheduler.finish(seq)
        outputs = [self._output(request) for request in touched.values()]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs

    def _output(self, request: _Request) -> RequestOutput:
        first = request.seqs[0]
        return RequestOutput(
            request_id=request.request_id, prompt=request.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=[seq.to_completion_output() for seq in request.seqs],
            finished=all(seq.is_finished for seq in request.seqs),
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=list(first.prompt_logprobs) if first.prompt_logprobs else None,
            metrics=RequestMetrics(first.arrival_time, first.first_token_time,
                                   first.finished_time))
