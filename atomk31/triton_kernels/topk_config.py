"""How `topk_triton` splits and tunes its stages (`TopkConfig`), and the defaults per target.

The defaults are the fastest exact configuration measured on the H200 at 64 rows of 128K to
1M scores (benchmarks/kernels/bench_topk.py; the rounds and their figures:
benchmarks/NOTES.md). A field left None is chosen per target and batch in `resolve`.
"""

from dataclasses import dataclass, replace

import torch
import triton

from atomk31.triton_kernels.runtime import num_sms

# fuse_threshold's default: one program per row streams the scores, measured at 64 rows.
FUSED_THRESHOLD_MIN_ROWS = 64


@dataclass(frozen=True)
class TopkConfig:
    """The stages' tuning (topk.py's module docstring names the stages).

    programs_per_row: stage 1's programs per row (None: 2 programs per multiprocessor over
      all rows). capacity_factor: the candidate buffer holds that many times the padded k (1,
      2 or 4). group_max_warps: stage 1's warps (None: 4 on NVIDIA, else 8: gfx942 spills
      scalar registers at 4). finish_warps: the overflow rescan's and the finish's.
      threshold_warps: stage 1b's (its block reductions are cheaper with fewer warps).
    search_ways / threshold_ways: bins per round of the finish's / stage 1b's many-way search
      (powers of two). threshold_slack: stage 1b may stop at a T0 that up to that many more
      group maxima reach (-1: the exact need-th largest). group_max_stages: stage 1's loads
      pipelined that many tiles deep (None: 6 with fuse_threshold, else 3). threshold_parts:
      stage 1b merges that many chunks' maxima per load (a power of two).
    collect_programs_per_sm, collect_block, collect_program_warps, collect_stages,
      staging_pieces: the collect's programs per multiprocessor over all rows, positions a
      tile (a power of two), warps a program, tiles in flight, and staging slice in tiles.
      staged_ballot: rank a tile's candidates with warp ballots (NVIDIA, one-warp programs
      only; else tl.cumsum).
    fuse_overflow: the finish rescans an overflowing row itself (one launch fewer; NVIDIA and
      the interpreter only: SGPR spills on AMD). fuse_threshold: stage 1 as one program per
      row that also finds T0 (no stage-1b launch; programs_per_row and group_max_warps are
      then ignored; None: on NVIDIA with at least FUSED_THRESHOLD_MIN_ROWS rows).
    """

    programs_per_row: int | None = None
    capacity_factor: int = 2
    group_max_warps: int | None = None
    finish_warps: int = 16
    threshold_warps: int = 16
    search_ways: int = 128
    threshold_ways: int = 64
    threshold_slack: int = 64
    group_max_stages: int | None = None
    threshold_parts: int = 4
    collect_programs_per_sm: int = 16
    collect_block: int = 256
    collect_program_warps: int = 1
    collect_stages: int = 8
    staging_pieces: int = 4
    staged_ballot: bool = True
    fuse_overflow: bool = True
    fuse_threshold: bool | None = None


def check(config: TopkConfig) -> None:
    """Raise ValueError naming the first field out of its range."""
    if config.capacity_factor not in (1, 2, 4):
        raise ValueError(f"capacity_factor must be 1, 2 or 4, got {config.capacity_factor}")
    for name in ("search_ways", "threshold_ways", "threshold_parts", "collect_block"):
        value = getattr(config, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {value}")
    for name in ("collect_programs_per_sm", "staging_pieces", "collect_stages"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.group_max_stages is not None and config.group_max_stages < 1:
        raise ValueError(f"group_max_stages must be >= 1, got {config.group_max_stages}")
    if config.threshold_slack < -1:
        raise ValueError(f"threshold_slack must be >= -1 (-1: exact), got "
                         f"{config.threshold_slack}")


def resolve(config: TopkConfig, num_rows: int, is_cuda: bool, is_interpreter: bool,
            device: torch.device) -> TopkConfig:
    """`config` with every None chosen for this target and batch."""
    check(config)
    fuse_threshold = config.fuse_threshold
    if fuse_threshold is None:
        fuse_threshold = is_cuda and num_rows >= FUSED_THRESHOLD_MIN_ROWS
    programs_per_row, group_max_warps = config.programs_per_row, config.group_max_warps
    if fuse_threshold:
        programs_per_row, group_max_warps = 1, config.threshold_warps
    if group_max_warps is None:
        group_max_warps = 4 if is_cuda else 8
    if programs_per_row is None:
        # Half of 4 programs per multiprocessor over all rows, rounded down per row.
        num_programs_wanted = 1 if is_interpreter else 4 * num_sms(device)
        programs_per_row = max(1, triton.cdiv(num_programs_wanted, num_rows) // 2)
    group_max_stages = config.group_max_stages
    if group_max_stages is None:
        group_max_stages = 6 if fuse_threshold else 3
    return replace(config, fuse_threshold=fuse_threshold, programs_per_row=programs_per_row,
                   group_max_warps=group_max_warps, group_max_stages=group_max_stages,
                   fuse_overflow=config.fuse_overflow and (is_cuda or is_interpreter))
