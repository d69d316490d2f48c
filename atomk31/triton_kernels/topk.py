"""Exact top-k of indexer scores in Triton: three to five launches, the scores read twice.

Contract: `atomk31.ops.topk` (`topk_positions`, and `topk_slots` = positions_to_slots of it):
the set of the k best positions of each row (higher score first, equal scores -> lower
position, §4.6, §8 #6; -0.0 equal to +0.0, §9 #6) in ascending position order, rows shorter
than k padded with -1. The op checks its arguments before this launcher runs.

Stages (kernels in topk_collect.py, topk_staged_collect.py and topk_finish.py; tuning:
topk_config.py):
  1. topk_group_max_kernel: per-chunk maxima of NUM_GROUPS strided groups of each row (and
     the zeroing of the finish's bitmap);
  1b. topk_threshold_kernel (one program per row): T0, the need-th largest group maximum
     (or, with `threshold_slack`, a key a little below it found in fewer search rounds);
     with `fuse_threshold` (the default at >= 64 rows on NVIDIA) stage 1 runs one program
     per row and finds T0 itself, and this kernel is not launched;
  2. the collect, topk_staged_collect_kernel, a streaming filter: the scores >= T0 into a
     per-row candidate buffer (about 1.4 k of them for scores in random order);
  3. the finish: topk_overflow_kernel (a row whose candidates overflow the buffer rescans
     its row; other rows return at once; with `fuse_overflow`, the default on NVIDIA, the
     finish does it and this kernel is not launched), then topk_finish_kernel (one program
     per row: the exact cut among the candidates, then the selected positions in ascending
     order through a bitmap and a prefix sum of popcounts, no sort).
No host synchronisation and no memset: stage 1 zeroes the counters the collect uses and the
bitmap the finish uses, and all workspaces share one allocation. The candidate buffer holds
positions and raw score bits. Stage 1b and the finish are one program per row running
many-way searches (`kth_largest_key`), latency-bound on block barriers: each search round is
one masked histogram, a reverse cumsum and one packed reduction, and stage 1b hands the
finish each row's largest key and T0 as the search's bounds.
"""

from dataclasses import dataclass

import torch
import triton
from triton.runtime import driver

from atomk31.triton_kernels.runtime import num_sms, runs_on_interpreter
from atomk31.triton_kernels.topk_collect import (
    chunking,
    histogram_bins,
    num_groups_for,
    topk_group_max_kernel,
    topk_threshold_kernel,
)
from atomk31.triton_kernels.topk_config import TopkConfig, resolve
from atomk31.triton_kernels.topk_finish import topk_finish_kernel, topk_overflow_kernel
from atomk31.triton_kernels.topk_staged_collect import (
    ballot_rank_asm,
    ballot_rank_constraints,
    topk_staged_collect_kernel,
)

MAX_K = 4096  # the candidate buffer of a row (2 k) is held in one program
OVERFLOW_BLOCK = 4096  # positions per tile of the overflow rescan
# ... and of the rescan inside the finish (fuse_overflow): 4096 spilled the finish there
# (24 B of stack at 16 warps, sm_90, triton 3.9), 2048 did not.
RESCAN_BLOCK = 2048
WORKSPACE_ALIGN = 64  # int32 elements: each workspace part starts 256-byte aligned
MIN_K_PAD = 16  # k is padded to a power of two, at least this (NUM_GROUPS = 2 k_pad >= 32)
# Bitmap words (of 32 positions each) per step of the finish's prefix sum; 8192 spills the
# finish (40 B at 16 warps, sm_90, triton 3.9).
SCAN_BLOCK = 4096


@dataclass(frozen=True)
class _Plan:
    """One launch's sizes: the groups and chunks of stage 1, the collect's chunks and tile,
    the candidate capacity and the bitmap's words."""

    k_pad: int
    num_groups: int
    capacity: int
    chunk_size: int
    num_chunks: int
    collect_tile: int
    collect_chunk_size: int
    collect_chunks: int
    num_words: int
    words_per_row: int


def _plan(num_rows: int, num_positions: int, k: int, config: TopkConfig,
          is_interpreter: bool, device: torch.device) -> _Plan:
    k_pad = max(MIN_K_PAD, triton.next_power_of_2(k))
    num_groups = num_groups_for(k_pad)
    chunk_size, num_chunks = chunking(num_positions, num_groups, config.programs_per_row)
    tile = 16 if is_interpreter else config.collect_block
    # Rounded down: a grid just over a whole number of resident waves would add a wave for a
    # few programs.
    collect_programs = config.collect_programs_per_sm * num_sms(device)
    collect_chunk_size, collect_chunks = chunking(num_positions, tile,
                                                  max(1, collect_programs // num_rows))
    # The finish's bitmap (one bit per position) and its words' prefix sums: rows 128-byte
    # aligned, so no two rows share a cache line.
    num_words = triton.cdiv(num_positions, 32)
    return _Plan(k_pad, num_groups, config.capacity_factor * k_pad, chunk_size, num_chunks,
                 tile, collect_chunk_size, collect_chunks, num_words,
                 triton.cdiv(num_words, 32) * 32)


def _workspace(plan: _Plan, num_rows: int, config: TopkConfig,
               device: torch.device) -> tuple[torch.Tensor, ...]:
    """One int32 allocation split into (partial maxima, counters, thresholds (T0, then each
    row's largest key), candidate positions, candidate bits, bitmap, prefix sums, staged
    positions, staged bits)."""
    num_partial_maxima = 0 if config.fuse_threshold else num_rows * plan.num_chunks * \
        plan.num_groups
    stage_size = num_rows * plan.collect_chunks * config.staging_pieces * plan.collect_tile
    sizes = [num_partial_maxima, num_rows, 2 * num_rows, num_rows * plan.capacity,
             num_rows * plan.capacity, num_rows * plan.words_per_row,
             num_rows * plan.words_per_row, stage_size, stage_size]
    sizes = [triton.cdiv(size, WORKSPACE_ALIGN) * WORKSPACE_ALIGN for size in sizes]
    workspace = torch.empty(sum(sizes), dtype=torch.int32, device=device)
    return torch.split(workspace, sizes)


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    block_table: torch.Tensor | None = None,
    row_request: torch.Tensor | None = None,
    block_size: int = 1,
    config: TopkConfig | None = None,
) -> torch.Tensor:
    """Positions [Nq, k] int32 of each row's k best scores (or their cache slots when
    block_table [N, max_blocks] and row_request [Nq] are given: `topk_slots`), in ascending
    position order, -1 padded. scores [Nq, L] fp32 (no NaN), lengths [Nq] in [0, L];
    k <= MAX_K. config: the stages' tuning (None: the defaults, topk_config.py)."""
    num_rows, num_positions = scores.shape
    if k > MAX_K:
        raise ValueError(f"topk_triton handles 0 <= k <= {MAX_K}, got k={k}; use the torch "
                         "implementation for larger k")
    if scores.dtype != torch.float32:
        raise ValueError(f"scores must be float32 (the indexer's), got {scores.dtype}")
    out = torch.empty(num_rows, k, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or k == 0:
        return out
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    is_interpreter = runs_on_interpreter(topk_finish_kernel)  # TRITON_INTERPRET=1
    is_cuda = not is_interpreter and driver.active.get_current_target().backend == "cuda"
    config = resolve(config or TopkConfig(), num_rows, is_cuda, is_interpreter, scores.device)
    plan = _plan(num_rows, num_positions, k, config, is_interpreter, scores.device)
    parts = _workspace(plan, num_rows, config, scores.device)
    _find_threshold(scores, lengths, k, plan, config, parts)
    _collect(scores, lengths, plan, config, parts, is_cuda)
    _finish(scores, lengths, k, plan, config, parts, out, block_table, row_request,
            block_size, is_interpreter)
    return out


def _find_threshold(scores, lengths, k, plan, config, parts) -> None:
    """Stages 1 and 1b: T0 (and each row's largest key) into the thresholds."""
    partial_max, counter, threshold, _, _, bitmap = parts[:6]
    num_rows = scores.shape[0]
    threshold_options = dict(WAYS=max(2, config.threshold_ways), SLACK=config.threshold_slack,
                             BINS=histogram_bins(max(2, config.threshold_ways)))
    topk_group_max_kernel[(num_rows, plan.num_chunks)](
        scores, lengths, partial_max, counter, bitmap, threshold, k, plan.chunk_size,
        plan.num_chunks, scores.stride(0), plan.num_words, plan.words_per_row,
        NUM_GROUPS=plan.num_groups, STAGES=config.group_max_stages,
        THRESHOLD=config.fuse_threshold, **(threshold_options if config.fuse_threshold else {}),
        num_warps=config.group_max_warps)
    if not config.fuse_threshold:
        topk_threshold_kernel[(num_rows,)](
            partial_max, lengths, threshold, k, plan.num_chunks, NUM_GROUPS=plan.num_groups,
            PARTS=config.threshold_parts, **threshold_options,
            num_warps=config.threshold_warps)


def _collect(scores, lengths, plan, config, parts, is_cuda: bool) -> None:
    """Stage 2: the scores >= T0 into each row's candidate buffer."""
    _, counter, threshold, candidate_pos, candidate_bits, _, _, stage_pos, stage_bits = parts
    # One-warp programs on NVIDIA order their staging through __syncwarp (see sync_warp)
    # and may rank candidates with ballots (PTX).
    is_cuda_warp = is_cuda and config.collect_program_warps == 1
    is_ballot = config.staged_ballot and is_cuda_warp
    tile = plan.collect_tile
    topk_staged_collect_kernel[(scores.shape[0], plan.collect_chunks)](
        scores, lengths, counter, threshold, candidate_pos, candidate_bits, stage_pos,
        stage_bits, plan.collect_chunk_size, scores.stride(0), plan.capacity, BLOCK=tile,
        PIECES=config.staging_pieces, STAGES=config.collect_stages, WARP_SYNC=is_cuda_warp,
        RANK_ASM=ballot_rank_asm(tile // 32) if is_ballot else "",
        RANK_CONSTRAINTS=ballot_rank_constraints(tile // 32) if is_ballot else "",
        num_warps=config.collect_program_warps)


def _finish(scores, lengths, k, plan, config, parts, out, block_table, row_request,
            block_size: int, is_interpreter: bool) -> None:
    """Stage 3: the overflow rescan (unless fused) and the exact cut, written in position
    order as positions or slots."""
    _, counter, threshold, candidate_pos, candidate_bits, bitmap, prefix = parts[:7]
    num_rows = scores.shape[0]
    write_slots = block_table is not None
    if write_slots:
        table, requests, max_blocks = block_table, row_request, block_table.shape[1]
    else:
        table, requests, max_blocks = lengths, lengths, 0  # unused placeholders
    if not config.fuse_overflow:
        topk_overflow_kernel[(num_rows,)](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits, k,
            scores.stride(0), CAPACITY=plan.capacity,
            BLOCK=64 if is_interpreter else OVERFLOW_BLOCK, num_warps=config.finish_warps)
    ways = max(2, config.search_ways)
    topk_finish_kernel[(num_rows,)](
        lengths, counter, candidate_pos, candidate_bits, bitmap, prefix, table, requests, out,
        scores, threshold, k, plan.words_per_row, max_blocks, block_size.bit_length() - 1,
        table.stride(0) if write_slots else 0, scores.stride(0), CAPACITY=plan.capacity,
        RESCAN=config.fuse_overflow, BLOCK=64 if is_interpreter else RESCAN_BLOCK,
        K_PAD=plan.k_pad, SCAN_BLOCK=16 if is_interpreter else SCAN_BLOCK,
        WAYS=ways, BINS=histogram_bins(ways), WRITE_SLOTS=write_slots,
        num_warps=config.finish_warps)
