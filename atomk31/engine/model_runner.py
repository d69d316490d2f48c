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
from atomk31.engine.sampler import Sampler
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.engine.sequence import Sequence
from atomk31.model import ForwardBatch, K31Model
from atomk31.ops import Kernels, OpTable


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

    def run(self, scheduled: list[ScheduledSequence]) -> list[tuple[ScheduledSequence, int, object]]:
        """Run one step; -> (item, sampled token id, logprobs info) for each item whose last
        token was computed this step (a finished prefill or a decode)."""
        logits = self.graphs.run(scheduled) if self.graphs is not None else None
        if logits is None:
            logits = self.forward(self.prepare(scheduled))
        sampling = [item for item in scheduled if item.is_last_chunk]
        if not sampling:
            return []
        seqs = [item.seq for item in sampling]
        tokens, logprobs = self.sampler(logits, [s.sampling_params for s in seqs],
                                        [s.generator(self.device) for s in seqs],
                                        [self.suppressed_token_ids(s) for s in seqs])
        token_list = tokens.tolist()
        return [(item, token_list[i], logprobs[i] if logprobs is not None else None)
                for i, item in enumerate(sampling)]

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
        tables = [item.seq.block_table + [-1] * (max_blocks - len(item.seq.block_table))
                  for item in scheduled]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        return ForwardBatch(
            input_ids=tensor(ids, torch.int64),
            positions=tensor(positions, torch.int64),
            token_request=tensor(token_request, torch.int32),
            cu_seqlens=tensor(cu_seqlens, torch.int32),
            block_tables=tensor(tables, torch.int32),
            slot_mapping=tensor(slot_mapping, torch.int64),
            state_slots=tensor([item.seq.state_slot for item in scheduled], torch.int64),
            has_initial_state=tensor([item.seq.num_computed_tokens > 0 for item in scheduled],
                                     torch.bool),
            logits_indices=tensor(logits_indices, torch.int64),
            snapshots=tensor(snapshots, torch.int64).view(-1, 3),
            block_size=bs,
            max_position=max(positions),
            is_decode_only=all(item.num_new_tokens == 1 for item in scheduled),
            rows_per_request=math.gcd(*(item.num_new_tokens for item in scheduled)),
        )
