"""ModelRunner: turns a scheduled step into batch tensors, runs the model, samples.

It owns the device side: the model, the packed KV pool with its per-layer views, the KDA state
tensors and the sampler. It knows sequences only through what the scheduler hands it. Under
tensor parallelism the first rank's runner hands each step's `StepRequest`s to
``publish_step`` (the broadcast to the other ranks, whose runners build and run the same step)
before running it, and alone samples.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atomk31.cache import KDAStatePool, MLACacheView
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.engine.cuda_graphs import DecodeGraphs
from atomk31.engine.sampler import Sampler, token_logprobs
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.engine.sequence import Sequence
from atomk31.engine.step_batch import StepRequest, build_forward_batch, prompt_logprob_positions
from atomk31.model import ForwardBatch, K31Model
from atomk31.ops import Kernels, OpTable


class ModelRunner:
    def __init__(self, model: K31Model, kernels: Kernels, kv_views: list[MLACacheView],
                 state_pool: KDAStatePool, block_size: int, device: torch.device,
                 suppressed_token_ids: Callable[[Sequence], list[int]],
                 parallel: ParallelContext | None = None):
        self.model = model
        self.kernels = kernels
        self.kv_views = kv_views
        self.state_pool = state_pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.suppressed_token_ids = suppressed_token_ids   # EOS / stops before min_tokens
        self.graphs: DecodeGraphs | None = None             # set by the engine on a GPU
        self.parallel = parallel or ParallelContext.single()
        # the first rank of several: sends each step to the others before running it
        self.publish_step: Callable[[list[StepRequest]], None] | None = None

    def forward(self, batch: ForwardBatch, ops: OpTable | None = None) -> torch.Tensor:
        """The model over one batch with this runner's caches and the kernels of ``ops`` (the
        eager table unless told): logits of batch.logits_indices."""
        return self.model.forward(batch, self.kv_views, self.state_pool.conv,
                                  self.state_pool.recurrent, ops or self.kernels.eager)

    def run(self, scheduled: list[ScheduledSequence]) -> list[tuple[Sequence, int, object]]:
        """Run one step; -> (sequence, sampled token id, logprobs info) for each sequence that
        samples this step: those whose last token was computed (a finished prefill or a
        decode), and the forks of a finished prefill, from the same logits row (n > 1).
        Prompt logprobs asked for are written into each sequence as its prompt is computed."""
        requests = self.step_requests(scheduled)
        if self.publish_step is not None:       # the other ranks run the same step
            self.publish_step(requests)
        logits = self.run_requests(requests, prompt_logprob_rows(scheduled))
        return self.sample([item for item in scheduled if item.is_last_chunk], logits)

    def run_requests(self, requests: list[StepRequest],
                     prompt_rows: list[tuple[Sequence, list[int]]] = ()) -> torch.Tensor:
        """This rank's forward of a step (every rank calls it with the same requests): a graph
        replay where one serves the step, else the eager forward. -> the logits of its
        sampling rows (on the first rank; other ranks' are slices nothing reads)."""
        logits = self.graphs.run(requests) if self.graphs is not None else None
        if logits is None:
            logits = self.forward_step(self.build(requests), prompt_rows, self.forward)
        return logits

    def forward_step(self, batch: ForwardBatch,
                     prompt_rows: list[tuple[Sequence, list[int]]],
                     forward: Callable[[ForwardBatch], torch.Tensor]) -> torch.Tensor:
        """``forward(batch)``'s logits of the sampling and verify rows, with the prompt
        logprobs of ``prompt_rows`` (`prompt_logprob_rows`; their rows come last in
        batch.logits_indices, build_forward_batch) recorded on the side."""
        logits = forward(batch)
        if prompt_rows:
            split = logits.shape[0] - sum(len(positions) for _, positions in prompt_rows)
            self._record_prompt_logprobs(prompt_rows, logits[split:])
            logits = logits[:split]
        return logits

    def sample(self, sampling: list[ScheduledSequence], logits: torch.Tensor
               ) -> list[tuple[Sequence, int, object]]:
        """One token for each sequence of `sampling` (items whose last token was computed, and
        their forks) from its item's row of logits [len(sampling), V]."""
        seqs = [seq for item in sampling for seq in item.sampled_seqs]
        if not seqs:
            return []
        if len(seqs) > len(sampling):   # forks sample from their parent's row
            rows = [r for r, item in enumerate(sampling) for _ in item.sampled_seqs]
            logits = logits[torch.tensor(rows, device=logits.device)]
        tokens, logprobs = self.sampler(logits, [s.sampling_params for s in seqs],
                                        [s.generator(self.device) for s in seqs],
                                        [self.suppressed_token_ids(s) for s in seqs])
        token_list = tokens.tolist()
        return [(seq, token_list[i], logprobs[i] if logprobs is not None else None)
                for i, seq in enumerate(seqs)]

    def _record_prompt_logprobs(self, prompt_rows: list[tuple[Sequence, list[int]]],
                                logits: torch.Tensor) -> None:
        """logits [sum of rows, V]: row j predicts prompt token positions[j] of its sequence."""
        start = 0
        for seq, positions in prompt_rows:
            rows = logits[start:start + len(positions)]
            start += len(positions)
            targets = [seq.all_token_ids[p] for p in positions]
            entries = token_logprobs(rows, torch.tensor(targets, device=rows.device),
                                     seq.sampling_params.prompt_logprobs)
            for p, entry in zip(positions, entries):
                seq.prompt_logprobs[p] = entry

    def prepare(self, scheduled: list[ScheduledSequence], drafts: list[list[int]] | None = None,
                row_states: list[tuple[int, int, int]] = ()) -> ForwardBatch:
        """The step's batch. Speculative steps (engine/speculative.py) pass `drafts`: per item,
        tokens that follow its own (a verify pass, whose every row's logits are wanted), and
        `row_states`: (r, m, slot) rows, the KDA state of request r after its first m rows
        kept in `slot` (after each verify row, §5.7)."""
        return self.build(self.step_requests(scheduled, drafts), row_states)

    def step_requests(self, scheduled: list[ScheduledSequence],
                      drafts: list[list[int]] | None = None) -> list[StepRequest]:
        return [StepRequest.of(item, drafts[r] if drafts is not None else [])
                for r, item in enumerate(scheduled)]

    def build(self, requests: list[StepRequest],
              row_states: list[tuple[int, int, int]] = ()) -> ForwardBatch:
        """This rank's batch of a step (under DCP: the cache slots of the tokens it holds)."""
        layout = self.parallel.layout
        return build_forward_batch(requests, self.block_size, self.device, layout.dcp_size,
                                   layout.dcp_rank, row_states)


def prompt_logprob_rows(scheduled: list[ScheduledSequence]
                        ) -> list[tuple[Sequence, list[int]]]:
    """Per item that wants prompt logprobs: (sequence, prompt positions p >= 1 whose logprob
    this step can give). The logits of token p - 1 give token p's logprob; the last prompt
    token's row is the sampling row. `StepRequest.of` asks for the same rows."""
    rows = []
    for item in scheduled:
        positions = prompt_logprob_positions(item)
        if positions:
            rows.append((item.seq, positions))
    return rows
