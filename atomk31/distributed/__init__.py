"""Collectives of the distributed engine (DESIGN.md §2): the DCP all-gather behind one small
interface, with mori (peer memory over HIP IPC) on AMD and torch.distributed everywhere."""

from atomk31.distributed.all_gather import (
    DCP_ALL_GATHER_BACKENDS,
    DcpAllGather,
    SingleRankAllGather,
    TorchAllGather,
    make_dcp_all_gather,
)

__all__ = ["DCP_ALL_GATHER_BACKENDS", "DcpAllGather", "SingleRankAllGather", "TorchAllGather",
           "make_dcp_all_gather"]
