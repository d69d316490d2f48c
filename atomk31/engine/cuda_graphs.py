"""CUDA graphs of the decode step: every kernel of a step launched by one graph replay.

A decode step runs some thirty kernels a layer over 93 layers. At small batch their host time
(Python, Triton's dispatch: 10-150 us a launch) exceeds their GPU time, so eager decode leaves
the GPU idle. Like nano-vllm, vLLM and ATOM, the engine captures the step once per shape and
replays it.

Shapes. A graph serves a (batch, context) pair: ``batch`` is the request count padded up to
one of GRAPH_BATCH_SIZES, ``context`` the smallest bucket (``context_buckets``: powers of two,
the model's ``index_topk`` and the context length) that holds every request's positions. The
step's host-side values are the bucket's: the model's ``max_position`` is ``context - 1``, so
its choice between dense and sparse attention, the top-k's k and every grid size are the
same for each step a graph serves (``index_topk`` is a bucket edge, so no step changes path),
and the kernels bound each row by its own position, read from the tensors. A replay therefore
equals the eager step up to summation order (a bucket's grid may split a row's keys
differently: in float32 the GPU test's greedy tokens agree and their logprobs within 1e-3;
bf16 greedy tokens of a random model can flip at near-ties). Each graph owns its input tensors (token ids, positions, block tables, cache slots,
state slots), filled before every replay.

Padding rows decode token 0 at position 0 of a scratch block into a scratch KDA state slot
(both reserved by the engine outside the cache pools): they read and write only scratch memory,
and their logits are dropped. A decode that ends a block takes its KDA snapshot after the
replay: with one new token, the state "after its first m tokens" is the final state, copied
into the snapshot slot.

Kernels. Graph steps run the kernels of the engine's graph table, eager steps those of its eager
table (ops/registry.py builds both at start-up: on Hopper the graph table takes the Gluon
indexer, whose host launch is slow; on AMD the eager table takes kernels a capture cannot
hold). Capture is lazy, on a shape's first step: one forward over padding rows with the graph
table (it compiles every kernel), then the capture, then one replay checked against the eager
step on the same inputs (graph_check.py). All graphs share one memory pool; only one replays at
a time and its logits are consumed before the next step. At most MAX_GRAPHS are kept (least
recently used dropped): each holds its block tables (batch x context / block_size int32) and
the graph's kernel parameters.

Not graphed: prefill and mixed steps, more requests than the largest size, and every step when
an op the model calls has no implementation a graph may capture (why_no_decode_graphs: the
torch backend, whose ops read the device from the host). A capture that fails, or a replay
that disagrees with the eager step, turns that shape eager with a warning naming the op and
the error; eager steps go on.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from atomk31.engine.graph_check import replay_error, replay_tolerance, suspect_op
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.model import ForwardBatch
from atomk31.ops import Kernels, OpTable
from atomk31.ops.registry import OpUnavailableError

logger = logging.getLogger(__name__)

# Request counts a graph is captured for (nano-vllm's list): fine steps where decode batches
# are common, 16 apart above.
GRAPH_BATCH_SIZES = (1, 2, 4, 8) + tuple(range(16, 513, 16))
# The smallest context bucket in tokens: shorter contexts share one graph per batch size.
MIN_GRAPH_CONTEXT = 256
# Graphs kept at once (least recently used dropped beyond): shapes change slowly in decode (a
# context bucket doubles), so a few dozen cover a server's working set.
MAX_GRAPHS = 48


def why_no_decode_graphs(kernels: Kernels, enforce_eager: bool,
                         ops_called: Sequence[str] | set[str] | None = None) -> str | None:
    """Why the engine decodes eagerly, or None when it replays graphs: they need a GPU, and an
    implementation a graph may capture for every op the model calls (``ops_called``; None:
    every registered op)."""
    if not kernels.context.target.is_gpu:
        return "no GPU"
    if enforce_eager:
        return "--enforce-eager"
    return kernels.why_no_graphs(ops_called)


def graph_batch_size(num_requests: int, max_batch: int) -> int | None:
    """The smallest size of GRAPH_BATCH_SIZES (up to ``max_batch``) that holds
    ``num_requests``; None when none does."""
    sizes = [b for b in GRAPH_BATCH_SIZES if b <= max_batch]
    i = bisect_left(sizes, num_requests)
    return sizes[i] if i < len(sizes) else None


def context_buckets(max_context: int, block_size: int, split_points: Sequence[int] = ()
                    ) -> list[int]:
    """Context sizes (tokens) graphs are captured for: powers of two from
    max(MIN_GRAPH_CONTEXT, block_size), the ``split_points`` where the model changes path
    (``index_topk``), and ``max_context`` (the context length) rounded up to whole blocks."""
    top = -(-max_context // block_size) * block_size
    buckets = {top} | {p for p in split_points if 0 < p < top}
    size = max(MIN_GRAPH_CONTEXT, block_size)
    while size < top:
        buckets.add(size)
        size *= 2
    return sorted(buckets)


class DecodeInputs:
    """The tensors one graph reads: a ForwardBatch of ``batch`` one-token requests over
    ``context`` positions, refilled before each replay."""

    def __init__(self, batch: int, context: int, block_size: int, scratch_block: int,
                 scratch_slot: int, device: torch.device):
        self.batch_size, self.context, self.block_size = batch, context, block_size
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        columns = context // block_size
        rows = torch.arange(batch, device=device)
        # ids, positions, cache slots and state slots side by side: one copy fills them
        self.columns = torch.zeros(4, batch, dtype=torch.int64, device=device)
        ids, positions, slot_mapping, state_slots = self.columns.unbind(0)
        self.batch = ForwardBatch(
            input_ids=ids,
            positions=positions,
            token_request=rows.to(torch.int32),
            cu_seqlens=torch.arange(batch + 1, dtype=torch.int32, device=device),
            block_tables=torch.full((batch, columns), -1, dtype=torch.int32, device=device),
            slot_mapping=slot_mapping,
            state_slots=state_slots,
            has_initial_state=torch.ones(batch, dtype=torch.bool, device=device),
            logits_indices=rows,
            snapshots=torch.zeros(0, 3, dtype=torch.int64, device=device),
            block_size=block_size, max_position=context - 1, is_decode_only=True,
            rows_per_request=1)
        self.fill([])

    def fill(self, scheduled: list[ScheduledSequence]) -> None:
        """Write the step's requests into rows 0..n-1 and padding into the rest."""
        bs, columns = self.block_size, self.context // self.block_size
        ids, positions, slots, state_slots = [], [], [], []
        tables = torch.full((self.batch_size, columns), -1, dtype=torch.int32)
        for r, item in enumerate(scheduled):
            seq = item.seq
            p = seq.num_computed_tokens
            ids.append(seq.all_token_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
            state_slots.append(seq.state_slot)
            # blocks past the last position are never read (a table may run ahead)
            table = seq.block_table[:columns]
            tables[r, :len(table)] = torch.tensor(table, dtype=torch.int32)
        padding = self.batch_size - len(scheduled)
        ids += [0] * padding
        positions += [0] * padding
        slots += [self.scratch_block * bs] * padding
        state_slots += [self.scratch_slot] * padding
        tables[len(scheduled):, 0] = self.scratch_block
        host = torch.tensor([ids, positions, slots, state_slots], dtype=torch.int64)
        if self.columns.is_cuda:         # pinned: the copies are asynchronous
            host, tables = host.pin_memory(), tables.pin_memory()
        self.columns.copy_(host, non_blocking=True)
        self.batch.block_tables.copy_(tables, non_blocking=True)


class _Graph:
    def __init__(self, inputs: DecodeInputs, graph: torch.cuda.CUDAGraph, logits: torch.Tensor):
        self.inputs, self.graph, self.logits = inputs, graph, logits


class DecodeGraphs:
    """Captures and replays the decode step (module docstring). ``forward(batch, ops)`` runs
    the model over a ForwardBatch with an op table and returns the logits of its
    ``logits_indices``. ``backup_slot``: a scratch KDA state slot for the replay check."""

    def __init__(self, forward: Callable[[ForwardBatch, OpTable], torch.Tensor],
                 kernels: Kernels, block_size: int, max_batch: int, max_context: int,
                 split_points: Sequence[int], scratch_block: int, scratch_slot: int,
                 backup_slot: int, device: torch.device, copy_state: Callable[[int, int], None]):
        self.forward = forward
        self.graph_ops, self.eager_ops = kernels.graph, kernels.eager
        self.tolerance = replay_tolerance(kernels.context.compute_dtype)
        self.backup_slot = backup_slot
        self.block_size = block_size
        self.max_batch = max_batch
        self.buckets = context_buckets(max_context, block_size, split_points)
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        self.device = device
        self.copy_state = copy_state          # (src slot, dst slot): a KDA snapshot
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.refused: dict[tuple[int, int], str] = {}   # shapes that run eagerly, and why
        self.pool = None
        self.enabled = True
        self.num_replays = 0

    def shape_for(self, scheduled: list[ScheduledSequence]) -> tuple[int, int] | None:
        """(batch, context) of the graph that runs this step; None when it is not a decode
        step a graph can run."""
        if not self.enabled or not scheduled:
            return None
        if any(item.num_new_tokens != 1 or not item.is_last_chunk for item in scheduled):
            return None
        batch = graph_batch_size(len(scheduled), self.max_batch)
        need = max(item.seq.num_computed_tokens for item in scheduled) + 1
        i = bisect_left(self.buckets, need)
        if batch is None or i == len(self.buckets):
            return None
        return batch, self.buckets[i]

    def run(self, scheduled: list[ScheduledSequence]) -> torch.Tensor | None:
        """Logits [len(scheduled), vocab] of this decode step from a graph replay; None when
        no graph runs it (run it eagerly)."""
        shape = self.shape_for(scheduled)
        if shape is None or shape in self.refused:
            return None
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self._capture(*shape)
            if graph is None or not self._replay_agrees(graph, scheduled[0], shape):
                return None
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.popitem(last=False)         # the least recently replayed
            self.graphs[shape] = graph
        self.graphs.move_to_end(shape)
        graph.inputs.fill(scheduled)
        graph.graph.replay()
        self.num_replays += 1
        for item in scheduled:
            for _, snapshot_slot, _ in item.snapshots:
                self.copy_state(item.seq.state_slot, snapshot_slot)
        return graph.logits[:len(scheduled)]

    def _capture(self, batch: int, context: int) -> _Graph | None:
        inputs = DecodeInputs(batch, context, self.block_size, self.scratch_block,
                              self.scratch_slot, self.device)
        try:
            self.forward(inputs.batch, self.graph_ops)     # warm-up: compiles every kernel
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.forward(inputs.batch, self.graph_ops)
        except OpUnavailableError as failure:
            self.enabled = False
            logger.warning("CUDA graphs off: %s; decoding eagerly", str(failure))
            return None
        except Exception as failure:       # noqa: BLE001 (any kernel's error: refuse the shape)
            # logged and kept as text: a record holding the exception would hold its traceback,
            # whose frames hold this engine (its pools stay allocated while any handler, pytest's
            # log capture for one, keeps the record)
            where = "; ".join(getattr(failure, "__notes__", ())) or "outside the ops"
            self.refused[batch, context] = f"capture failed {where}: {failure}"
            logger.warning("decode steps of %d requests at context %d run eagerly: capturing "
                           "them failed %s: %s", batch, context, where, str(failure))
            return None
        logger.info("captured the decode step for %d requests, context %d", batch, context)
        return _Graph(inputs, graph, logits)

    def _replay_agrees(self, graph: _Graph, item: ScheduledSequence,
                       shape: tuple[int, int]) -> bool:
        """Replay the new graph once on ``item`` (graph_check.py); refuse its shape if the
        replay differs from the eager step."""
        graph.inputs.fill([item])
        slot = item.seq.state_slot

        def replay() -> torch.Tensor:
            graph.graph.replay()
            return graph.logits
        error = replay_error(replay, graph.inputs.batch, self.forward, self.eager_ops, slot,
                             self.backup_slot, self.copy_state)
        if error <= self.tolerance:
            return True
        suspect = suspect_op(graph.inputs.batch, self.forward, self.graph_ops, self.eager_ops,
                             slot, self.backup_slot, self.copy_state, self.tolerance)
        self.refused[shape] = f"replay differs from the eager step by {error:.2e}: {suspect}"
        logger.warning("decode steps of %d requests at context %d run eagerly: the graph's "
                       "replay differs from the eager step by %.2e (relative, tolerance %.0e); "
                       "%s", *shape, error, self.tolerance, suspect)
        return False
