"""LLMEngine: the loop that admits requests, runs steps and returns outputs.

Build order at start-up: config -> (several devices: start or join the other ranks,
``first_rank.py``) -> device choices -> ops table -> model shard -> memory plan -> cache pools
(``rank.py``: the same on every rank) -> scheduler and runner. Every later step is
`schedule -> run -> append tokens and check stops -> release finished sequences`; under
several ranks `run` first sends the step to the others. `shutdown()` stops them.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from atomk31.cache import BlockPool, SnapshotIndex
from atomk31.checkpoint import Tokenizer
from atomk31.config import EngineConfig, ModelConfig, ResolvedEngineConfig
from atomk31.distributed.layout import check_parallel
from atomk31.distributed.parallel_context import ParallelContext, RankFailure
from atomk31.engine.dspark_proposer import DSparkProposer
from atomk31.engine.first_rank import RankLink
from atomk31.engine.outputs import RequestMetrics, RequestOutput
from atomk31.engine.rank import build_rank, graph_shapes
from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.scheduler import Scheduler
from atomk31.engine.sequence import Sequence, SequenceStatus
from atomk31.engine.spec_stats import SpeculationStats
from atomk31.engine.speculative import DraftPolicy, SpeculativeRunner, StepTokens
from atomk31.engine.speculative_graphs import SpeculativeGraphs
from atomk31.engine.stop_checker import StopChecker

logger = logging.getLogger(__name__)


class PromptTooLongError(ValueError):
    """A prompt (plus the tokens it asks for) does not fit the context length."""


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    seqs: list[Sequence]


class LLMEngine:
    def __init__(self, options: EngineConfig):
        self.model_config = ModelConfig.from_pretrained(options.model)
        self.link: RankLink | None = None
        if options.tensor_parallel_size > 1:
            check_parallel(self.model_config, options.tensor_parallel_size,
                           options.decode_context_parallel_size, options.enable_expert_parallel)
            self.link = RankLink.start(options)
            self.parallel, device = self.link.parallel, self.link.device
        else:
            self.parallel = ParallelContext.single()
            device = torch.device(options.device or ("cuda" if torch.cuda.is_available()
                                                     else "cpu"))
        try:
            self._build(options, device)
        except BaseException:
            self.shutdown()
            raise
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    # -- start-up -----------------------------------------------------------------------
    def _build(self, options: EngineConfig, device: torch.device) -> None:
        self.config: ResolvedEngineConfig = options.resolve(self.model_config, device)
        self.device = device
        self.tokenizer = Tokenizer.from_pretrained(options.model)
        self.stop_checker = StopChecker(self.tokenizer, self._eos_token_ids(options.model))
        parts = build_rank(options, self.model_config, self.config, device, self.parallel,
                           self.stop_checker.suppressed_token_ids)
        self.kernels, self.model, self.runner = parts.kernels, parts.model, parts.runner
        self.kv_pool, self.state_pool, self.why_eager = (parts.kv_pool, parts.state_pool,
                                                         parts.why_eager)
        self.draft, self.speculative = parts.draft, None
        plan, mc, rc, spec = parts.plan, self.model_config, self.config, self.config.speculative
        dcp = self.parallel.layout.dcp_size
        self.block_pool = BlockPool(plan.num_blocks, options.block_size * dcp,
                                    options.enable_prefix_caching)
        self.snapshots = SnapshotIndex(self.state_pool, plan.num_snapshot_slots
                                       if options.enable_prefix_caching else 0)
        interval = options.kda_snapshot_interval    # tokens; the scheduler counts its blocks
        self.scheduler = Scheduler(self.block_pool, self.state_pool, self.snapshots,
                                   options.max_num_seqs, options.max_num_batched_tokens,
                                   max(1, interval // self.block_pool.block_size)
                                   if interval else 0, copy_block=self._copy_block,
                                   num_drafts=DraftPolicy(spec.num_speculative_tokens,
                                                          rc.max_model_len) if spec else None,
                                   num_extra_state_slots=parts.state_slots_per_request - 1)
        if self.link is not None:
            self.runner.publish_step = lambda requests: self.link.publish(
                requests, self.state_pool.drain())
        graphs = self.why_eager is None
        if spec:
            self._build_speculative(options, parts.layout, graphs,
                                    graph_shapes(parts, options, mc, rc))
        if not graphs:
            logger.info("decode steps run eagerly: %s", self.why_eager)

    def _build_speculative(self, options: EngineConfig, layout, graphs: bool,
                           graph_shapes: dict) -> None:
        """The draft's pages, the speculative runner and (on a GPU) its graphs."""
        spec = self.config.speculative
        num_mla = len(self.model_config.mla_layer_ids)
        draft_views = [layout.layer_view(self.kv_pool, num_mla + i)
                       for i in range(spec.draft.num_hidden_layers)]
        self.speculative = SpeculativeRunner(
            self.runner, DSparkProposer(self.draft, draft_views, options.block_size,
                                        spec.draft_sample_method, self.device),
            spec.draft.target_layer_ids, spec.num_speculative_tokens, self.state_pool,
            self.scheduler.reserve_snapshots, options.seed)
        if graphs:
            self.speculative.graphs = SpeculativeGraphs(
                self.speculative.forward,
                lambda batch, ops: self.draft.block_logits(batch, draft_views, ops),
                self.kernels, scratch_slot=self.state_pool.scratch_slot(0),
                backup_slot=self.state_pool.scratch_slot(1),
                mask_token_id=spec.draft.mask_token_id, **graph_shapes)

    def shutdown(self) -> None:
        """Stop the other ranks (a single-device engine has nothing to stop)."""
        if self.link is not None:
            self.link.shutdown()

    def keepalive(self) -> None:
        """Call while idle: keeps the other ranks' waits short and notices a dead rank
        (raises RankFailure)."""
        if self.link is not None:
            self.link.keepalive()

    def _copy_block(self, src: int, dst: int) -> None:
        """One block's row of the packed pool (every MLA layer's pages) into another; under
        several ranks each repeats it on its own pool before the next step."""
        self.kv_pool[dst].copy_(self.kv_pool[src])
        if self.link is not None:
            self.state_pool.pending.append(("copy_block", src, dst))

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

    def speculation_stats(self) -> SpeculationStats | None:
        """A copy of the speculative decoding counters (spec_stats.py); None without a draft."""
        return self.speculative.stats.copy() if self.speculative is not None else None

    # -- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; -> the outputs of every request that got a new token."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        emitted = self._run(scheduled)
        # n > 1: prefills that just ended; their other completions continue from this prompt
        forking = [item.seq for item in scheduled if item.seq.forks and item.is_last_chunk]
        touched: dict[str, _Request] = {}
        finished: list[Sequence] = []
        for step in emitted:
            seq, num_appended = step.seq, 0
            for token, logprobs in zip(step.tokens, step.logprobs):
                seq.append_token(token, logprobs)
                num_appended += 1
                self.stop_checker.check(seq, self.config.max_model_len)
                if seq.is_finished:
                    finished.append(seq)
                    break
            if step.verified is not None:
                self.speculative.settle(step, num_appended)
            touched[seq.request_id] = self.requests[seq.request_id]
        # after the tokens are appended: blocks that accepted drafts filled get their hashes
        self.scheduler.complete(scheduled)
        for parent in forking:
            self.scheduler.fork(parent)
        for seq in finished:
            self.scheduler.finish(seq)
        outputs = [self._output(request) for request in touched.values()]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
        return outputs

    def _run(self, scheduled: list) -> list[StepTokens]:
        if self.speculative is not None:        # one rank only (config_checks.py)
            return self.speculative.run(scheduled)
        if self.link is None:
            return self._plain(scheduled)
        try:
            return self._plain(scheduled)
        except RankFailure:
            raise
        except Exception as error:   # the ranks may now wait in different collectives
            raise self.link.fail("a step failed", error) from error

    def _plain(self, scheduled: list) -> list[StepTokens]:
        return [StepTokens(seq, [token], [logprobs])
                for seq, token, logprobs in self.runner.run(scheduled)]

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
