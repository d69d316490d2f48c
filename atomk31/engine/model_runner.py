"""ModelRunner: turns a scheduled step into batch tensors, runs the model, samples.

It owns the device side: the model, the packed KV pool with its per-layer views, the KDA state
tensors and the sampler. It knows sequences only through what the scheduler hands it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from atomk31.cache import KDAStatePool, MLACacheView
from atomk31.engine.cuda_graphs import DecodeGraphs
from atomk31.engine.sampler import Sampler, token_logprobs
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.engine.sequence import Sequence
from atomk31.model import ForwardBatch, K31Model
from atomk31.ops import Kernels, OpTable


# Start of every column in the packed upload: kernels may load them with 16-byte accesses.
UPLOAD_ALIGN_BYTES = 16


class ModelRunner:
    def __init__(self, model: K31Model, kernels: Kernels, kv_views: list[MLACacheView],
                 state_pool: KDAStatePool, block_size: int, device: torch.device,
                 suppressed_token_ids: Callable[[Sequence], list[int]]):
        self.model = model
        self.kernels = kernels
        self.kv_views = kv_views
        self.state_pool = state_pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.suppressed_token_ids = suppressed_token_ids   # EOS / stops before min_tokens
        self.graphs: DecodeGraphs | None = None             # set by the engine on a GPU

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
        prompt_rows = _prompt_logprob_rows(scheduled)
        logits = (self.graphs.run(scheduled)
                  if self.graphs is not None and not prompt_rows else None)
        if logits is None:
            batch = self.prepare(scheduled)
            num_sampling = batch.logits_indices.numel()
            if prompt_rows:
                extra = [i for rows in prompt_rows for i in rows[2]]
                batch.logits_indices = torch.cat([batch.logits_indices, torch.tensor(
                    extra, dtype=torch.int64).to(self.device)])
            logits = self.forward(batch)
            if prompt_rows:
                self._record_prompt_logprobs(prompt_rows, logits[num_sampling:])
                logits = logits[:num_sampling]
        sampling = [item for item in scheduled if item.is_last_chunk]
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

    def _record_prompt_logprobs(self, prompt_rows: list[tuple[Sequence, list[int], list[int]]],
                                logits: torch.Tensor) -> None:
        """logits [sum of rows, V]: row j predicts prompt token positions[j] of its sequence."""
        start = 0
        for seq, positions, _ in prompt_rows:
            rows = logits[start:start + len(positions)]
            start += len(positions)
            targets = [seq.all_token_ids[p] for p in positions]
            entries = token_logprobs(rows, torch.tensor(targets, device=rows.device),
                                     seq.sampling_params.prompt_logprobs)
            for p, entry in zip(positions, entries):
                seq.prompt_logprobs[p] = entry

    def prepare(self, scheduled: list[ScheduledSequence]) -> ForwardBatch:
        ids: list[int] = []
        positions: list[int] = []
        token_request: list[int] = []
        slot_mapping: list[int] = []
        cu_seqlens = [0]
        logits_indices: list[int] = []
        snapshots: list[tuple[int, int, int]] = []
        bs = self.block_size
        for r, item in enumerate(scheduled):
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            tokens = seq.all_token_ids
            ids.extend(tokens[start:start + n])
            positions.extend(range(start, start + n))
            token_request.extend([r] * n)
            table = seq.block_table
            slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            cu_seqlens.append(cu_seqlens[-1] + n)
            if item.is_last_chunk:
                logits_indices.append(cu_seqlens[-1] - 1)
            snapshots.extend((r, m, slot) for m, slot, _ in item.snapshots)
        max_blocks = max(len(item.seq.block_table) for item in scheduled)
        tables = [b for item in scheduled
                  for b in item.seq.block_table + [-1] * (max_blocks - len(item.seq.block_table))]
        t = upload(self.device, {
            "input_ids": (ids, torch.int64), "positions": (positions, torch.int64),
            "slot_mapping": (slot_mapping, torch.int64),
            "state_slots": ([item.seq.state_slot for item in scheduled], torch.int64),
            "has_initial_state": ([int(item.seq.num_computed_tokens > 0) for item in scheduled],
                                  torch.int64),
            "logits_indices": (logits_indices, torch.int64),
            "snapshots": ([v for row in snapshots for v in row], torch.int64),
            "token_request": (token_request, torch.int32), "cu_seqlens": (cu_seqlens, torch.int32),
            "block_tables": (tables, torch.int32)})
        return ForwardBatch(
            input_ids=t["input_ids"],
            positions=t["positions"],
            token_request=t["token_request"],
            cu_seqlens=t["cu_seqlens"],
            block_tables=t["block_tables"].view(len(scheduled), max_blocks),
            slot_mapping=t["slot_mapping"],
            state_slots=t["state_slots"],
            has_initial_state=t["has_initial_state"].bool(),
            logits_indices=t["logits_indices"],
            snapshots=t["snapshots"].view(-1, 3),
            block_size=bs,
            max_position=max(positions),
            is_decode_only=all(item.num_new_tokens == 1 for item in scheduled),
            rows_per_request=math.gcd(*(item.num_new_tokens for item in scheduled)),
        )


def upload(device: torch.device, columns: dict[str, tuple[list[int], torch.dtype]]
           ) -> dict[str, torch.Tensor]:
    """The step's integer columns on ``device`` with one host-to-device copy per dtype: packed
    into one buffer (pinned on a GPU, so the copy is asynchronous) and split into views there.
    A copy per column from pageable memory would cost a launch and a host stall each."""
    out: dict[str, torch.Tensor] = {}
    for dtype in {dtype for _, dtype in columns.values()}:
        names = [name for name, (_, d) in columns.items() if d == dtype]
        align = UPLOAD_ALIGN_BYTES // dtype.itemsize
        flat: list[int] = []
        starts = []
        for name in names:           # every column starts on a 16-byte boundary
            starts.append(len(flat))
            flat.extend(columns[name][0])
            flat.extend([0] * (-len(flat) % align))
        host = torch.tensor(flat, dtype=dtype)
        if device.type == "cuda":
            host = host.pin_memory()
        packed = host.to(device, non_blocking=True)
        for name, start in zip(names, starts):
            out[name] = packed[start:start + len(columns[name][0])]
    return out


def _prompt_logprob_rows(scheduled: list[ScheduledSequence]
                         ) -> list[tuple[Sequence, list[int], list[int]]]:
    """Per item that wants prompt logprobs: (sequence, prompt positions p >= 1 whose logprob
    this step can give, the flat batch index of the token before each). The logits of token
    p - 1 give token p's logprob; the last prompt token's row is the sampling row."""
    rows = []
    offset = 0
    for item in scheduled:
        seq, n = item.seq, item.num_new_tokens
        start = seq.num_computed_tokens
        if seq.needs_prompt_logprobs:
            last = min(start + n, seq.num_prompt_tokens - 1)   # computed positions < last
            positions = list(range(start + 1, last + 1))
            if positions:
                rows.append((seq, positions, [offset + p - 1 - start for p in positions]))
        offset += n
    return rows
