"""What the model receives about parallelism: the rank's layout and its two communicators.

`ParallelContext.single()` is one device (every collective a no-op). `join_ranks` makes the
real one: it initialises torch.distributed for this process (NCCL on CUDA, which ROCm's torch
runs as RCCL; gloo on CPU) from a TCP store on loopback (the ranks `atomk31` starts itself,
`launch.py`) or from torchrun's environment (``env://``), and builds the TP group (every rank)
and the DCP groups (consecutive ranks, ``layout.py``), each with the collective timeout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from atomk31.distributed.all_gather import make_dcp_all_gather
from atomk31.distributed.communicator import LocalCommunicator, TorchCommunicator
from atomk31.distributed.layout import ParallelLayout

logger = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """Another rank died or stopped answering: the engine cannot go on (the server exits)."""


@dataclass
class ParallelContext:
    """One rank's layout, its TP communicator (all ranks) and DCP communicator (its group)."""

    layout: ParallelLayout = field(default_factory=ParallelLayout)
    tp: LocalCommunicator | TorchCommunicator = field(default_factory=LocalCommunicator)
    dcp: LocalCommunicator | TorchCommunicator = field(default_factory=LocalCommunicator)
    # prefill steps of at least this many tokens attend token-sharded (model/mla_sharding.py)
    token_sharded_prefill_min_tokens: int = 16384

    @classmethod
    def single(cls) -> "ParallelContext":
        return cls()

    @property
    def rank(self) -> int:
        return self.layout.tp_rank

    @property
    def world_size(self) -> int:
        return self.layout.tp_size


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend for ``device``: NCCL (RCCL on ROCm) on GPUs, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def join_ranks(layout: ParallelLayout, device: torch.device, timeout_s: float,
               store: dist.Store | None = None, token_sharded_prefill_min_tokens: int = 16384,
               dcp_all_gather: str = "auto") -> ParallelContext:
    """Initialise torch.distributed for this rank and build its groups.

    ``store``: the TCP store of ranks started by `launch.py`; None reads torchrun's
    environment. Every rank must call this with the same sizes (groups are made in one order).
    """
    timeout = timedelta(seconds=timeout_s)
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # CPU ranks share the machine's cores: oversubscribed OpenMP threads spin against each
        # other (a 2-rank CPU step ran 30x slower with 2 threads a rank than with 1)
        _THREADS_BEFORE.append(torch.get_num_threads())
        torch.set_num_threads(max(1, torch.get_num_threads() // layout.tp_size))
    if store is not None:
        dist.init_process_group(backend, store=store, rank=layout.tp_rank,
                                world_size=layout.tp_size, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    if dist.get_world_size() != layout.tp_size or dist.get_rank() != layout.tp_rank:
        raise ValueError(f"torch.distributed has rank {dist.get_rank()} of "
                         f"{dist.get_world_size()}, but the engine expects rank "
                         f"{layout.tp_rank} of {layout.tp_size}: pass "
                         "--tensor-parallel-size equal to the number of processes")
    tp = TorchCommunicator(list(range(layout.tp_size)), None)
    dcp: LocalCommunicator | TorchCommunicator = LocalCommunicator()
    if layout.dcp_size > 1:
        for g in range(layout.num_head_groups):     # every rank creates every group, in order
            ranks = layout.dcp_group_ranks(g)
            group = dist.new_group(ranks, timeout=timeout)
            if g == layout.head_group:
                gather = make_dcp_all_gather(dcp_all_gather, device, group)
                dcp = TorchCommunicator(ranks, group, all_gather=gather)
    logger.info("rank %d of %d joined (%s; DCP group %s)", layout.tp_rank, layout.tp_size,
                backend, layout.dcp_group_ranks())
    return ParallelContext(layout, tp, dcp, token_sharded_prefill_min_tokens)


def leave_ranks() -> None:
    """Tear this process's torch.distributed state down (safe to call when never joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    if _THREADS_BEFORE:
        torch.set_num_threads(_THREADS_BEFORE.pop())


_THREADS_BEFORE: list[int] = []     # a CPU rank's thread count before join_ranks
