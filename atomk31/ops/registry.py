"""Backend registry of the ops layer: one implementation per op, chosen once at startup.

Every op module registers its implementations at its bottom, e.g.
``register("rms_norm", "torch", rms_norm_torch)``. At startup the engine calls
``select_ops(backend, device)`` once and gets an ``OpTable``: attribute access returns the
chosen implementation (``table.rms_norm(x, weight, eps)``) and ``describe()`` lists, per op,
which backend runs it and why a faster one does not (what ``atomk31 info`` prints).

Selection (DESIGN.md §3): ``"auto"`` means ``amd`` on a ROCm GPU, ``triton`` on a CUDA GPU and
``torch`` everywhere else. Per op, the requested backend's implementation is used when it is
registered and its ``why_unavailable(device)`` returns None; otherwise the op falls back along
``amd -> triton -> torch`` and the table records why each skipped backend was skipped.
The torch implementation runs on any device, so it is the last resort of every op.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "triton", "amd")
BACKEND_CHOICES = ("auto",) + BACKENDS

# Fallback order from each requested backend: a faster backend falls back to the portable ones.
_FALLBACK_CHAIN = {
    "amd": ("amd", "triton", "torch"),
    "triton": ("triton", "torch"),
    "torch": ("torch",),
}


class OpUnavailableError(ValueError):
    """No registered implementation of an op can run on the requested device."""


@dataclass(frozen=True)
class _Implementation:
    fn: Callable
    why_unavailable: Callable[[torch.device], str | None] | None

    def reason_unusable(self, device: torch.device) -> str | None:
        return None if self.why_unavailable is None else self.why_unavailable(device)


class OpTable:
    """The one implementation per op chosen by ``select_ops``; read ops as attributes."""

    def __init__(self, chosen: dict[str, tuple[str, Callable, str]]) -> None:
        # op -> (backend, fn, note); stored under a private name so __getattr__ never recurses.
        self._chosen = dict(chosen)

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_"):
            raise AttributeError(op)
        try:
            return self._chosen[op][1]
        except KeyError:
            raise AttributeError(
                f"no op named {op!r} in this table; known ops: {sorted(self._chosen)}"
            ) from None

    def backend_of(self, op: str) -> str:
        """The backend whose implementation of ``op`` this table runs."""
        if op not in self._chosen:
            raise ValueError(f"no op named {op!r} in this table; known ops: {sorted(self._chosen)}")
        return self._chosen[op][0]

    def describe(self) -> list[tuple[str, str, str]]:
        """(op, backend chosen, note) per op, sorted by op; the note says why a faster backend
        was skipped, e.g. "triton: no kernel yet", and is empty when the request was met."""
        return [(op, backend, note) for op, (backend, _, note) in sorted(self._chosen.items())]


class OpRegistry:
    """All registered implementations, keyed by op then backend.

    The package uses one module-level instance (``register`` / ``select_ops`` below); tests
    build their own so that fake ops do not leak into the engine's table.
    """

    def __init__(self) -> None:
        self._implementations: dict[str, dict[str, _Implementation]] = {}

    def register(
        self,
        op: str,
        backend: str,
        fn: Callable,
        why_unavailable: Callable[[torch.device], str | None] | None = None,
    ) -> Callable:
        """Record ``fn`` as the ``backend`` implementation of ``op``; returns ``fn``.

        ``why_unavailable(device)`` returns None when ``fn`` can run on ``device``, else a short
        reason ("needs a CUDA or ROCm GPU"). Registering a second, different function for the
        same op and backend is an error; the same function again (a module reload) replaces it.
        """
        if backend not in BACKENDS:
            raise ValueError(
                f"unknown backend {backend!r} for op {op!r}; expected one of {BACKENDS}"
            )
        if not op.isidentifier() or op.startswith("_"):
            raise ValueError(
                f"op name must be a public Python identifier (it is read as table.{op}), got {op!r}"
            )
        by_backend = self._implementations.setdefault(op, {})
        existing = by_backend.get(backend)
        if existing is not None and _qualified_name(existing.fn) != _qualified_name(fn):
            raise ValueError(
                f"op {op!r} already has a {backend} implementation "
                f"({_qualified_name(existing.fn)}); got a second one ({_qualified_name(fn)}). "
                "Give the new one its own op name or remove the old registration"
            )
        by_backend[backend] = _Implementation(fn, why_unavailable)
        return fn

    def registered_ops(self) -> list[str]:
        return sorted(self._implementations)

    def select_ops(self, backend: str, device: torch.device | str) -> OpTable:
        """Choose one implementation per registered op for ``backend`` on ``device``."""
        if backend not in BACKEND_CHOICES:
            raise ValueError(
                f"unknown kernel backend {backend!r}; choose one of {BACKEND_CHOICES} "
                "(--kernel-backend)"
            )
        device = torch.device(device)
        requested = resolve_backend(backend, device)
        chosen = {op: self._choose(op, requested, device) for op in self._implementations}
        counts = {b: sum(1 for c in chosen.values() if c[0] == b) for b in BACKENDS}
        logger.info(
            "ops: backend %s (requested %s) on %s: %s",
            requested, backend, device, ", ".join(f"{n} {b}" for b, n in counts.items() if n),
        )
        return OpTable(chosen)

    def _choose(self, op: str, requested: str, device: torch.device) -> tuple[str, Callable, str]:
        by_backend = self._implementations[op]
        skipped = []
        for candidate in _FALLBACK_CHAIN[requested]:
            implementation = by_backend.get(candidate)
            if implementation is None:
                skipped.append(f"{candidate}: no kernel yet")
                continue
            reason = implementation.reason_unusable(device)
            if reason is not None:
                skipped.append(f"{candidate}: {reason}")
                continue
            return candidate, implementation.fn, "; ".join(skipped)
        raise OpUnavailableError(
            f"no implementation of op {op!r} can run on {device} with backend {requested!r} "
            f"({'; '.join(skipped)}); register a torch implementation for it"
        )


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map "auto" to the device's backend (amd on ROCm, triton on CUDA, torch otherwise)."""
    if backend != "auto":
        return backend
    if device.type == "cuda":
        # A ROCm build of torch also calls its GPUs "cuda"; torch.version.hip tells them apart.
        return "amd" if torch.version.hip is not None else "triton"
    return "torch"


def _qualified_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


_REGISTRY = OpRegistry()


def register(
    op: str,
    backend: str,
    fn: Callable,
    why_unavailable: Callable[[torch.device], str | None] | None = None,
) -> Callable:
    """Record ``fn`` as the ``backend`` implementation of ``op`` in the engine's registry."""
    return _REGISTRY.register(op, backend, fn, why_unavailable)


def select_ops(backend: str, device: torch.device | str) -> OpTable:
    """The engine's op table for ``backend`` ("auto", "torch", "triton", "amd") on ``device``."""
    return _REGISTRY.select_ops(backend, device)


def registered_ops() -> list[str]:
    """Names of every op registered so far (import ``atomk31.ops`` to register them all)."""
    return _REGISTRY.registered_ops()
