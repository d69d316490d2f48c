"""Ranks as threads of one process, for testing collective algorithms without processes.

`run_ranks(world, fn)` runs ``fn(comm)`` on ``world`` threads, each with a `ThreadCommunicator`
whose collectives (the `atomk31.distributed.communicator` interface) meet at a barrier, and
returns their results in rank order.
"""

import threading

import torch

BARRIER_TIMEOUT_S = 60.0


class _Group:
    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=BARRIER_TIMEOUT_S)
        self.slots: list = [None] * world
        self.subgroups: dict[tuple[int, ...], _Group] = {}
        self.lock = threading.Lock()


class ThreadCommunicator:
    def __init__(self, group: _Group, rank: int):
        self._group, self.rank, self.world_size = group, rank, group.world

    def split(self, ranks: list[int]) -> "ThreadCommunicator":
        """The communicator of a subgroup (every member calls this with the same ranks)."""
        with self._group.lock:
            group = self._group.subgroups.setdefault(tuple(ranks), _Group(len(ranks)))
        return ThreadCommunicator(group, ranks.index(self.rank))

    def _exchange(self, value):
        group = self._group
        group.slots[self.rank] = value
        group.barrier.wait()
        everyone = list(group.slots)
        group.barrier.wait()
        return everyone

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([t.clone() for t in self._exchange(x)])

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([t[self.rank].clone() for t in self._exchange(x)])

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        stacked = torch.stack(self._exchange(x))
        return {"sum": stacked.sum(0), "min": stacked.amin(0), "max": stacked.amax(0)}[op]

    def gather_to_first(self, x: torch.Tensor):
        everyone = self._exchange(x)
        return torch.stack(everyone) if self.rank == 0 else None

    def broadcast_object(self, obj):
        return self._exchange(obj)[0]


class CountingCommunicator:
    """Wraps a communicator; records (collective, payload bytes) of every call."""

    def __init__(self, inner):
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.calls: list[tuple[str, int]] = []

    def _count(self, kind: str, x: torch.Tensor) -> None:
        self.calls.append((kind, x.numel() * x.element_size()))

    def all_reduce(self, x, op="sum"):
        self._count("all_reduce", x)
        return self.inner.all_reduce(x, op)

    def all_gather(self, x):
        self._count("all_gather", x)
        return self.inner.all_gather(x)

    def all_to_all(self, x):
        self._count("all_to_all", x)
        return self.inner.all_to_all(x)

    def gather_to_first(self, x):
        self._count("gather_to_first", x)
        return self.inner.gather_to_first(x)

    def broadcast_object(self, obj):
        return self.inner.broadcast_object(obj)


def run_ranks(world: int, fn) -> list:
    group = _Group(world)
    results: list = [None] * world
    errors: list = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(ThreadCommunicator(group, rank))
        except BaseException as error:      # reported by the caller
            errors.append(error)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
