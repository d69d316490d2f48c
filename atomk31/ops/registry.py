"""The kernel registry: every implementation of every op, and the one place kernels are chosen.

Each op module registers its implementations at its bottom, one per target:

    register("indexer_score", "hopper", "gluon_kernels.hopper.indexer_score:indexer_score_hopper",
             why_not=needs_sm90, not_in_eager="a Gluon launch costs ~70 us more host time")

Targets (DESIGN.md §3): ``torch`` (the op's definition, any device), ``triton`` (portable GPU
kernels), ``hopper`` (Gluon and Triton kernels written for sm_90), ``amd`` (Gluon, FlyDSL and
aiter for gfx950 / gfx942). An implementation says why it cannot serve a `KernelContext`
(``why_not``), whether graph steps may capture it (``not_in_graph``) or eager steps should pass
it over (``not_in_eager``), and, for ops that split calls into shape classes (``define_op``:
e.g. "many_rows" for prefill), which classes it serves.

At start-up the engine calls ``select_kernels(backend, context)`` once and gets two tables, one
for eager steps and one for graph steps. Per op, step and shape class the first implementation
along the backend's fallback chain (amd -> triton -> torch, hopper -> triton -> torch) that
has no reason against it is chosen, and the reasons of every implementation passed over are
kept: ``describe()`` lists them, and that is what ``atomk31 info`` prints. A launcher runs what
it is given; nothing else chooses kernels.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from atomk31.ops.op_table import (  # noqa: F401 (OpUnavailableError: part of this API)
    Choice, Kernels, OpEntry, OpTable, OpUnavailableError, Skipped,
)
from atomk31.ops.target import KernelContext

logger = logging.getLogger(__name__)

TARGETS = ("torch", "triton", "hopper", "amd")
BACKEND_CHOICES = ("auto",) + TARGETS
STEPS = ("eager", "graph")
ANY_SHAPE = "any"
FALLBACK_CHAIN = {
    "amd": ("amd", "triton", "torch"),
    "hopper": ("hopper", "triton", "torch"),
    "triton": ("triton", "torch"),
    "torch": ("torch",),
}


@dataclass(frozen=True)
class Implementation:
    """One registered implementation of an op (``register``'s arguments)."""

    op: str
    target: str
    fn: Callable | str
    why_not: Callable[[KernelContext], str | None] | None = None
    not_in_graph: str | Mapping[str, str] | None = None
    not_in_eager: str | Mapping[str, str] | None = None
    shapes: frozenset[str] | None = None
    step_config: Mapping[str, object] | None = None

    @property
    def kernel(self) -> str:
        """A readable name of what runs: the function's dotted path."""
        if isinstance(self.fn, str):
            return self.fn.replace(":", ".")
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def reason_against(self, context: KernelContext, step: str, shape: str) -> str | None:
        if self.shapes is not None and shape not in self.shapes:
            return f"serves {', '.join(sorted(self.shapes))} only"
        reason = self.why_not(context) if self.why_not is not None else None
        if reason is None:
            reason = self.not_in_graph if step == "graph" else self.not_in_eager
            if isinstance(reason, Mapping):       # per shape class
                reason = reason.get(shape)
        return reason

    def resolve(self, step: str, import_now: bool) -> Callable:
        """The callable this step runs: the function, with this step's config object bound as
        ``config=`` where ``step_config`` gives one. Names ("module:name") are imported now
        when ``import_now`` (the target is present: a missing package fails at start-up),
        else on the first call (tables printed for an absent target import nothing)."""
        if not import_now:
            return _imported_on_first_call(self, step)
        fn = _imported(self.fn) if isinstance(self.fn, str) else self.fn
        config = (self.step_config or {}).get(step)
        if config is None:
            return fn
        if isinstance(config, str):
            config = _imported(config)

        def with_config(*args, **kwargs):
            return fn(*args, config=config, **kwargs)
        with_config.__wrapped__ = fn
        return with_config


@dataclass(frozen=True)
class OpSpec:
    """What ``define_op`` says about an op: its shape classes, how a call is classified, and
    its argument check (host metadata only, so a graph capture may run it)."""

    name: str
    shapes: tuple[str, ...] = (ANY_SHAPE,)
    classify: Callable[..., str] | None = None
    check: Callable[..., None] | None = None
    shape_help: Mapping[str, str] = field(default_factory=dict)


@dataclass
class OpRegistry:
    """All registered implementations, keyed by op. The package uses one module-level
    instance (``register`` / ``select_kernels`` below); tests build their own."""

    specs: dict[str, OpSpec] = field(default_factory=dict)
    implementations: dict[str, list[Implementation]] = field(default_factory=dict)

    def define_op(self, op: str, *, shapes: Mapping[str, str] | None = None,
                  classify: Callable[..., str] | None = None,
                  check: Callable[..., None] | None = None) -> None:
        """Declare ``op``'s shape classes (name -> what it means, e.g. "many_rows": ">= 256
        query rows") with the ``classify(*args) -> class`` that sorts a call, and its argument
        ``check(*args)`` (run before every non-torch implementation; torch ones check their
        own inputs, as the op's definition)."""
        if (shapes is None) != (classify is None):
            raise ValueError(f"op {op!r}: give shapes and classify together, or neither")
        _check_name(op)
        self.specs[op] = OpSpec(op, tuple(shapes) if shapes else (ANY_SHAPE,), classify, check,
                                dict(shapes or {}))

    def register(self, op: str, target: str, fn: Callable | str, *,
                 why_not: Callable[[KernelContext], str | None] | None = None,
                 not_in_graph: str | Mapping[str, str] | None = None,
                 not_in_eager: str | Mapping[str, str] | None = None,
                 shapes: tuple[str, ...] | None = None,
                 step_config: Mapping[str, object] | None = None) -> None:
        """Record one implementation of ``op`` for ``target`` (module docstring). ``fn`` is a
        callable or "module:function" (imported only when a table chooses it). The reasons
        ``not_in_graph`` / ``not_in_eager`` may be given per shape class (a mapping). Several
        implementations of one target are tried in registration order."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r} for op {op!r}; expected one of "
                             f"{TARGETS}")
        _check_name(op)
        spec = self.specs.setdefault(op, OpSpec(op))
        if shapes is not None and not set(shapes) <= set(spec.shapes):
            raise ValueError(f"op {op!r} has shape classes {spec.shapes}; got {shapes}. "
                             "Declare them with define_op first")
        new = Implementation(op, target, fn, why_not, not_in_graph, not_in_eager,
                             frozenset(shapes) if shapes is not None else None, step_config)
        entries = self.implementations.setdefault(op, [])
        # a module reloaded registers the same function again: replace it
        entries[:] = [i for i in entries if (i.target, i.kernel) != (target, new.kernel)]
        entries.append(new)

    def registered_ops(self) -> list[str]:
        return sorted(self.implementations)

    def select_kernels(self, backend: str, context: KernelContext) -> Kernels:
        """The eager and graph tables for ``backend`` ("auto" or a target) on ``context``."""
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"unknown kernel backend {backend!r}; choose one of "
                             f"{', '.join(BACKEND_CHOICES)} (--kernel-backend)")
        requested = resolve_backend(backend, context.target)
        tables = {step: OpTable(step, {op: self._entry(op, requested, context, step)
                                       for op in self.implementations})
                  for step in STEPS}
        logger.info("kernels: backend %s (requested %s) on %s", requested, backend,
                    context.target.name)
        return Kernels(requested, context, tables["eager"], tables["graph"])

    def _entry(self, op: str, requested: str, context: KernelContext, step: str) -> OpEntry:
        spec = self.specs[op]
        choices = {shape: self._choose(op, requested, context, step, shape)
                   for shape in spec.shapes}
        return OpEntry(op, choices, spec.classify, spec.check)

    def _choose(self, op: str, requested: str, context: KernelContext, step: str,
                shape: str) -> Choice:
        skipped: list[Skipped] = []
        for target in FALLBACK_CHAIN[requested]:
            candidates = [i for i in self.implementations[op] if i.target == target]
            if not candidates:
                skipped.append(Skipped(target, "", "no kernel yet"))
            for implementation in candidates:
                reason = implementation.reason_against(context, step, shape)
                if reason is None:
                    fn = implementation.resolve(step, import_now=context.target.is_present)
                    return Choice(target, implementation.kernel, fn, tuple(skipped))
                skipped.append(Skipped(target, implementation.kernel, reason))
        if step == "graph":
            return Choice(None, "", None, tuple(skipped))
        raise OpUnavailableError(
            f"no implementation of op {op!r} can run on {context.target.name} with backend "
            f"{requested!r} ({'; '.join(s.line() for s in skipped)}); register a torch "
            "implementation for it")


def resolve_backend(backend: str, target) -> str:
    """Map "auto" to the target's backend: amd on ROCm, hopper on sm_90, triton on other
    NVIDIA GPUs, torch on CPU."""
    if backend != "auto":
        return backend
    if target.vendor == "amd":
        return "amd"
    if target.vendor == "nvidia":
        return "hopper" if target.name == "sm90" else "triton"
    return "torch"


def _imported(path: str) -> object:
    """The object "module:name" names (kernel packages are imported only when chosen)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _imported_on_first_call(implementation: Implementation, step: str) -> Callable:
    resolved: list[Callable] = []

    def call(*args, **kwargs):
        if not resolved:
            resolved.append(implementation.resolve(step, import_now=True))
        return resolved[0](*args, **kwargs)
    return call


def _check_name(op: str) -> None:
    if not op.isidentifier() or op.startswith("_"):
        raise ValueError(f"op name must be a public Python identifier (it is read as "
                         f"table.{op}), got {op!r}")


_REGISTRY = OpRegistry()
define_op = _REGISTRY.define_op
register = _REGISTRY.register
registered_ops = _REGISTRY.registered_ops


def select_kernels(backend: str, context: KernelContext) -> Kernels:
    """The engine's eager and graph tables (import ``atomk31.ops`` first: it registers all)."""
    return _REGISTRY.select_kernels(backend, context)
