"""What the first rank broadcasts to the others: each step, a heartbeat while idle, the stop.

A step's message is its `StepRequest`s plus the changes the scheduler made to KDA state slots
since the last step, in order: a slot zeroed when it was handed to a new request, a slot
copied (a prefix-cache snapshot restored into a request's slot), and a KV block copied (the
partial last block of a prompt given to each fork of an n > 1 request). Those happen on the
first rank's pools as the scheduler decides; `MirroredStatePool` records them so that every
rank repeats them on its own slice of the states and its own pool before running the step
(`apply_state_ops`). Everything else a rank's pools hold is written by the forward itself,
identically on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atomk31.cache import KDAStatePool
from atomk31.engine.step_batch import StepRequest

# ("zero", slot) | ("copy", src, dst) | ("copy_block", src, dst)
StateOp = tuple


@dataclass
class StepMessage:
    requests: list[StepRequest]
    state_ops: list[StateOp] = field(default_factory=list)


@dataclass(frozen=True)
class Heartbeat:
    """Sent while the engine is idle, so that no rank's wait outlasts the collective timeout."""


@dataclass(frozen=True)
class Stop:
    """The engine shuts down: ranks leave their loop."""


class MirroredStatePool(KDAStatePool):
    """The first rank's KDA state pool: records the slot changes made outside a forward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: list[StateOp] = []

    def allocate(self) -> int:
        slot = super().allocate()
        self.pending.append(("zero", slot))
        return slot

    def copy(self, src: int, dst: int) -> None:
        super().copy(src, dst)
        if src != dst:
            self.pending.append(("copy", src, dst))

    def drain(self) -> list[StateOp]:
        ops, self.pending = self.pending, []
        return ops


def apply_state_ops(pool: KDAStatePool, ops: list[StateOp], kv_pool: torch.Tensor) -> None:
    """Repeat the first rank's slot and block changes on this rank's pools, in order."""
    for op in ops:
        if op[0] == "copy_block":
            kv_pool[op[2]].copy_(kv_pool[op[1]])
            continue
        if op[0] == "zero":
            pool.conv[:, op[1]].zero_()
            pool.recurrent[:, op[1]].zero_()
        elif op[0] == "copy":
            pool.copy_states(op[1], op[2])
        else:
            raise ValueError(f"unknown KDA state operation {op!r}")
