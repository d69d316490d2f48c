"""An op table that watches the engine's op calls: the experts each `moe_route` call picks, and
profiler ranges named `op:<name>` around every call.

`InstrumentedOpTable` stands in for an `OpTable` the way `atomk31/ops/shadow.py`'s
`ShadowOpTable` does: attribute access returns the wrapped implementation. The model's layers
keep the table they were built with, so `instrumented(model, table)` swaps every reference to the
engine's table inside the model for the wrapper while the block runs, and puts the original back
after; nothing in the engine changes. Eager steps only: a CUDA-graph replay calls no Python.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from atomk31.ops import OpTable

if TYPE_CHECKING:
    from atomk31.engine.llm_engine import LLMEngine

ROUTING_OP = "moe_route"


@dataclass
class InstrumentedOpTable:
    """An OpTable look-alike around `table`. With `record_routes`, the expert ids [T, k] of
    every `moe_route` call are kept in `routes` (one entry per MoE layer and step); with
    `annotate`, each call runs inside `torch.profiler.record_function("op:<name>")`."""

    table: OpTable
    record_routes: bool = False
    annotate: bool = False
    routes: list[torch.Tensor] = field(default_factory=list)

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        fn = getattr(self.table, op)

        def watched(*args, **kwargs):
            with (torch.profiler.record_function(f"op:{op}") if self.annotate
                  else contextlib.nullcontext()):
                out = fn(*args, **kwargs)
            if self.record_routes and op == ROUTING_OP:
                self.routes.append(out[1].detach())
            return out

        return watched

    def backend_of(self, op: str) -> str:
        return self.table.backend_of(op)

    def describe(self) -> list[tuple[str, str, str]]:
        return self.table.describe()

    def distinct_experts(self) -> int:
        """Distinct experts summed over the recorded `moe_route` calls (each call is one MoE
        layer of one step)."""
        return sum(int(torch.unique(ids).numel()) for ids in self.routes)


@contextlib.contextmanager
def instrumented(model: object, table: OpTable, wrapper: InstrumentedOpTable) -> Iterator[int]:
    """Within the block, every attribute inside `model` that holds `table` holds `wrapper`;
    yields how many references were swapped (0 means the model reaches its ops some other way,
    which the caller should treat as an error)."""
    swapped = _swap_references(model, table, wrapper)
    try:
        yield len(swapped)
    finally:
        for owner, name in swapped:
            setattr(owner, name, table)


def _swap_references(root: object, old: object, new: object) -> list[tuple[object, str]]:
    """Set every attribute equal (by identity) to `old`, reachable from `root` through object
    attributes, lists, tuples and dicts, to `new`; -> the (owner, attribute) pairs changed."""
    swapped: list[tuple[object, str]] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (torch.Tensor, str, bytes, int, float, bool,
                                               types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            stack.extend(obj)
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
            continue
        attributes = getattr(obj, "__dict__", None)
        if not isinstance(attributes, dict) or obj is old:
            continue
        for name, value in list(attributes.items()):
            if value is old:
                setattr(obj, name, new)
                swapped.append((obj, name))
            else:
                stack.append(value)
    return swapped


@contextlib.contextmanager
def watched_eager_steps(engine: "LLMEngine", wrapper: InstrumentedOpTable) -> Iterator[None]:
    """Engine steps run inside the block are eager (the CUDA graphs are detached, so every op
    call goes through Python) and call their ops through `wrapper`."""
    runner = engine.runner
    graphs, runner.graphs = runner.graphs, None
    try:
        with instrumented(engine.model, engine.ops, wrapper) as num_swapped:
            if num_swapped == 0:
                raise RuntimeError("the model holds no reference to the engine's op table, so "
                                   "its op calls cannot be watched; atomk31/bench/"
                                   "instrumented_ops.py must follow how model/ reaches its ops")
            yield
    finally:
        runner.graphs = graphs
