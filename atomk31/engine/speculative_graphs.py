"""CUDA graphs of speculative steps: the draft's block pass and the target's verify forward.

With a draft, every target forward also writes the draft's context rows, so the decode graphs
of cuda_graphs.py (which do not) are off, and these two families serve instead; both follow
cuda_graphs.py's rules (batch padded to GRAPH_BATCH_SIZES, context buckets with the top-k edge,
lazy capture, one replay checked against the eager step before a shape serves, LRU of
MAX_GRAPHS, a failed capture or check turning its shape eager):

* verify graphs, shape (requests, rows per request, context): every request of the step
  decodes with the same number of drafts, rows = 1 + drafts (1: a plain decode step, e.g.
  while min_tokens holds speculation back). The captured function is the target forward with
  taps plus the context-row write (`SpeculativeRunner.forward`); the inputs are the verify
  rows' ids, positions, cache slots, block tables, the request's state slot and, for rows > 1,
  the slot each row's KDA state goes to (§5.7). Padding requests run token 0 from position 0 of
  the scratch block with the scratch state slot. The logits of all rows come back.
* draft graphs, shape (requests, drafts, context): the block pass (`DSparkDraft.block_logits`)
  over `[x_a, mask, ...]`; padding requests write their block rows into the scratch block.
  The Markov head's sequential picks stay eager (a GEMV and a sample per draft).

A rows = 1 step that ends a block takes its KDA snapshot after the replay (a copy of the final
state, as the decode graphs do); a verify step's snapshots are taken by `settle` from the
row slots. Not graphed: prefill and mixed steps, steps whose requests draft different counts,
more requests than the largest graph, drafts beyond the block size (the padding's block rows
must fit the scratch block).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable

import torch

from atomk31.engine.cuda_graphs import MAX_GRAPHS, context_buckets, graph_batch_size
from atomk31.engine.graph_check import replay_error, replay_tolerance
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.model import ForwardBatch
from atomk31.model.dspark import DraftBatch
from atomk31.ops import Kernels, OpTable
from atomk31.ops.registry import OpUnavailableError

logger = logging.getLogger(__name__)


class VerifyInputs:
    """A ForwardBatch of `batch` requests of `rows` rows each over `context` positions."""

    def __init__(self, batch: int, rows: int, context: int, block_size: int,
                 scratch_block: int, scratch_slot: int, device: torch.device):
        self.batch_size, self.rows, self.context = batch, rows, context
        self.block_size, self.scratch_block, self.scratch_slot = block_size, scratch_block, scratch_slot
        total = batch * rows
        arange = torch.arange(total, device=device)
        # ids, positions, cache slots, row state slots side by side: one copy fills them
        self.columns = torch.zeros(4, total, dtype=torch.int64, device=device)
        ids, positions, slot_mapping, row_slots = self.columns.unbind(0)
        self.state_slots = torch.zeros(batch, dtype=torch.int64, device=device)
        snapshots = torch.zeros(total if rows > 1 else 0, 3, dtype=torch.int64, device=device)
        if rows > 1:            # (r, i + 1, slot): the state after row i (slots filled per step)
            snapshots[:, 0] = arange // rows
            snapshots[:, 1] = arange % rows + 1
            self.row_slots = row_slots
        self.snapshot_rows = snapshots
        self.batch = ForwardBatch(
            input_ids=ids, positions=positions,
            token_request=(arange // rows).to(torch.int32),
            cu_seqlens=(torch.arange(batch + 1, device=device) * rows).to(torch.int32),
            block_tables=torch.full((batch, context // block_size), -1, dtype=torch.int32,
                                    device=device),
            slot_mapping=slot_mapping, state_slots=self.state_slots,
            has_initial_state=torch.ones(batch, dtype=torch.bool, device=device),
            logits_indices=arange, snapshots=snapshots, block_size=block_size,
            max_position=context - 1, is_decode_only=rows == 1, rows_per_request=rows,
            verify_rows=rows if rows > 1 else 0)
        self.fill([], [])

    def fill(self, scheduled: list[ScheduledSequence], drafts: list[list[int]]) -> None:
        bs, columns, rows = self.block_size, self.context // self.block_size, self.rows
        ids, positions, slots, row_slots, state_slots = [], [], [], [], []
        tables = torch.full((self.batch_size, columns), -1, dtype=torch.int32)
        for r, item in enumerate(scheduled):
            seq = item.seq
            start = seq.num_computed_tokens
            ids += [seq.all_token_ids[start]] + drafts[r]
            positions += list(range(start, start + rows))
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, start + rows)]
            row_slots += ([seq.state_slot] + seq.extra_state_slots)[:rows]
            state_slots.append(seq.state_slot)
            table = seq.block_table[:columns]
            tables[r, :len(table)] = torch.tensor(table, dtype=torch.int32)
        padding = (self.batch_size - len(scheduled)) * rows
        ids += [0] * padding
        positions += [p % rows for p in range(padding)]
        slots += [self.scratch_block * bs + p % rows for p in range(padding)]
        row_slots += [self.scratch_slot] * padding
        state_slots += [self.scratch_slot] * (self.batch_size - len(scheduled))
        tables[len(scheduled):, 0] = self.scratch_block
        host = torch.tensor([ids, positions, slots, row_slots], dtype=torch.int64)
        _copy(self.columns, host)
        _copy(self.state_slots, torch.tensor(state_slots, dtype=torch.int64))
        _copy(self.batch.block_tables, tables)
        if rows > 1:
            self.snapshot_rows[:, 2].copy_(self.row_slots)


class DraftInputs:
    """A DraftBatch of `batch` requests of `rows` block rows each over `context` positions."""

    def __init__(self, batch: int, rows: int, context: int, block_size: int,
                 scratch_block: int, mask_token_id: int, device: torch.device):
        self.batch_size, self.rows, self.context = batch, rows, context
        self.block_size, self.scratch_block, self.mask = block_size, scratch_block, mask_token_id
        total = batch * rows
        self.columns = torch.zeros(4, total, dtype=torch.int64, device=device)
        ids, positions, keys, slot_mapping = self.columns.unbind(0)
        self.batch = DraftBatch(
            input_ids=ids, positions=positions, key_positions=keys,
            token_request=(torch.arange(total, device=device) // rows).to(torch.int32),
            block_tables=torch.full((batch, context // block_size), -1, dtype=torch.int32,
                                    device=device),
            slot_mapping=slot_mapping, block_size=block_size, max_position=context - 1,
            rows_per_request=rows)
        self.fill([])

    def fill(self, items: list[ScheduledSequence]) -> None:
        bs, columns, rows = self.block_size, self.context // self.block_size, self.rows
        ids, positions, keys, slots = [], [], [], []
        tables = torch.full((self.batch_size, columns), -1, dtype=torch.int32)
        for r, item in enumerate(items):
            seq = item.seq
            start = seq.num_computed_tokens
            ids += [seq.all_token_ids[start]] + [self.mask] * (rows - 1)
            positions += list(range(start, start + rows))
            keys += [start + rows - 1] * rows
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, start + rows)]
            table = seq.block_table[:columns]
            tables[r, :len(table)] = torch.tensor(table, dtype=torch.int32)
        padding = self.batch_size - len(items)
        ids += [0] * (padding * rows)
        positions += list(range(rows)) * padding
        keys += [rows - 1] * (padding * rows)
        slots += [self.scratch_block * bs + j for j in range(rows)] * padding
        tables[len(items):, 0] = self.scratch_block
        _copy(self.columns, torch.tensor([ids, positions, keys, slots], dtype=torch.int64))
        _copy(self.batch.block_tables, tables)


def _copy(device_tensor: torch.Tensor, host: torch.Tensor) -> None:
    if device_tensor.is_cuda:            # pinned: the copy is asynchronous
        host = host.pin_memory()
    device_tensor.copy_(host, non_blocking=True)


class _Graph:
    def __init__(self, inputs, graph, output: torch.Tensor):
        self.inputs, self.graph, self.output = inputs, graph, output


class GraphFamily:
    """Lazily captured graphs of one step function by shape (module docstring): `run(shape,
    fill, probe)` fills the shape's inputs, replays and returns its output, or None when the
    shape runs eagerly. `make_inputs(shape)` builds a shape's inputs; `forward(batch, ops)`
    is the captured function; `check(graph, probe)` proves a new graph (graph_check.py)."""

    def __init__(self, name: str, make_inputs: Callable, forward: Callable, kernels: Kernels,
                 check: Callable[[_Graph, object, Kernels], bool]):
        self.name, self.make_inputs, self.forward = name, make_inputs, forward
        self.kernels, self.check = kernels, check
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.refused: dict[tuple, str] = {}
        self.pool = None
        self.enabled = True
        self.num_replays = 0

    def run(self, shape: tuple, fill: Callable, probe: object) -> torch.Tensor | None:
        if not self.enabled or shape in self.refused:
            return None
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self._capture(shape)
            if graph is None or not self.check(graph, probe, self.kernels):
                self.refused.setdefault(shape, "its replay differs from the eager step")
                return None
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.popitem(last=False)
            self.graphs[shape] = graph
        self.graphs.move_to_end(shape)
        fill(graph.inputs)
        graph.graph.replay()
        self.num_replays += 1
        return graph.output

    def _capture(self, shape: tuple) -> _Graph | None:
        inputs = self.make_inputs(shape)
        ops = self.kernels.graph
        try:
            self.forward(inputs.batch, ops)                 # warm-up: compiles every kernel
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                output = self.forward(inputs.batch, ops)
        except OpUnavailableError as failure:
            self.enabled = False
            logger.warning("%s graphs off: %s; running them eagerly", self.name, str(failure))
            return None
        except Exception as failure:       # noqa: BLE001 (any kernel's error: refuse the shape)
            where = "; ".join(getattr(failure, "__notes__", ())) or "outside the ops"
            self.refused[shape] = f"capture failed {where}: {failure}"
            logger.warning("%s steps of shape %s run eagerly: capturing them failed %s: %s",
                           self.name, shape, where, str(failure))
            return None
        logger.info("captured the %s step of shape %s", self.name, shape)
        return _Graph(inputs, graph, output)


class SpeculativeGraphs:
    """The verify and draft graph families of one engine (module docstring)."""

    def __init__(self, forward: Callable[[ForwardBatch, OpTable], torch.Tensor],
                 draft_forward: Callable[[DraftBatch, OpTable], torch.Tensor],
                 kernels: Kernels, block_size: int, max_batch: int, max_context: int,
                 split_points: list[int], scratch_block: int, scratch_slot: int,
                 backup_slot: int, mask_token_id: int, device: torch.device,
                 copy_state: Callable[[int, int], None]):
        self.block_size, self.max_batch = block_size, max_batch
        self.buckets = context_buckets(max_context, block_size, split_points)
        self.backup_slot, self.copy_state = backup_slot, copy_state
        self.tolerance = replay_tolerance(kernels.context.compute_dtype)
        self.verify = GraphFamily(
            "verify", lambda shape: VerifyInputs(*shape, block_size, scratch_block, scratch_slot,
                                                 device),
            forward, kernels, self._verify_agrees)
        self.draft = GraphFamily(
            "draft", lambda shape: DraftInputs(*shape, block_size, scratch_block, mask_token_id,
                                               device),
            draft_forward, kernels, self._draft_agrees)

    def shape_for(self, scheduled: list[ScheduledSequence], extra_rows: int = 1
                  ) -> tuple[int, int, int] | None:
        """(batch, rows, context) when every item is a decode with the same drafts; `rows` is
        1 + drafts for the verify pass (extra_rows = 1), drafts for the block pass (0)."""
        if not scheduled or any(i.num_new_tokens != 1 or not i.is_last_chunk for i in scheduled):
            return None
        drafts = {item.num_draft_tokens for item in scheduled}
        rows = next(iter(drafts)) + extra_rows
        if len(drafts) != 1 or rows == 0 or rows > self.block_size:
            return None
        batch = graph_batch_size(len(scheduled), self.max_batch)
        need = max(item.seq.num_computed_tokens for item in scheduled) + rows
        i = bisect_left(self.buckets, need)
        if batch is None or i == len(self.buckets):
            return None
        return batch, rows, self.buckets[i]

    def run(self, scheduled: list[ScheduledSequence], drafts: list[list[int]]
            ) -> torch.Tensor | None:
        """Logits of every row of this step from a verify graph, or None (run it eagerly)."""
        shape = self.shape_for(scheduled)
        if shape is None:
            return None
        logits = self.verify.run(shape, lambda inputs: inputs.fill(scheduled, drafts),
                                 (scheduled[0], drafts[0]))
        if logits is None:
            return None
        if shape[1] == 1:                 # a plain decode: its snapshot is the final state
            for item in scheduled:
                for _, snapshot_slot, _ in item.snapshots:
                    self.copy_state(item.seq.state_slot, snapshot_slot)
        return logits[:len(scheduled) * shape[1]]

    def draft_logits(self, items: list[ScheduledSequence]) -> torch.Tensor | None:
        """The block pass's base logits of `items` from a draft graph, or None."""
        shape = self.shape_for(items, extra_rows=0)
        if shape is None:
            return None
        base = self.draft.run(shape, lambda inputs: inputs.fill(items), items[0])
        return None if base is None else base[:len(items) * shape[1]]

    def _verify_agrees(self, graph: _Graph, probe, kernels: Kernels) -> bool:
        item, drafts = probe
        graph.inputs.fill([item], [drafts])
        rows = graph.inputs.rows

        def replay() -> torch.Tensor:
            graph.graph.replay()
            return graph.output[:rows].reshape(1, -1)

        def eager(batch, ops) -> torch.Tensor:
            return self.verify.forward(batch, ops)[:rows].reshape(1, -1)
        error = replay_error(replay, graph.inputs.batch, eager, kernels.eager,
                             item.seq.state_slot, self.backup_slot, self.copy_state)
        return self._judge("verify", graph, error)

    def _draft_agrees(self, graph: _Graph, item: ScheduledSequence, kernels: Kernels) -> bool:
        graph.inputs.fill([item])
        rows = graph.inputs.rows

        def replay() -> torch.Tensor:
            graph.graph.replay()
            return graph.output[:rows].reshape(1, -1)

        def eager(batch, ops) -> torch.Tensor:
            return self.draft.forward(batch, ops)[:rows].reshape(1, -1)
        error = replay_error(replay, graph.inputs.batch, eager, kernels.eager, 0, 0,
                             lambda src, dst: None)
        return self._judge("draft", graph, error)

    def _judge(self, name: str, graph: _Graph, error: float) -> bool:
        if error <= self.tolerance:
            return True
        inputs = graph.inputs
        logger.warning("%s steps of %d requests, %d rows, context %d run eagerly: the graph's "
                       "replay differs from the eager step by %.2e (relative, tolerance %.0e)",
                       name, inputs.batch_size, inputs.rows, inputs.context, error,
                       self.tolerance)
        return False
