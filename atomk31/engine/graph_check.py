"""A captured decode graph proves itself before it serves: one replay against the eager step.

The first capture of each graph shape is replayed once on one real request of the step that
asked for it (the other rows padding) and compared with the eager step over the same inputs,
with the eager table's kernels. Replay and eager step both advance that request's KDA state,
so its slot is saved into a spare scratch slot first and put back after each (its cache rows
are written twice with the same token: the same place, harmless). A replay whose logits
differ by more than REPLAY_TOLERANCE (relative L2) refuses its shape: those steps run eagerly.
This matters most on ROCm, where HIP graphs have not run here.

To name the op, the step is then run eagerly once more with every op of the graph table
shadowed by the eager table's (ops/shadow.py): the op whose outputs differ most is named. If
none differs beyond the tolerance, the graph table's kernels agree when run eagerly, and the
capture itself is at fault (a kernel that is not capture-safe).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atomk31.model import ForwardBatch
from atomk31.ops import OpTable
from atomk31.ops.shadow import ShadowOpTable

# Relative L2 difference of a replay's logits from the eager step's above which a shape is
# refused. 16-bit activations: graph and eager tables may run other kernels (other summation
# orders), which moves bf16 logits by ~1e-3 to 1e-2 relative; a replay reading stale or wrong
# memory differs by ~1. Float32 compute: summation order alone.
REPLAY_TOLERANCE = {torch.float32: 1e-3}
DEFAULT_REPLAY_TOLERANCE = 5e-2

Forward = Callable[[ForwardBatch, OpTable], torch.Tensor]


def replay_tolerance(dtype: torch.dtype) -> float:
    return REPLAY_TOLERANCE.get(dtype, DEFAULT_REPLAY_TOLERANCE)


def replay_error(replay: Callable[[], torch.Tensor], batch: ForwardBatch, forward: Forward,
                 eager_ops: OpTable, state_slot: int, backup_slot: int,
                 copy_state: Callable[[int, int], None]) -> float:
    """Relative L2 difference between row 0's logits from ``replay()`` and from the eager
    step over ``batch`` (the graph's own inputs, already filled); the request's KDA state
    (``state_slot``) is left as it was."""
    copy_state(state_slot, backup_slot)
    replayed = replay()[0].float().clone()
    copy_state(backup_slot, state_slot)
    eager = forward(batch, eager_ops)[0].float()
    copy_state(backup_slot, state_slot)
    return float((replayed - eager).norm() / eager.norm().clamp_min(1e-30))


def suspect_op(batch: ForwardBatch, forward: Forward, graph_ops: OpTable, eager_ops: OpTable,
               state_slot: int, backup_slot: int, copy_state: Callable[[int, int], None],
               tolerance: float) -> str:
    """Which op of the graph table differs from the eager table's on this step, as a phrase
    for the warning; the request's KDA state is left as it was."""
    shadow = ShadowOpTable(graph_ops, eager_ops)
    copy_state(state_slot, backup_slot)
    try:
        forward(batch, shadow)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
        return f"the op could not be named ({error})"
    finally:
        copy_state(backup_slot, state_slot)
    op, stats = shadow.report()[0]
    if stats.max_rel <= tolerance:
        return ("every op agrees when run eagerly: the capture itself is at fault (a kernel "
                "that is not capture-safe)")
    kernel = graph_ops.entries[op].choices
    names = ", ".join(sorted({c.kernel for c in kernel.values()}))
    return f"op {op} ({names}) differs most: {stats.max_rel:.2e} relative at {stats.worst}"
