"""The tables ``select_kernels`` builds: one implementation per op, shape class and step.

``table.indexer_score(...)`` calls the implementation chosen for that op (for ops with shape
classes, the one chosen for the class the call falls in); before any implementation but the
torch one (which checks its own inputs, being the op's definition) it runs the op's argument
check. An exception raised inside carries a note naming the op and the kernel, so a failed
graph capture can say which op failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from atomk31.ops.target import KernelContext


class OpUnavailableError(ValueError):
    """No registered implementation of an op can serve the requested context (or step)."""


@dataclass(frozen=True)
class Skipped:
    """An implementation passed over, and why."""

    target: str
    kernel: str      # "" when the target has no implementation of the op
    reason: str

    def line(self) -> str:
        name = self.kernel.rsplit(".", 1)[-1] if self.kernel else ""
        return f"{self.target}{' ' + name if name else ''}: {self.reason}"


@dataclass(frozen=True)
class Choice:
    """The implementation chosen for one (op, step, shape class); target None when no
    implementation may serve it (graph tables only: graphs are then off)."""

    target: str | None
    kernel: str
    fn: Callable | None
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class OpEntry:
    op: str
    choices: dict[str, Choice]          # shape class -> choice
    classify: Callable[..., str] | None
    check: Callable[..., None] | None


_TABLE_ATTRIBUTES = frozenset({"step", "entries", "describe", "choice", "missing", "wrapped"})


class OpTable:
    """The chosen implementations of one step kind ("eager" or "graph"); ops are attributes."""

    def __init__(self, step: str, entries: dict[str, OpEntry],
                 wrap: Callable[[str, Callable], Callable] | None = None):
        self.step = step
        self.entries = entries
        for op, entry in entries.items():
            if op in _TABLE_ATTRIBUTES:
                raise ValueError(f"op name {op!r} collides with an OpTable attribute")
            fn = _dispatcher(entry)
            setattr(self, op, wrap(op, fn) if wrap is not None else fn)

    def __getattr__(self, op: str) -> Callable:
        # only reached for names that are not ops (ops are instance attributes)
        raise AttributeError(f"no op named {op!r} in this table; known ops: "
                             f"{sorted(self.entries)}")

    def choice(self, op: str, shape: str | None = None) -> Choice:
        """What runs ``op`` (for ``shape``, or the op's only class)."""
        if op not in self.entries:
            raise ValueError(f"no op named {op!r} in this table; known ops: "
                             f"{sorted(self.entries)}")
        choices = self.entries[op].choices
        if shape is None:
            if len(choices) != 1:
                raise ValueError(f"op {op!r} has shape classes {sorted(choices)}: name one")
            return next(iter(choices.values()))
        return choices[shape]

    def describe(self) -> list[tuple[str, str, str, str, str]]:
        """(op, shape class, target, kernel, what was passed over and why) per op and class,
        sorted by op; the last is "" when the first candidate was taken."""
        rows = []
        for op in sorted(self.entries):
            for shape, choice in self.entries[op].choices.items():
                rows.append((op, shape, choice.target or "-", choice.kernel or "(none)",
                             "; ".join(s.line() for s in choice.skipped)))
        return rows

    def missing(self) -> list[str]:
        """Ops with a shape class no implementation may serve in this step (graph tables)."""
        return sorted(op for op, entry in self.entries.items()
                      if any(c.fn is None for c in entry.choices.values()))

    def wrapped(self, wrap: Callable[[str, Callable], Callable]) -> OpTable:
        """The same choices with every op's callable passed through ``wrap(op, fn)`` (for
        profiling and recording; the engine's tables are never wrapped)."""
        return OpTable(self.step, self.entries, wrap)


@dataclass(frozen=True)
class Kernels:
    """The engine's two tables and what they were chosen for."""

    backend: str
    context: KernelContext
    eager: OpTable
    graph: OpTable

    def why_no_graphs(self, ops_called: Iterable[str] | None = None) -> str | None:
        """Why no step can be captured: one of ``ops_called`` (the ops the model calls; None:
        every op) has no implementation a graph may capture."""
        called = None if ops_called is None else set(ops_called)
        missing = [op for op in self.graph.missing() if called is None or op in called]
        if not missing:
            return None
        op = missing[0]
        reasons = "; ".join(s.line() for c in self.graph.entries[op].choices.values()
                            if c.fn is None for s in c.skipped)
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        return f"op {op} has no implementation a graph may capture ({reasons}){more}"


def _dispatcher(entry: OpEntry) -> Callable:
    op, choices, classify = entry.op, entry.choices, entry.classify
    if classify is None:
        choice = next(iter(choices.values()))
        check = entry.check if choice.target != "torch" else None
        return _call(op, choice, check)
    calls = {shape: _call(op, c, entry.check if c.target != "torch" else None)
             for shape, c in choices.items()}

    def call_by_shape(*args, **kwargs):
        return calls[classify(*args, **kwargs)](*args, **kwargs)
    call_by_shape.__name__ = op
    return call_by_shape


def _call(op: str, choice: Choice, check: Callable[..., None] | None) -> Callable:
    fn = choice.fn
    if fn is None:
        reasons = "; ".join(s.line() for s in choice.skipped)

        def unavailable(*args, **kwargs):
            raise OpUnavailableError(f"op {op} has no implementation for this step ({reasons})")
        return unavailable
    where = f"in op {op} ({choice.target}: {choice.kernel})"

    def call(*args, **kwargs):
        if check is not None:
            check(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if hasattr(error, "add_note") and where not in getattr(error, "__notes__", ()):
                error.add_note(where)
            raise
    call.__name__ = op
    return call
