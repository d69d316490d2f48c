"""Runs the ranks of a distributed test as spawned processes, the way torchrun would start them.

`run_rank_processes(target, world, args, out_dir)` picks a free loopback port, starts
``target(rank, world, port, *args, out_dir)`` for every rank, waits, and returns what each rank
saved to ``out_dir / f"rank{rank}.pt"``; a rank that failed writes ``rank{rank}.error`` (its
traceback), which fails the test with every rank's traceback shown.
"""

import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

RANK_TIMEOUT_S = 600


def run_rank_processes(target, world: int, args: tuple, out_dir: Path,
                       timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    processes = [context.Process(target=target, args=(rank, world, port, *args, str(out_dir)))
                 for rank in range(world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout_s)
    errors = [f.read_text() for f in sorted(out_dir.glob("*.error"))]
    for p in processes:
        if p.is_alive():
            p.kill()
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
