"""Shadow mode: run every op on two backends and record, per op, how far they disagree.

A debugging tool for "the engine's output differs, which kernel is it?". ``ShadowOpTable``
stands in for an ``OpTable``: each call runs the ``checked`` backend's implementation and the
``reference`` backend's on copies of the same inputs, records the largest difference of every
output and of every input tensor the op wrote in place (caches, states), then hands the engine
the reference's results (``follow="reference"``, the default) so that every op is judged on
exactly the inputs the reference path would give it: differences do not compound from layer to
layer, and the first op on the list is the culprit, not a victim.

    table = ShadowOpTable(kernels.eager, torch_kernels.eager)   # two select_kernels tables
    ... run the model with `table` ...
    for op, stats in table.report(): print(op, stats)

Integer outputs (top-k slots, ids) are compared element by element, or as sets per row when
``unordered_ops`` names the op (none by default: every backend's top-k lists its set in
ascending position); a difference there counts as 1.0 (a wrong slot is not "close").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from atomk31.ops.registry import OpTable


@dataclass
class ShadowStats:
    """Largest differences seen for one op, over all its calls."""

    calls: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0   # max |checked - reference| / max |reference| of the same tensor
    worst: str = ""        # which output or argument gave max_rel, at which call

    def add(self, what: str, call: int, abs_err: float, rel_err: float) -> None:
        self.max_abs = max(self.max_abs, abs_err)
        if rel_err > self.max_rel:
            self.max_rel, self.worst = rel_err, f"{what} (call {call})"


@dataclass
class ShadowOpTable:
    """An OpTable look-alike that checks ``checked`` against ``reference`` op by op."""

    checked: OpTable
    reference: OpTable
    follow: str = "reference"
    unordered_ops: frozenset[str] = frozenset()
    stats: dict[str, ShadowStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.follow not in ("reference", "checked"):
            raise ValueError(f"follow must be 'reference' or 'checked', got {self.follow!r}")

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        checked_fn = getattr(self.checked, op)
        reference_fn = getattr(self.reference, op)

        def shadowed(*args, **kwargs):
            return self._run(op, checked_fn, reference_fn, args, kwargs)

        return shadowed

    def describe(self) -> list[tuple[str, str, str, str, str]]:
        return self.checked.describe()

    def report(self) -> list[tuple[str, ShadowStats]]:
        """(op, stats) sorted by the largest relative difference, worst first."""
        return sorted(self.stats.items(), key=lambda item: -item[1].max_rel)

    def _run(self, op: str, checked_fn: Callable, reference_fn: Callable, args: tuple,
             kwargs: dict) -> object:
        ref_args, ref_kwargs = _clone(args), _clone(kwargs)
        out = checked_fn(*args, **kwargs)
        ref_out = reference_fn(*ref_args, **ref_kwargs)
        stats = self.stats.setdefault(op, ShadowStats())
        stats.calls += 1
        unordered = op in self.unordered_ops
        for what, got, want in _pairs("output", out, ref_out):
            stats.add(what, stats.calls, *_difference(got, want, unordered))
        # inputs the ops wrote in place (caches, recurrent states)
        for what, got, want in _pairs("arg", (args, kwargs), (ref_args, ref_kwargs)):
            stats.add(what, stats.calls, *_difference(got, want, unordered))
        if self.follow == "checked":
            return out
        for got, want in zip(_tensors((args, kwargs)), _tensors((ref_args, ref_kwargs))):
            if not torch.equal(got, want):
                got.copy_(want)
        return ref_out


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _tensors(value) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _pairs(prefix: str, got, want) -> Iterable[tuple[str, torch.Tensor, torch.Tensor]]:
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        yield prefix, got, want
    elif isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        for i, (g, w) in enumerate(zip(got, want)):
            yield from _pairs(f"{prefix}[{i}]", g, w)
    elif isinstance(got, dict) and isinstance(want, dict):
        for key in got.keys() & want.keys():
            yield from _pairs(f"{prefix}[{key!r}]", got[key], want[key])


def _difference(got: torch.Tensor, want: torch.Tensor, unordered: bool) -> tuple[float, float]:
    """(max abs difference, the same relative to max |want|); 1.0 relative for a shape or
    integer mismatch."""
    if got.shape != want.shape:
        return float("inf"), 1.0
    if got.numel() == 0:
        return 0.0, 0.0
    if not got.is_floating_point():
        if unordered:
            got, want = got.sort(dim=-1).values, want.sort(dim=-1).values
        return (0.0, 0.0) if torch.equal(got, want) else (1.0, 1.0)
    got, want = got.double(), want.double()
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return float("inf"), 1.0
    diff = (got - want)[finite].abs()
    if diff.numel() == 0:
        return 0.0, 0.0
    scale = want[finite].abs().max().clamp_min(1e-30)
    return diff.max().item(), (diff.max() / scale).item()
