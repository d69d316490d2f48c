"""Exact top-k of indexer scores in Triton: four or five launches, the scores read twice.

Contract: `atomk31.ops.topk` (`topk_positions`, and `topk_slots` = positions_to_slots of it):
the k best positions of each row, higher score first, equal scores -> lower position (§4.6,
§8 #6), -0.0 equal to +0.0 (§9 #6), rows shorter than k padded with -1.

Stages (kernels in topk_collect.py, topk_warp_collect.py and topk_finish.py):
  1. topk_group_max_kernel: per-chunk maxima of NUM_GROUPS strided groups of each row;
  2. topk_threshold_kernel (one program per row): T0, the need-th largest group maximum
     (or, with `threshold_slack`, a key a little below it found in fewer search rounds);
  3. the collect, a streaming filter: the scores >= T0 into a per-row candidate buffer
     (about 1.4 k of them for scores in random order): `collect="warp"`,
     topk_warp_collect_kernel (one-warp programs, many per multiprocessor); "lane",
     topk_lane_collect_kernel (the same in a third of the instructions); "stream",
     topk_stream_collect_kernel (round 2's final default); "round2", topk_collect_kernel;
  4. the finish: topk_overflow_kernel (a row whose candidates overflow the buffer rescans
     its row; other rows return at once), then topk_finish_kernel (`finish_split` programs
     per row, each ranking one slice of the output after a search for its boundary ranks).
     One tl.sort of all of a row's candidates instead was measured slower on the H200 in
     every case (e.g. 101 vs 92 us at 64 x 128K) and is gone.
No host synchronisation and no memset: stage 1 zeroes the counters stage 3 uses, and all
workspaces share one allocation. The candidate buffer holds positions and raw score bits.
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
from atomk31.triton_kernels.topk_warp_collect import (
    topk_lane_collect_kernel,
    topk_warp_collect_kernel,
)

MAX_K = 4096  # the candidate buffer of a row (2 k) is held in one program
BLOCK = 4096  # positions per tile of round 2's collect and of the overflow rescan
COLLECTS = ("warp", "lane", "stream", "round2")
# Per collect: (programs per multiprocessor, positions per tile, warps) unless given.
# The lane collect's tile is 8 scores per thread: 256 num_warps (collect_block is ignored).
COLLECT_DEFAULTS = {"warp": (16, 256, 1), "lane": (16, 256, 1), "stream": (4, 2048, 4),
                    "round2": (0, BLOCK, 0)}
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
    threshold_slack: int = 64,
    group_max_prefetch: bool = False,
    group_max_stages: int = 3,
    threshold_parts: int = 4,
    collect: str = "warp",
    collect_programs_per_sm: int | None = None,
    collect_block: int | None = None,
    stream_warps: int | None = None,
    stream_stages: int = 8,
    stages: int = 5,
) -> torch.Tensor:
    """Positions [Nq, k] int32 of each row's k best scores (or their cache slots when
    block_table [N, max_blocks] and row_request [Nq] are given), best first, -1 padded.

    scores [Nq, L] fp32 (no NaN), lengths [Nq] in [0, L]; k <= MAX_K. Defaults: round 3's
    measured winners on the H200 (64 rows, graph us: 128K / 1M; round 2's launch 114 / 462):
    the warp collect with the select finish (102 / 283), the threshold search with slack 64
    and stage 1 at half the programs and 3 stages (each measured alone on round 3's pipeline).
    Tuning:
    `programs_per_row` (stage 1, and stage 3 of the round-2 collect; default: 2 programs per
    multiprocessor over all rows), `capacity_factor` (candidate buffer = that many times the
    padded k, a power of two), `collect_warps` (stage 1 and the round-2 collect; default 4 on
    NVIDIA, faster on the H200 in round 1, else 8: gfx942 spills scalar registers at 4),
    `finish_warps` (stages 2 and 4: 16 holds the select finish under 128 registers on the
    H200; 32 only on NVIDIA), `finish_split` (programs per row of the select finish, a power
    of two; 1 was fastest on the H200 in round 2), `search_ways` (bins per round of the select
    finish's searches, a power of two), `threshold_ways` (the same for stage 2: 64 takes 4
    rounds where 16 takes 6), `threshold_slack` (stage 2 may stop at a T0 that up to that
    many more group maxima reach; -1: the exact need-th largest), `collect` ("warp", "lane",
    "stream" or "round2", see the module docstring) with `collect_programs_per_sm` programs
    per multiprocessor over all rows, `collect_block` positions per tile, a power of two, and
    `stream_warps` warps per program (defaults per collect: COLLECT_DEFAULTS; round 2's
    collect runs on stage 1's grid), `stream_stages` (the warp and lane collects' loads in
    flight, in tiles, through Triton's pipeliner; 1 for the warp collect: the next tile's
    load issued by hand), `group_max_prefetch` (stage 1 loads its
    next tile while reducing the current one, by hand), `group_max_stages` (else stage 1's
    loads pipelined that many tiles deep; 1: not), `threshold_parts` (stage 2 merges that many
    chunks' maxima per load, a power of two; 1: round 2's one chunk at a time).
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
    default_programs_per_sm, default_block, default_warps = COLLECT_DEFAULTS[collect]
    collect_programs_per_sm = collect_programs_per_sm or default_programs_per_sm
    collect_block = collect_block or default_block
    stream_warps = stream_warps or default_warps
    if collect != "round2" and collect_programs_per_sm < 1:
        raise ValueError(f"collect_programs_per_sm must be >= 1, got {collect_programs_per_sm}")
    for name, value in (("finish_split", finish_split), ("search_ways", search_ways),
                        ("threshold_ways", threshold_ways), ("threshold_parts", threshold_parts),
                        ("collect_block", collect_block)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {value}")
    if stream_stages < 1 or group_max_stages < 1:
        raise ValueError(f"stream_stages and group_max_stages must be >= 1, got "
                         f"{stream_stages} and {group_max_stages}")
    if threshold_slack < -1:
        raise ValueError(f"threshold_slack must be >= -1 (-1: exact), got {threshold_slack}")
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
    if collect_warps is None:
        is_nvidia = scores.device.type == "cuda" and torch.version.hip is None
        collect_warps = 4 if is_nvidia else 8
    if programs_per_row is None:
        # Half of round 2's 4 programs per multiprocessor over all rows, rounded as measured
        # on the H200 in round 3 (4 per row at 64 rows: 128 / 298 us against 131 / 309 at 9).
        num_programs_wanted = 1 if is_interpreter else 4 * _num_sms(scores.device)
        programs_per_row = max(1, triton.cdiv(num_programs_wanted, num_rows) // 2)
    chunk_size, num_chunks = chunking(num_positions, num_groups, programs_per_row)

    # int32 parts; the last one holds int64 finish scratch (2 int32 per entry).
    sizes = [num_rows * num_chunks * num_groups, num_rows, num_rows, num_rows * capacity,
             num_rows * capacity, 2 * num_rows * k_pad]
    sizes = [triton.cdiv(size, WORKSPACE_ALIGN) * WORKSPACE_ALIGN for size in sizes]
    workspace = torch.empty(sum(sizes), dtype=torch.int32, device=scores.device)
    partial_max, counter, threshold, candidate_pos, candidate_bits, selected = torch.split(
        workspace, sizes)

    grid = (num_rows, num_chunks)
    topk_group_max_kernel[grid](
        scores, lengths, partial_max, counter, chunk_size, num_chunks, scores.stride(0),
        NUM_GROUPS=num_groups, PREFETCH=group_max_prefetch, STAGES=group_max_stages,
        num_warps=collect_warps)
    if stages < 2:
        return out
    topk_threshold_kernel[(num_rows,)](
        partial_max, lengths, threshold, k, num_chunks,
        NUM_GROUPS=num_groups, WAYS=max(2, threshold_ways),
        BINS=histogram_bins(max(2, threshold_ways)), PARTS=threshold_parts,
        SLACK=threshold_slack, num_warps=finish_warps)
    if stages < 3:
        return out
    if collect == "round2":
        topk_collect_kernel[grid](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits,
            chunk_size, scores.stride(0), capacity, BLOCK=block, num_warps=collect_warps)
    else:
        tile = 16 if is_interpreter else collect_block
        if collect == "lane":  # 8 scores per thread: 4 threads under the interpreter
            tile = 32 if is_interpreter else 256 * stream_warps
        # Rounded down: a grid just over a whole number of resident waves would add a wave
        # for a few programs.
        collect_programs = collect_programs_per_sm * _num_sms(scores.device)
        stream_chunk_size, stream_chunks = stream_chunking(
            num_positions, tile, max(1, collect_programs // num_rows))
        if collect == "warp":
            kernel, options = topk_warp_collect_kernel, {"BLOCK": tile, "STAGES": stream_stages}
        elif collect == "lane":
            kernel, options = topk_lane_collect_kernel, {"LANES": tile // 8,
                                                         "STAGES": stream_stages}
        else:
            kernel, options = topk_stream_collect_kernel, {"BLOCK": tile}
        kernel[(num_rows, stream_chunks)](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits,
            stream_chunk_size, scores.stride(0), capacity, num_warps=stream_warps, **options)
    if write_slots:
        table, requests, max_blocks = block_table, row_request, block_table.shape[1]
    else:
        table, requests, max_blocks = lengths, lengths, 0  # unused placeholders
    table_stride = table.stride(0) if write_slots else 0
    if stages < 4:
        return out
    topk_overflow_kernel[(num_rows,)](
        scores, lengths, counter, threshold, candidate_pos, candidate_bits, k,
        scores.stride(0), CAPACITY=capacity, BLOCK=block, num_warps=finish_warps)
    if stages < 5:
        return out
    slice_size = max(MIN_SLICE, k_pad // finish_split)
    ways = max(2, search_ways)
    topk_finish_kernel[(num_rows, k_pad // slice_size)](
        lengths, counter, candidate_pos, candidate_bits, selected.view(torch.int64), table,
        requests, out, k, max_blocks, block_size.bit_length() - 1, table_stride,
        CAPACITY=capacity, SLICE=slice_size, WAYS=ways, BINS=histogram_bins(ways),
        WRITE_SLOTS=write_slots, num_warps=finish_warps)
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
