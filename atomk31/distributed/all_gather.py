"""The DCP all-gather: every rank's tensor, stacked in rank order, on every rank.

Decode context parallelism (MODEL_SPEC §7.2) spreads a request's tokens round-robin over the
W ranks of a DCP group; each rank scores and attends over its own tokens, then the ranks
exchange small per-row results (top-k candidates, partial outputs with their LSE). That
exchange is this one operation:

    all_gather(x [*shape]) -> [W, *shape], row r = rank r's x

Implementations (one interface, chosen once at startup by `make_dcp_all_gather`):
* `TorchAllGather`: torch.distributed on the group's backend (nccl/rccl/gloo).
* `MoriAllGather` (atomk31/distributed/mori_all_gather.py): ROCm peer memory through mori's
  symmetric heap (HIP IPC inside a node), no collective library call.
* `SingleRankAllGather`: W = 1, no communication.
"""

import importlib.util
import logging
from typing import Protocol

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

DCP_ALL_GATHER_BACKENDS = ("auto", "torch", "mori")


class DcpAllGather(Protocol):
    """What the distributed code calls: rank, world size, and the all-gather itself."""

    rank: int
    world_size: int

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [*shape] (same shape and dtype on every rank) -> [world_size, *shape]."""
        ...


class SingleRankAllGather:
    """A DCP group of one rank: the all-gather is a reshape."""

    rank = 0
    world_size = 1

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0)


class TorchAllGather:
    """The all-gather through torch.distributed on ``group`` (None = the default group)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise ValueError("TorchAllGather needs torch.distributed initialised; call "
                             "dist.init_process_group first (or use SingleRankAllGather)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # NCCL/RCCL gather straight into one tensor; gloo only gathers into a list.
        self._into_tensor = dist.get_backend(group) == "nccl"

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if self._into_tensor:
            out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x, group=self.group)
            return out
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.stack(parts)


def why_no_mori(device: torch.device) -> str | None:
    """None when the mori adapter can run on ``device``, else why not."""
    if torch.device(device).type != "cuda" or torch.version.hip is None:
        return "needs ROCm GPUs"
    if importlib.util.find_spec("mori") is None:
        return "needs the mori package (amd-mori, shipped in the ROCm container)"
    return None


def dcp_all_gather_backend(enforce_eager: bool) -> str:
    """The engine's choice: mori's adapter waits at a host barrier, which a CUDA / HIP graph
    cannot hold, so with decode graphs (the default) the exchange goes through
    torch.distributed (RCCL, captured inside the graphs); mori serves eager runs where it can
    run ("auto")."""
    return "auto" if enforce_eager else "torch"


def make_dcp_all_gather(
    backend: str,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    max_bytes: int = 64 << 20,
) -> DcpAllGather:
    """The DCP all-gather for ``backend`` ("auto" = mori where it can run, else torch).

    ``max_bytes`` bounds one rank's tensor in the mori adapter (its symmetric buffer holds
    world_size of them). Without torch.distributed initialised, the group has one rank.
    """
    if backend not in DCP_ALL_GATHER_BACKENDS:
        raise ValueError(f"unknown DCP all-gather backend {backend!r}; choose one of "
                         f"{DCP_ALL_GATHER_BACKENDS}")
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return SingleRankAllGather()
    reason = why_no_mori(device)
    if backend == "mori" and reason is not None:
        raise ValueError(f"the mori DCP all-gather cannot run here: {reason}; "
                         "use backend 'torch' or 'auto'")
    if backend == "torch" or reason is not None:
        if backend == "auto":
            logger.info("DCP all-gather: torch.distributed (mori: %s)", reason)
        return TorchAllGather(group)
    from atomk31.distributed.mori_all_gather import MoriAllGather

    logger.info("DCP all-gather: mori peer memory")
    return MoriAllGather(group, device, max_bytes)
