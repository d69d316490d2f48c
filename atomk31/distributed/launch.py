"""Starting the ranks of one node, and watching them.

`atomk31 serve --tensor-parallel-size N` and `LLM(..., tensor_parallel_size=N)` run rank 0
in the calling process and start ranks 1..N-1 here, one process each (torch.multiprocessing's
spawn: a fresh interpreter, so no CUDA state is inherited). The rendezvous is a TCP store that
rank 0 opens on loopback on a port the OS picks (no fixed port to collide with), whose number
the workers receive as an argument. Across nodes, torchrun starts every rank instead and
torch.distributed's ``env://`` rendezvous replaces the store (``parallel_context.join_ranks``).

`WorkerRanks.failure()` is the watchdog's answer: which started rank exited, with its exit
code. The engine asks it between steps and when a collective fails, so a rank that dies is
reported by name instead of as a hang (each collective also has a timeout).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT_S = 30.0


def open_store(world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's TCP store on loopback, on a free port (``store.port``)."""
    return dist.TCPStore(LOOPBACK, 0, world_size, is_master=True,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def join_store(port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A worker's connection to rank 0's store."""
    return dist.TCPStore(LOOPBACK, port, world_size, is_master=False,
                         timeout=timedelta(seconds=timeout_s))


def rank_device(device: str | None, local_rank: int) -> torch.device:
    """The device of the rank with this node-local index: GPU ``local_rank`` (when ``device``
    is None or a bare "cuda") or the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return torch.device("cuda", local_rank)
    if device.startswith("cuda:"):
        raise ValueError(f"device {device!r} names one GPU, but several ranks need one each; "
                         "pass --device cuda (rank i runs on GPU i) or set "
                         "CUDA_VISIBLE_DEVICES")
    return torch.device(device)


class WorkerRanks:
    """Ranks 1..world_size-1, started by `start`; ``target(rank, *args)`` runs each."""

    def __init__(self, processes: list[mp.Process]):
        self.processes = processes
        self._failure: str | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._watch = threading.Thread(target=self._watch_loop, name="atomk31-rank-watchdog",
                                       daemon=True)
        self._watch.start()

    @classmethod
    def start(cls, target: Callable, world_size: int, args: tuple) -> "WorkerRanks":
        context = mp.get_context("spawn")
        processes = []
        for rank in range(1, world_size):
            process = context.Process(target=target, args=(rank, *args),
                                      name=f"atomk31-rank-{rank}", daemon=True)
            process.start()
            processes.append(process)
        logger.info("started ranks 1..%d (pids %s)", world_size - 1,
                    [p.pid for p in processes])
        return cls(processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def failure(self) -> str | None:
        """Which rank exited (with its exit code), or None while all run."""
        with self._lock:
            if self._failure is None:
                for rank, process in enumerate(self.processes, start=1):
                    if process.exitcode is not None and not self._stopping:
                        self._failure = (f"rank {rank} (pid {process.pid}) exited with code "
                                         f"{process.exitcode}")
                        break
            return self._failure

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait for the ranks to exit (they were told to stop), then terminate stragglers."""
        self._stopping = True
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                logger.warning("rank process %d did not stop; terminating it", process.pid)
                process.terminate()
                process.join(5)

    def _watch_loop(self) -> None:
        """Log the first rank that exits unasked, as soon as it does."""
        sentinels = [p.sentinel for p in self.processes]
        multiprocessing.connection.wait(sentinels)      # returns when the first one exits
        message = self.failure()
        if message is not None:
            logger.error("%s", message)
