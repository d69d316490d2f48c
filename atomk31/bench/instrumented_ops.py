"""Watching the engine's op calls: the experts each `moe_route` call picks, and profiler ranges
named `op:<name>` around every call.

An `OpWatcher` is a wrapper for `OpTable.wrapped` (the table's hook for profiling and
recording: the same kernel choices, every op's callable passed through `watcher.wrap`).
`watched_eager_steps(engine, watcher)` runs the engine's steps inside the block on its eager
table so wrapped, with the CUDA graphs detached (a replay calls no Python), and puts the
engine's own tables and graphs back after; nothing in the engine changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from atomk31.engine.llm_engine import LLMEngine

ROUTING_OP = "moe_route"


@dataclass
class OpWatcher:
    """With `record_routes`, keeps the expert ids [T, k] of every `moe_route` call in `routes`
    (one entry per MoE layer and step); with `annotate`, runs each call inside
    `torch.profiler.record_function("op:<name>")`."""

    record_routes: bool = False
    annotate: bool = False
    routes: list[torch.Tensor] = field(default_factory=list)

    def wrap(self, op: str, fn: Callable) -> Callable:
        """`fn` (the table's implementation of `op`) with this watcher around it."""
        def watched(*args, **kwargs):
            with (torch.profiler.record_function(f"op:{op}") if self.annotate
                  else contextlib.nullcontext()):
                out = fn(*args, **kwargs)
            if self.record_routes and op == ROUTING_OP:
                self.routes.append(out[1].detach())
            return out

        watched.__name__ = op
        return watched

    def distinct_experts(self) -> int:
        """Distinct experts summed over the recorded `moe_route` calls (each call is one MoE
        layer of one step)."""
        return sum(int(torch.unique(ids).numel()) for ids in self.routes)


@contextlib.contextmanager
def watched_eager_steps(engine: "LLMEngine", watcher: OpWatcher) -> Iterator[None]:
    """Engine steps run inside the block are eager (graphs detached) and call their ops through
    `watcher` (module docstring)."""
    runner = engine.runner
    graphs, kernels = runner.graphs, runner.kernels
    runner.graphs = None
    runner.kernels = dataclasses.replace(kernels, eager=kernels.eager.wrapped(watcher.wrap))
    try:
        yield
    finally:
        runner.graphs, runner.kernels = graphs, kernels
