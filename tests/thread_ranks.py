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


class ThreadCommunicator:
    def __init__(self, group: _Group, rank: int):
        self._group, self.rank, self.world_size = group, rank, group.world

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
