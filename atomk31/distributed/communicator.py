"""The collectives the model and the engine call, for one group of ranks.

    comm.all_reduce(x, op)    sum (or "min", "max") over the group, every rank gets it
    comm.all_gather(x)        [W, *x.shape]: row r = rank r's x
    comm.all_to_all(x)        x [W, ...]: row w goes to rank w; row r of the result came from r
    comm.gather_to_first(x)   [W, *x.shape] on the group's first rank, None elsewhere
    comm.broadcast_object(o)  the first rank's picklable object, on every rank

`LocalCommunicator` is a group of one rank (every collective a no-op or a reshape): the
single-device engine runs the same layer code through it. `TorchCommunicator` runs them
through torch.distributed on a process group (NCCL on CUDA, RCCL on ROCm, gloo on CPU), each
with the group's timeout (``init_process_group(timeout=...)``): a rank that died makes the
others' next collective fail instead of waiting for ever. Its all-gather may be handed a
`DcpAllGather` (mori's HIP-IPC path on ROCm, ``all_gather.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from atomk31.distributed.all_gather import DcpAllGather


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


class LocalCommunicator:
    """A group of one rank."""

    rank = 0
    world_size = 1

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0)

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_to_first(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0)

    def broadcast_object(self, obj: Any) -> Any:
        return obj


class TorchCommunicator:
    """The collectives over ``group`` (None: the default group), whose global ranks are
    ``ranks`` in group order; this process must be one of them."""

    def __init__(self, ranks: list[int], group: dist.ProcessGroup | None,
                 all_gather: DcpAllGather | None = None):
        self.ranks = list(ranks)
        self.world_size = len(ranks)
        self.rank = ranks.index(dist.get_rank())
        self.group = group
        self._gather = all_gather

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, op=_REDUCE_OPS[op], group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if self._gather is not None:
            return self._gather.all_gather(x)
        x = x.contiguous()
        out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=self.group)
        return out

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != self.world_size:
            raise ValueError(f"all_to_all: expected [W={self.world_size}, ...], got "
                             f"{list(x.shape)}")
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.group)
        return out

    def gather_to_first(self, x: torch.Tensor) -> torch.Tensor | None:
        x = x.contiguous()
        first = self.ranks[0]
        parts = ([torch.empty_like(x) for _ in range(self.world_size)]
                 if self.rank == 0 else None)
        dist.gather(x, parts, dst=first, group=self.group)
        return torch.stack(parts) if parts is not None else None

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[0], group=self.group)
        return box[0]
