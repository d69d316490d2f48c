"""Exact top-k of indexer scores in Triton: five launches, the scores read twice.

Contract: `atomk31.ops.topk` (`topk_positions`, and `topk_slots` = positions_to_slots of it):
the k best positions of each row, higher score first, equal scores -> lower position (§4.6,
§8 #6), -0.0 equal to +0.0 (§9 #6), rows shorter than k padded with -1.

Stages (kernels in topk_collect.py and topk_finish.py):
  1. topk_group_max_kernel: per-chunk maxima of NUM_GROUPS strided groups of each row;
  2. topk_threshold_kernel (one program per row): T0, the need-th largest group maximum;
  3. topk_stream_collect_kernel: a streaming filter, the keys >= T0 into a per-row candidate
     buffer (about 1.4 k of them for scores in random order); its own grid of several small
     programs per multiprocessor (`collect="round2"`: round 2's topk_collect_kernel);
  4. topk_overflow_kernel: a row whose candidates overflow the buffer (many equal scores)
     rescans its row for its need best; other rows return at once;
  5. topk_finish_kernel (`finish_split` programs per row): each ranks one slice of the
     output, sorting only its own candidates, and writes positions or cache slots.
No host synchronisation and no memset: stage 1 zeroes the counters stage 3 uses, and all
workspaces share one allocation.
"""

import functools

import torch
import triton

from atomk31.triton_kernels.runtime import runs_on_interpreter
from atomk31.triton_kernels.topk_collect import (
    chunking,
    histogram_bins,
    num_groups_for,
    stream_chunking,
    topk_collect_kernel,
    topk_group_max_kernel,
    topk_stream_collect_kernel,
    topk_threshold_kernel,
)
from atomk31.triton_kernels.topk_finish import topk_finish_kernel, topk_overflow_kernel

MAX_K = 4096  # the candidate buffer of a row (2 k) is held in one program
BLOCK = 4096  # positions per tile of round 2's collect and of the overflow rescan
COLLECTS = ("stream", "round2")
WORKSPACE_ALIGN = 64  # int32 elements: each workspace part starts 256-byte aligned
MIN_SLICE = 16  # output ranks per finish program, at least


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    block_table: torch.Tensor | None = None,
    row_request: torch.Tensor | None = None,
    block_size: int = 1,
    programs_per_row: int | None = None,
    capacity_factor: int = 2,
    collect_warps: int | None = None,
    finish_warps: int = 16,
    finish_split: int = 1,
    search_ways: int = 16,
    threshold_ways: int = 64,
    group_max_prefetch: bool = False,
    threshold_parts: int = 4,
    collect: str = "stream",
    collect_programs_per_sm: int = 4,
    collect_block: int = 2048,
    stages: int = 5,
) -> torch.Tensor:
    """Positions [Nq, k] int32 of each row's k best scores (or their cache slots when
    block_table [N, max_blocks] and row_request [Nq] are given), best first, -1 padded.

    scores [Nq, L] fp32 (no NaN), lengths [Nq] in [0, L]; k <= MAX_K. Tuning:
    `programs_per_row` (stage 1, and stage 3 of the round-2 collect; default: about 4
    programs per multiprocessor over all rows, round 2's ppr_x2, faster than 2 there),
    `capacity_factor` (candidate buffer = that many times the padded k, a power of two),
    `collect_warps` (stage 1 and the round-2 collect; default 4 on NVIDIA, faster on the H200
    in round 1, else 8: gfx942 spills scalar registers at 4), `finish_warps` (stages 2, 4
    and 5: 16 holds the finish under 128 registers on the H200), `finish_split` (programs
    per row of the finish, a power of two; 1 was fastest on the H200 in round 2),
    `search_ways` (bins per round of the finish's threshold searches, a power of two),
    `threshold_ways` (the same for stage 2: 64 takes 4 rounds where 16 takes 6; round 2's
    ways64 was faster in every case), `collect` ("stream": topk_stream_collect_kernel with
    `collect_programs_per_sm` programs per multiprocessor over all rows and `collect_block`
    positions per tile, a power of two; "round2": topk_collect_kernel on stage 1's grid).
    `group_max_prefetch` (stage 1 loads its next tile while reducing the current one),
    `threshold_parts` (stage 2 merges that many chunks' maxima per load, a power of two; 1:
    round 2's one chunk at a time).
    `stages` < 5 launches only the first stages (for timing them; the output is then not
    written).
    """
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be [Nq, L] float32, got {list(scores.shape)} "
                         f"{scores.dtype}")
    num_rows, num_positions = scores.shape
    if k < 0 or k > MAX_K:
        raise ValueError(f"topk_triton handles 0 <= k <= {MAX_K}, got k={k}; use the torch "
                         "implementation for larger k")
    if lengths.shape != (num_rows,):
        raise ValueError(f"lengths must be [Nq={num_rows}], got {list(lengths.shape)}")
    write_slots = block_table is not None
    if write_slots and (row_request is None or row_request.shape != (num_rows,)):
        raise ValueError(f"topk slots need row_request [Nq={num_rows}] with the block table")
    if write_slots and (block_size <= 0 or block_size & (block_size - 1)):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if capacity_factor not in (1, 2, 4):
        raise ValueError(f"capacity_factor must be 1, 2 or 4, got {capacity_factor}")
    if collect not in COLLECTS:
        raise ValueError(f"collect must be one of {COLLECTS}, got {collect!r}")
    if collect_programs_per_sm < 1:
        raise ValueError(f"collect_programs_per_sm must be >= 1, got {collect_programs_per_sm}")
    for name, value in (("finish_split", finish_split), ("search_ways", search_ways),
                        ("threshold_ways", threshold_ways), ("threshold_parts", threshold_parts),
                        ("collect_block", collect_block)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {value}")
    out = torch.empty(num_rows, k, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or k == 0:
        return out
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    is_interpreter = runs_on_interpreter(topk_finish_kernel)  # TRITON_INTERPRET=1
    block = 64 if is_interpreter else BLOCK
    k_pad = max(MIN_SLICE, triton.next_power_of_2(k))
    num_groups = num_groups_for(k_pad)
    capacity = capacity_factor * k_pad
    slice_size = max(MIN_SLICE, k_pad // finish_split)
    num_slices = k_pad // slice_size
    ways = max(2, search_ways)
    if collect_warps is None:
        is_nvidia = scores.device.type == "cuda" and torch.version.hip is None
        collect_warps = 4 if is_nvidia else 8
    if programs_per_row is None:
        num_programs_wanted = 1 if is_interpreter else 4 * _num_sms(scores.device)
        programs_per_row = triton.cdiv(num_programs_wanted, num_rows)
    chunk_size, num_chunks = chunking(num_positions, num_groups, programs_per_row)

    # int32 parts; the last one holds int64 finish scratch (2 int32 per entry).
    sizes = [num_rows * num_chunks * num_groups, num_rows, num_rows, num_rows * capacity,
             num_rows * capacity, 2 * num_rows * k_pad]
    sizes = [triton.cdiv(size, WORKSPACE_ALIGN) * WORKSPACE_ALIGN for size in sizes]
    workspace = torch.empty(sum(sizes), dtype=torch.int32, device=scores.device)
    partial_max, counter, threshold, candidate_pos, candidate_key, selected = torch.split(
        workspace, sizes)
    selected = selected.view(torch.int64)

    grid = (num_rows, num_chunks)
    topk_group_max_kernel[grid](
        scores, lengths, partial_max, counter, chunk_size, num_chunks, scores.stride(0),
        NUM_GROUPS=num_groups, PREFETCH=group_max_prefetch, num_warps=collect_warps)
    if stages < 2:
        return out
    topk_threshold_kernel[(num_rows,)](
        partial_max, lengths, threshold, k, num_chunks,
        NUM_GROUPS=num_groups, WAYS=max(2, threshold_ways),
        BINS=histogram_bins(max(2, threshold_ways)), PARTS=threshold_parts,
        num_warps=finish_warps)
    if stages < 3:
        return out
    if collect == "stream":
        stream_block = 16 if is_interpreter else collect_block
        # Rounded down: a grid just over a whole number of resident waves (4 programs per
        # multiprocessor at 2048-position tiles: 128 registers) would add a wave for a few.
        collect_programs = collect_programs_per_sm * _num_sms(scores.device)
        stream_chunk_size, stream_chunks = stream_chunking(
            num_positions, stream_block, max(1, collect_programs // num_rows))
        topk_stream_collect_kernel[(num_rows, stream_chunks)](
            scores, lengths, counter, threshold, candidate_pos, candidate_key,
            stream_chunk_size, scores.stride(0), capacity, BLOCK=stream_block, num_warps=4)
    else:
        topk_collect_kernel[grid](
            scores, lengths, counter, threshold, candidate_pos, candidate_key,
            chunk_size, scores.stride(0), capacity, BLOCK=block, num_warps=collect_warps)
    if stages < 4:
        return out
    topk_overflow_kernel[(num_rows,)](
        scores, lengths, counter, threshold, candidate_pos, candidate_key, k, scores.stride(0),
        CAPACITY=capacity, BLOCK=block, num_warps=finish_warps)
    if stages < 5:
        return out
    if write_slots:
        table, requests, max_blocks = block_table, row_request, block_table.shape[1]
    else:
        table, requests, max_blocks = lengths, lengths, 0  # unused placeholders
    topk_finish_kernel[(num_rows, num_slices)](
        lengths, counter, candidate_pos, candidate_key, selected, table, requests, out,
        k, max_blocks, block_size.bit_length() - 1, table.stride(0) if write_slots else 0,
        CAPACITY=capacity, SLICE=slice_size, WAYS=ways, BINS=histogram_bins(ways),
        WRITE_SLOTS=write_slots,
        num_warps=finish_warps)
    return out


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return _num_sms_of_cuda_device(device.index if device.index is not None
                                   else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms_of_cuda_device(index: int) -> int:
    """Cached: the launcher runs every decode step, and eager launches are CPU-bound."""
    return torch.cuda.get_device_properties(index).multi_processor_count
