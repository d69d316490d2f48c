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

Several ranks. Every rank holds its own DecodeGraphs and runs the same steps (the first
rank's `StepRequest`s), so each captures, checks and replays the same shapes in the same order
and the collectives inside the graphs (NCCL records them in the capture) meet. What could
differ is agreed at the two points where a rank decides alone: after a capture, one all-reduce
of each rank's outcome (all captured, or the shape refused everywhere, or graphs off
everywhere); after the replay check, the first rank's verdict (only it holds the whole logits)
broadcast to the others, which ran the same replay and eager step beside it. Graph snapshots
and the check's backups copy KDA states with `copy_state` on each rank itself
(`KDAStatePool.copy_states`), not as slot operations the first rank records for the others:
those would be made again there before the next step, and the other ranks' pools hand out no
slots to check them against. A rank whose capture
raised before the warm-up forward's collectives were all issued leaves the others waiting in
one until the collective timeout: the engine then fails with the timeout, not a wrong token.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from atomk31.distributed.communicator import LocalCommunicator
from atomk31.engine.graph_check import replay_error, replay_tolerance, suspect_op
from atomk31.engine.step_batch import StepRequest, slot_of
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
    ``context`` positions, refilled before each replay. Under DCP (``dcp_size`` ranks, this one
    ``dcp_rank``) a token's cache slot is this rank's (step_batch.slot_of: -1 where another
    rank stores it)."""

    def __init__(self, batch: int, context: int, block_size: int, scratch_block: int,
                 scratch_slot: int, device: torch.device, dcp_size: int = 1, dcp_rank: int = 0):
        self.batch_size, self.context, self.block_size = batch, context, block_size
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        self.dcp_size, self.dcp_rank = dcp_size, dcp_rank
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

    def fill(self, requests: list[StepRequest]) -> None:
        """Write the step's one-token requests into rows 0..n-1 and padding into the rest."""
        bs, columns = self.block_size, self.context // self.block_size
        dcp = (self.dcp_size, self.dcp_rank)
        ids, positions, slots, state_slots = [], [], [], []
        tables = torch.full((self.batch_size, columns), -1, dtype=torch.int32)
        for r, request in enumerate(requests):
            p = request.start
            ids.append(request.token_ids[0])
            positions.append(p)
            slots.append(slot_of(p, request.block_table, bs, *dcp))
            state_slots.append(request.state_slot)
            # blocks past the last position are never read (a table may run ahead)
            table = request.block_table[:columns]
            tables[r, :len(table)] = torch.tensor(table, dtype=torch.int32)
        padding = self.batch_size - len(requests)
        ids += [0] * padding
        positions += [0] * padding
        slots += [slot_of(0, [self.scratch_block], bs, *dcp)] * padding
        state_slots += [self.scratch_slot] * padding
        tables[len(requests):, 0] = self.scratch_block
        host = torch.tensor([ids, positions, slots, state_slots], dtype=torch.int64)
        if self.columns.is_cuda:         # pinned: the copies are asynchronous
            host, tables = host.pin_memory(), tables.pin_memory()
        self.columns.copy_(host, non_blocking=True)
        self.batch.block_tables.copy_(tables, non_blocking=True)


class _Graph:
    def __init__(self, inputs: DecodeInputs, graph: torch.cuda.CUDAGraph, logits: torch.Tensor):
        self.inputs, self.graph, self.logits = inputs, graph, logits


# what a capture came to on one rank; the ranks take the worst (several ranks, module docstring)
CAPTURED, SHAPE_REFUSED, GRAPHS_OFF = 0, 1, 2


class DecodeGraphs:
    """Captures and replays the decode step (module docstring). ``forward(batch, ops)`` runs
    the model over a ForwardBatch with an op table and returns the logits of its
    ``logits_indices``. ``backup_slot``: a scratch KDA state slot for the replay check.
    ``comm``: the engine's TP communicator (every rank); ``dcp_size``, ``dcp_rank``: this
    rank's place in its DCP group (the cache slots it writes)."""

    def __init__(self, forward: Callable[[ForwardBatch, OpTable], torch.Tensor],
                 kernels: Kernels, block_size: int, max_batch: int, max_context: int,
                 split_points: Sequence[int], scratch_block: int, scratch_slot: int,
                 backup_slot: int, device: torch.device, copy_state: Callable[[int, int], None],
                 comm=None, dcp_size: int = 1, dcp_rank: int = 0):
        self.forward = forward
        self.graph_ops, self.eager_ops = kernels.graph, kernels.eager
        self.tolerance = replay_tolerance(kernels.context.compute_dtype)
        self.backup_slot = backup_slot
        self.block_size = block_size
        self.max_batch = max_batch
        self.buckets = context_buckets(max_context, block_size, split_points)
        self.scratch_block, self.scratch_slot = scratch_block, scratch_slot
        self.device = device
        self.copy_state = copy_state          # (src slot, dst slot) on this rank
        self.comm = comm or LocalCommunicator()
        self.dcp_size, self.dcp_rank = dcp_size, dcp_rank
        self.is_first_rank = self.comm.rank == 0
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.refused: dict[tuple[int, int], str] = {}   # shapes that run eagerly, and why
        self.pool = None
        self.enabled = True
        self.num_replays = 0

    def shape_for(self, requests: list[StepRequest]) -> tuple[int, int] | None:
        """(batch, context) of the graph that runs this step; None when it is not a decode
        step a graph can run (a function of the requests alone: every rank finds the same)."""
        if not self.enabled or not requests:
            return None
        if any(len(r.token_ids) != 1 or not r.is_last_chunk or r.draft_tokens
               or r.prompt_logit_rows for r in requests):
            return None
        batch = graph_batch_size(len(requests), self.max_batch)
        need = max(r.start for r in requests) + 1
        i = bisect_left(self.buckets, need)
        if batch is None or i == len(self.buckets):
            return None
        return batch, self.buckets[i]

    def run(self, requests: list[StepRequest]) -> torch.Tensor | None:
        """Logits [len(requests), vocab] of this decode step from a graph replay; None when
        no graph runs it (run it eagerly)."""
        shape = self.shape_for(requests)
        if shape is None or shape in self.refused:
            return None
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self._capture(*shape)
            if graph is None or not self._replay_agrees(graph, requests[0], shape):
                return None
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.popitem(last=False)         # the least recently replayed
            self.graphs[shape] = graph
        self.graphs.move_to_end(shape)
        graph.inputs.fill(requests)
        graph.graph.replay()
        self.num_replays += 1
        for request in requests:
            for _, snapshot_slot in request.snapshots:
                self.copy_state(request.state_slot, snapshot_slot)
        return graph.logits[:len(requests)]

    def _capture(self, batch: int, context: int) -> _Graph | None:
        inputs = DecodeInputs(batch, context, self.block_size, self.scratch_block,
                              self.scratch_slot, self.device, self.dcp_size, self.dcp_rank)
        graph = outcome = None
        try:
            self.forward(inputs.batch, self.graph_ops)     # warm-up: compiles every kernel
            graph, logits = self._record(inputs)
            outcome = CAPTURED
        except OpUnavailableError as failure:
            outcome, why = GRAPHS_OFF, str(failure)
        except Exception as failure:       # noqa: BLE001 (any kernel's error: refuse the shape)
            # kept as text: a record holding the exception would hold its traceback, whose
            # frames hold this engine (its pools stay allocated while any handler, pytest's log
            # capture for one, keeps the record)
            where = "; ".join(getattr(failure, "__notes__", ())) or "outside the ops"
            outcome, why = SHAPE_REFUSED, f"capturing them failed {where}: {failure}"
        agreed = self._worst(outcome)
        if agreed == CAPTURED:
            logger.info("captured the decode step for %d requests, context %d", batch, context)
            return _Graph(inputs, graph, logits)
        if outcome == CAPTURED:
            why = "another rank's capture failed"
        if agreed == GRAPHS_OFF:
            self.enabled = False
            logger.warning("CUDA graphs off: %s; decoding eagerly", why)
        else:
            self.refused[batch, context] = why
            logger.warning("decode steps of %d requests at context %d run eagerly: %s", batch,
                           context, why)
        return None

    def _record(self, inputs: DecodeInputs) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The step over ``inputs`` captured into a CUDA graph: (graph, its logits tensor)."""
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.forward(inputs.batch, self.graph_ops)
        return graph, logits

    def _worst(self, outcome: int) -> int:
        """The worst capture outcome over the ranks (one small all-reduce; none on one rank)."""
        if self.comm.world_size == 1:
            return outcome
        flag = torch.tensor([outcome], dtype=torch.int32, device=self.device)
        return int(self.comm.all_reduce(flag, "max").item())

    def _replay_agrees(self, graph: _Graph, request: StepRequest,
                       shape: tuple[int, int]) -> bool:
        """Replay the new graph once on ``request`` (graph_check.py); refuse its shape if the
        replay differs from the eager step. Every rank runs the check; the first rank, which
        alone holds whole logits, judges."""
        graph.inputs.fill([request])
        slot = request.state_slot

        def replay() -> torch.Tensor:
            graph.graph.replay()
            return graph.logits
        error = replay_error(replay, graph.inputs.batch, self.forward, self.eager_ops, slot,
                             self.backup_slot, self.copy_state)
        agrees, error = self.comm.broadcast_object((error <= self.tolerance, error))
        if agrees:
            return True
        suspect = suspect_op(graph.inputs.batch, self.forward, self.graph_ops, self.eager_ops,
                             slot, self.backup_slot, self.copy_state, self.tolerance)
        if not self.is_first_rank:
            suspect = "see the first rank's log"
        self.refused[shape] = f"replay differs from the eager step by {error:.2e}: {suspect}"
        logger.warning("decode steps of %d requests at context %d run eagerly: the graph's "
                       "replay differs from the eager step by %.2e (relative, tolerance %.0e); "
                       "%s", *shape, error, self.tolerance, suspect)
        return False
