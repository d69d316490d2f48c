"""Several devices (DESIGN.md §3b): the parallel layout and its checks, process groups and
collectives on torch.distributed (mori on AMD for the DCP all-gather), rank launch, the DCP
top-k exchange and log-sum-exp merge, and the byte budgets of a distributed plan.

Importing the package imports no torch (``atomk31 serve``'s flags, ``flags.py``, are built
without it); the DCP all-gather's names below load it when first used.
"""

_ALL_GATHER_NAMES = ("DCP_ALL_GATHER_BACKENDS", "DcpAllGather", "SingleRankAllGather",
                     "TorchAllGather", "make_dcp_all_gather")

__all__ = list(_ALL_GATHER_NAMES)


def __getattr__(name: str):
    if name in _ALL_GATHER_NAMES:
        from atomk31.distributed import all_gather

        return getattr(all_gather, name)
    raise AttributeError(f"module 'atomk31.distributed' has no attribute {name!r}")
