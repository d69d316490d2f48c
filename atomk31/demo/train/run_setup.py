"""What both trainers' command lines do before a run: logging, CPU threads, the step check."""

from __future__ import annotations

import logging

import torch


def start_run(threads: int | None, steps: int | None) -> None:
    """Log at INFO with times, use `threads` CPU threads (None: torch's default) and refuse a
    step count below 1 (SystemExit with the reason)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if threads:
        torch.set_num_threads(threads)
    if steps is not None and steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {steps}")
