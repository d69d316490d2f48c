"""What a launcher needs to know about where its kernel runs, and whether its launches will be
replayed from a CUDA graph."""

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction


def runs_on_interpreter(kernel: object) -> bool:
    """True under TRITON_INTERPRET=1, where `@triton.jit` gives an InterpretedFunction.

    Launchers pick interpreter-safe variants there (fp32 dots, explicit FP8 rounding). Deciding
    by the kernel object rather than by the tensors' device keeps a compile-only driver fed with
    CPU tensors (tests/amd_compile) on the configuration a GPU launch would use.
    """
    return not isinstance(kernel, JITFunction)


def dot_precision(kernel: object, dtype: torch.dtype) -> str:
    """`input_precision` for fp32 `tl.dot`s: "ieee" under the interpreter and for float32
    inputs (float32 compute must not silently become TF32); else "tf32" where the hardware has
    it: NVIDIA, and gfx942 (as xf32). gfx950 has no TF32 matrix instruction: "ieee" there."""
    if runs_on_interpreter(kernel) or dtype == torch.float32:
        return "ieee"
    target = driver.active.get_current_target()
    return "tf32" if target.backend == "cuda" or target.arch == "gfx942" else "ieee"


# Set while the engine warms up and captures a CUDA graph (atomk31/engine/cuda_graphs.py) and
# while a benchmark times graph replays: the launches then cost no host time at replay, so a
# launcher may choose a kernel whose launch is slow on the host (the Gluon kernels' JIT
# dispatch) for its GPU time alone. A context variable, so threads do not see each other's.
_replayed_launches: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "atomk31_replayed_launches", default=False)


def launches_are_replayed() -> bool:
    """True inside ``replayed_launches()``: the launches being made will be replayed from a
    CUDA graph (warm-up and capture both say so, so that they compile the same kernels)."""
    return _replayed_launches.get()


@contextlib.contextmanager
def replayed_launches() -> Iterator[None]:
    """Mark the launches made inside as graph-replayed (see ``launches_are_replayed``)."""
    token = _replayed_launches.set(True)
    try:
        yield
    finally:
        _replayed_launches.reset(token)
