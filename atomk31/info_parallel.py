"""`atomk31 info --model DIR --tensor-parallel-size N [--decode-context-parallel-size W]`: the
plan of a distributed engine, from config.json alone (no weights are read).

Per rank: the checkpoint bytes it reads (``distributed/memory_plan.py``, the same rule the
loader follows), its KDA state per request, its latent and index-key bytes per token for each
cache format, and how many tokens and full-length contexts fit on GPUs of ``--gpu-memory-gb``
(default: MI355X, 288 GB) at ``--gpu-memory-utilization`` beside the weights (weights and
caches only: no activation workspace is reserved). Under DCP the token counts are the whole
group's (each rank holds 1/W of them); across head groups the tokens are the same ones.
"""

from __future__ import annotations

import argparse

import torch

from atomk31.checkpoint.schema import expected_tensors
from atomk31.config import ConfigError, ModelConfig
from atomk31.distributed.all_gather import why_no_mori
from atomk31.distributed.layout import ParallelLayout, parallel_problems
from atomk31.distributed.memory_plan import (
    cache_bytes_per_token, kda_state_bytes_per_request, rank_capacity, weight_bytes_per_rank,
)

MI355X_GB = 288
LATENT_FORMATS = ("fp8", "bf16")
INDEX_KEY_FORMATS = ("fp8", "mxfp4")


def add_parallel_plan_arguments(parser: argparse.ArgumentParser, add_flag) -> None:
    add_flag(parser, "model", default=None,
             help="a checkpoint directory: print its distributed plan from config.json")
    add_flag(parser, "tensor_parallel_size", type=int, default=1)
    add_flag(parser, "decode_context_parallel_size", type=int, default=1)
    add_flag(parser, "enable_expert_parallel", action="store_true")
    add_flag(parser, "gpu_memory_utilization", type=float, default=0.9)
    add_flag(parser, "gpu_memory_gb", type=float, default=MI355X_GB,
             help=f"memory of one GPU in GB (default {MI355X_GB}: MI355X)")


def print_parallel_plan(args: argparse.Namespace, device: torch.device | None) -> int:
    config = ModelConfig.from_pretrained(args.model)
    tp, dcp = args.tensor_parallel_size, args.decode_context_parallel_size
    if tp < 1 or dcp < 1 or tp % dcp:
        raise SystemExit(f"--decode-context-parallel-size ({dcp}) must divide "
                         f"--tensor-parallel-size ({tp})")
    problems = parallel_problems(config, tp, dcp, args.enable_expert_parallel)
    if problems:
        raise SystemExit(str(ConfigError(problems, source="parallel options")))
    for line in parallel_plan_lines(config, tp, dcp, args.enable_expert_parallel,
                                    int(args.gpu_memory_gb * 1e9), args.gpu_memory_utilization):
        print(line)
    if dcp > 1:
        reason = why_no_mori(device) if device is not None else "no device here"
        print("  DCP exchanges: " + (
            "torch.distributed inside the decode graphs; mori's HIP-IPC all-gather with "
            "--enforce-eager (its host barrier cannot be captured)" if reason is None
            else f"torch.distributed (mori: {reason})"))
    return 0


def parallel_plan_lines(config: ModelConfig, tp: int, dcp: int, expert_parallel: bool,
                        gpu_bytes: int, utilization: float) -> list[str]:
    """The plan as printed (rank 0's shares; every rank's are the same sizes)."""
    layout = ParallelLayout(tp, 0, dcp, expert_parallel)
    specs = expected_tensors(config)
    weights = weight_bytes_per_rank(config, layout, specs)
    whole = weight_bytes_per_rank(config, ParallelLayout(), specs)
    state = kda_state_bytes_per_request(config, tp)
    budget = int(gpu_bytes * utilization)
    lines = [
        f"distributed plan: tensor parallel {tp}, decode context parallel {dcp}, expert "
        f"parallel {'on' if expert_parallel else 'off'} ({tp} GPUs)",
        f"  weights per rank: {weights / 1e9:,.2f} GB (the checkpoint: {whole / 1e9:,.2f} GB)",
        f"  KDA state per request per rank: {state:,} B ({state / 2**20:,.2f} MiB)",
        f"  per rank: {gpu_bytes / 1e9:g} GB x {utilization:g} = {budget / 1e9:,.2f} GB, "
        f"{(budget - weights) / 1e9:,.2f} GB beside the weights",
        f"  {'latent':<7}{'keys':<7}{'latent B':>10}{'keys B':>9}{'B/token':>9}"
        f"{'tokens':>14}  {config.max_position_embeddings:,}-token contexts "
        "(per token: per rank)",
    ]
    for latent in LATENT_FORMATS:
        for keys in INDEX_KEY_FORMATS:
            total = cache_bytes_per_token(config, latent, keys, dcp)
            latent_only = cache_bytes_per_token(config, latent, None, dcp)
            capacity = rank_capacity(config, layout, gpu_bytes, utilization, latent, keys,
                                     weights)
            lines.append(f"  {latent:<7}{keys:<7}{latent_only:>10,.0f}"
                         f"{total - latent_only:>9,.0f}{total:>9,.0f}"
                         f"{capacity.num_tokens:>14,}  {capacity.num_full_contexts}")
    return lines
