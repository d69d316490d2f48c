"""The ranks other than the first: join, build the same model shard and pools, run each step.

A worker rank holds no scheduler, tokenizer or sampler. It loops on the first rank's
broadcasts (``step_message.py``): a step (repeat the KDA slot changes, build the batch, run the
forward, whose collectives meet the other ranks'), a heartbeat (nothing to do), or the stop.
A collective that fails (a rank died, the timeout passed) ends the worker with an error, which
the first rank's watchdog then reports by rank.

Two ways in: `run_spawned_worker` is the process target of the ranks the first rank starts on
its node (``distributed/launch.py``); `run_torchrun_worker` is what a rank other than 0 runs
under torchrun (``atomk31 serve`` calls it).
"""

from __future__ import annotations

import logging

import torch

from atomk31.config import EngineConfig, ModelConfig, TorchrunRank, torchrun_rank
from atomk31.distributed.all_gather import dcp_all_gather_backend
from atomk31.distributed.launch import join_store, rank_device
from atomk31.distributed.layout import ParallelLayout
from atomk31.distributed.parallel_context import ParallelContext, join_ranks, leave_ranks
from atomk31.engine.rank import build_rank
from atomk31.engine.step_message import Heartbeat, StepMessage, Stop, apply_state_ops

logger = logging.getLogger(__name__)


def layout_of(options: EngineConfig, rank: int) -> ParallelLayout:
    return ParallelLayout(options.tensor_parallel_size, rank,
                          options.decode_context_parallel_size, options.enable_expert_parallel)


def join(options: EngineConfig, rank: int, device: torch.device,
         store=None) -> ParallelContext:
    """Join the engine's ranks as ``rank`` (a store from `launch.py`, or torchrun's env)."""
    return join_ranks(layout_of(options, rank), device, options.distributed_timeout_s, store,
                      options.token_sharded_prefill_min_tokens,
                      dcp_all_gather_backend(options.enforce_eager))


def run_spawned_worker(rank: int, port: int, options: EngineConfig, log_level: int) -> None:
    """Process target of rank ``rank`` on the first rank's node."""
    logging.basicConfig(level=log_level, format=f"%(levelname)s rank{rank} %(name)s: %(message)s")
    world = options.tensor_parallel_size
    store = join_store(port, world, options.distributed_timeout_s)
    device = rank_device(options.device, rank)
    serve_steps(options, join(options, rank, device, store), device)


def run_torchrun_worker(options: EngineConfig, rank: TorchrunRank) -> int:
    """A non-first rank under torchrun; -> exit code."""
    device = rank_device(options.device, rank.local_rank)
    serve_steps(options, join(options, rank.rank, device), device)
    return 0


def run_torchrun_worker_if_not_first(model: str, options: dict) -> bool:
    """Under torchrun on a rank other than 0: run that rank's steps (the engine options must
    be rank 0's) and return True once rank 0 stops; False anywhere else."""
    launched = torchrun_rank()
    if launched is None or launched.rank == 0:
        return False
    run_torchrun_worker(EngineConfig(model=model, **options), launched)
    return True


def serve_steps(options: EngineConfig, parallel: ParallelContext, device: torch.device) -> None:
    """Build this rank and run the first rank's steps until it says stop."""
    try:
        model_config = ModelConfig.from_pretrained(options.model)
        config = options.resolve(model_config, device)
        parts = build_rank(options, model_config, config, device, parallel)
        logger.info("rank %d ready", parallel.rank)
        while True:
            try:
                message = parallel.tp.broadcast_object(None)
            except Exception as error:      # the first rank is gone, or timed out
                logger.error("rank %d lost the first rank (%r); exiting", parallel.rank, error)
                raise SystemExit(1) from error
            if isinstance(message, Stop):
                break
            if isinstance(message, Heartbeat):
                continue
            if not isinstance(message, StepMessage):
                raise RuntimeError(f"rank {parallel.rank} got {type(message).__name__}, "
                                   "not a step: the ranks run different atomk31 versions?")
            apply_state_ops(parts.state_pool, message.state_ops, parts.kv_pool)
            parts.runner.run_requests(message.requests)
    finally:
        leave_ranks()
