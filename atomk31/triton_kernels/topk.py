"""Exact top-k of indexer scores in Triton: three to five launches, the scores read twice.

Contract: `atomk31.ops.topk` (`topk_positions`, and `topk_slots` = positions_to_slots of it):
the set of the k best positions of each row (higher score first, equal scores -> lower
position, §4.6, §8 #6; -0.0 equal to +0.0, §9 #6) in ascending position order, rows shorter
than k padded with -1.

Stages (kernels in topk_collect.py, topk_warp_collect.py, topk_staged_collect.py and
topk_finish.py):
  1. topk_group_max_kernel: per-chunk maxima of NUM_GROUPS strided groups of each row (and
     the zeroing of the finish's bitmap);
  2. topk_threshold_kernel (one program per row): T0, the need-th largest group maximum
     (or, with `threshold_slack`, a key a little below it found in fewer search rounds);
     with `fuse_threshold` (the default at >= 64 rows on NVIDIA) stage 1 runs one program
     per row and finds T0 itself, and this kernel is not launched;
  3. the collect, a streaming filter: the scores >= T0 into a per-row candidate buffer
     (about 1.4 k of them for scores in random order): `collect="staged"` (the default),
     topk_staged_collect_kernel (one-warp programs, many per multiprocessor, each staging
     its candidates and reserving room in the row's buffer once); "warp",
     topk_warp_collect_kernel (the same with an atomic add per tile: round 3's default,
     faster when every score is a candidate). Removed: the "lane", "stream" and "round2"
     collects (each slower on the H200, in every case, than the staged or the warp collect:
     benchmarks/results/*_rounds_log.txt), and stage 1's hand-written prefetch
     (group_max_prefetch: within 1.2% of none in round 2's tuning, superseded by the
     pipelined loads of group_max_stages);
  4. the finish: topk_overflow_kernel (a row whose candidates overflow the buffer rescans
     its row; other rows return at once; with `fuse_overflow`, the default on NVIDIA, the
     finish does it and this kernel is not launched), then topk_finish_kernel (one program
     per row: the exact cut among the candidates, then the selected positions in ascending
     order through a bitmap and a prefix sum of popcounts, no sort).
No host synchronisation and no memset: stage 1 zeroes the counters stage 3 uses and the
bitmap the finish uses, and all workspaces share one allocation. The candidate buffer holds
positions and raw score bits.

Where the time went (H200, 64 x 128K, session 5, graph us): stage 1 7.4, stage 2 8.8, the
collect 15.1, the overflow launch 1.3, the finish 20.0 (52.6). Stage 2 and the finish are
one program per row running many-way searches (kth_largest_key), latency-bound on block
barriers: session 6 cut a search round from 17 to 8 barriers and ~640 to ~420 instructions
(sm_90 SASS, triton 3.6: a masked histogram of WAYS bins, a reverse cumsum and one packed
reduction, the per-key arithmetic in 32 bits); stage 2 now also hands the finish each row's
largest key and T0 as the search's bounds (no reductions before its first round), and the
finish stops at the first key exactly `need` candidates reach (a round fewer for distinct
scores) and loads the candidates' positions with their scores. On the H200 (session 6, round
2): 52.9 -> 46.1 us (stage 2 6.9 us, the finish 15.3); then stage 1 fused with stage 2 (one
program per row finds T0 from the maxima in registers: no partial maxima, one launch fewer;
at 64 rows), the overflow rescan inside the finish and the finish's search at 128 ways:
43.5 us (3.71x torch.topk), 1M 183.5 (4.60x). Measured and not default: `pdl` (programmatic
dependent launch: neutral in a graph), stage 1 at 8 programs per row (+2.9 us), stage 2 at
128 ways or slack 256 (noise), the finish at 256 ways (+1.3).
"""

import functools

import torch
import triton
from triton.runtime import driver

from atomk31.triton_kernels.runtime import runs_on_interpreter
from atomk31.triton_kernels.topk_collect import (
    chunking,
    histogram_bins,
    num_groups_for,
    topk_group_max_kernel,
    topk_threshold_kernel,
)
from atomk31.triton_kernels.topk_finish import topk_finish_kernel, topk_overflow_kernel
from atomk31.triton_kernels.topk_staged_collect import (
    ballot_rank_asm,
    ballot_rank_constraints,
    topk_staged_collect_kernel,
)
from atomk31.triton_kernels.topk_warp_collect import topk_warp_collect_kernel

MAX_K = 4096  # the candidate buffer of a row (2 k) is held in one program
OVERFLOW_BLOCK = 4096  # positions per tile of the overflow rescan
# ... and of the rescan inside the finish (fuse_overflow): 4096 spilled the finish there
# (24 B of stack at 16 warps, sm_90, triton 3.9), 2048 did not.
RESCAN_BLOCK = 2048
COLLECTS = ("warp", "staged")
# Per collect: (programs per multiprocessor, positions per tile, warps) unless given.
COLLECT_DEFAULTS = {"warp": (16, 256, 1), "staged": (16, 256, 1)}
WORKSPACE_ALIGN = 64  # int32 elements: each workspace part starts 256-byte aligned
# fuse_threshold's default: one program per row streams the scores, measured at 64 rows.
FUSED_THRESHOLD_MIN_ROWS = 64
MIN_K_PAD = 16  # k is padded to a power of two, at least this (NUM_GROUPS = 2 k_pad >= 32)
# Bitmap words (of 32 positions each) per step of the finish's prefix sum: ~2.5 us a step on
# the H200 (8 steps at 1M); 8192 spills the finish (40 B at 16 warps, sm_90, triton 3.9).
SCAN_BLOCK = 4096


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    block_table: torch.Tensor | None = None,
    row_request: torch.Tensor | None = None,
    block_size: int = 1,
    programs_per_row: int | None = None,
    capacity_factor: int = 2,
    group_max_warps: int | None = None,
    finish_warps: int = 16,
    threshold_warps: int = 16,
    search_ways: int = 128,
    threshold_ways: int = 64,
    threshold_slack: int = 64,
    group_max_stages: int | None = None,
    threshold_parts: int = 4,
    collect: str = "staged",
    collect_programs_per_sm: int | None = None,
    collect_block: int | None = None,
    collect_program_warps: int | None = None,
    collect_stages: int = 8,
    staging_pieces: int = 4,
    staged_ballot: bool = True,
    fuse_overflow: bool = True,
    pdl: bool = False,
    fuse_threshold: bool | None = None,
    stages: int = 5,
) -> torch.Tensor:
    """Positions [Nq, k] int32 of each row's k best scores (or their cache slots when
    block_table [N, max_blocks] and row_request [Nq] are given), in ascending position
    order, -1 padded.

    scores [Nq, L] fp32 (no NaN), lengths [Nq] in [0, L]; k <= MAX_K. Defaults: the
    measured winners on the H200 (64 rows, graph us: 128K / 1M): session 4 round 1, with the
    bitmap finish: the staged collect with ballots (55.2 / 197.0; staged with tl.cumsum 60.5 /
    205.5; the warp collect 73.2 / 264.6; round 3's launch, sorting finish: 91.5 / 268.3) and
    the finish's search at 64 ways (2.3 / 3.1 us less than 16 on the warp launch); from round
    3: the threshold search with slack 64, stage 1 at half the programs and 3 stages. (Scores
    all equal, where every score is a candidate, favour the warp collect: 82 against 105.)
    Session 6 (round 2, same run; 64 rows, graph us, 128K / 1M): the new search rounds
    (session 5's defaults 52.9 / 194.1 -> 46.1 / 184.7), then together fuse_threshold
    (6 stages), fuse_overflow and the finish's search at 128 ways: 43.5 / 183.5 (3.71x /
    4.60x torch.topk; alone: 45.2 / 185.1, 45.8 / 184.8, 46.2 / 185.7). The cost: rows whose
    candidates all overflow (64 x 128K all equal) 91.4 -> 103.3, the rescan inside the finish
    being slower than its own kernel (fuse_overflow=False for tie-heavy batches).
    Tuning:
    `programs_per_row` (stage 1; default: 2 programs per multiprocessor over all rows),
    `capacity_factor` (candidate buffer = that many times the padded k, a power of two),
    `group_max_warps` (stage 1; default 4 on NVIDIA, faster on the H200 in round 1, else 8:
    gfx942 spills scalar registers at 4), `finish_warps` (the overflow rescan and the
    finish), `threshold_warps` (stage 2: its search's block reductions are cheaper with
    fewer warps, its per-thread work larger), `search_ways` (bins per round of the finish's
    cut search, a power of two), `threshold_ways` (the same for stage 2: 64 takes 4 rounds
    where 16 takes 6), `threshold_slack` (stage 2 may stop at a T0 that up to that many more
    group maxima reach; -1: the exact need-th largest), `collect` ("staged" or "warp", see
    the module docstring) with `collect_programs_per_sm` programs per multiprocessor over
    all rows, `collect_block` positions per tile, a power of two, and
    `collect_program_warps` warps per program (defaults per collect: COLLECT_DEFAULTS),
    `collect_stages` (the collect's loads in flight, in tiles, through Triton's pipeliner; 1
    for the warp collect: the next tile's load issued by hand), `staging_pieces` (the staged
    collect's slice per program, in tiles: it moves to the row's buffer when full and at the
    end), `staged_ballot` (the staged collect ranks a tile's candidates with warp ballots
    instead of tl.cumsum: NVIDIA with one-warp programs only, ignored elsewhere),
    `fuse_overflow` (the finish rescans an overflowing row itself: one launch fewer; NVIDIA
    only, ignored elsewhere: SGPR spills on AMD), `group_max_stages` (stage 1's loads
    pipelined that many tiles deep; 1: not; default 6 with fuse_threshold, else 3),
    `threshold_parts` (stage 2 merges that many chunks' maxima per load, a power of two; 1:
    round 2's one chunk at a time), `pdl` (stages 2-5 launched with programmatic dependent
    launch, see wait_for_previous_launch; NVIDIA sm_90+ only, ignored elsewhere; H200 round
    2, graph: -0.3 us at 128K, +2.3 at 1M; with the fusions -0.4 / +1.8; eager -3 at 128K),
    `fuse_threshold` (stage 1 as one program per row of `threshold_warps` warps that also
    finds T0: no stage-2 launch and no partial maxima, but only Nq programs stream the
    scores; `programs_per_row` and `group_max_warps` are then ignored; default: on NVIDIA
    with at least FUSED_THRESHOLD_MIN_ROWS rows, the batch it was measured on).
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
    collect_program_warps = collect_program_warps or default_warps
    if collect_programs_per_sm < 1:
        raise ValueError(f"collect_programs_per_sm must be >= 1, got {collect_programs_per_sm}")
    for name, value in (("search_ways", search_ways),
                        ("threshold_ways", threshold_ways), ("threshold_parts", threshold_parts),
                        ("collect_block", collect_block)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {value}")
    if staging_pieces < 1:
        raise ValueError(f"staging_pieces must be >= 1, got {staging_pieces}")
    if collect_stages < 1 or (group_max_stages is not None and group_max_stages < 1):
        raise ValueError(f"collect_stages and group_max_stages must be >= 1, got "
                         f"{collect_stages} and {group_max_stages}")
    if threshold_slack < -1:
        raise ValueError(f"threshold_slack must be >= -1 (-1: exact), got {threshold_slack}")
    out = torch.empty(num_rows, k, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or k == 0:
        return out
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    is_interpreter = runs_on_interpreter(topk_finish_kernel)  # TRITON_INTERPRET=1
    target = None if is_interpreter else driver.active.get_current_target()
    is_cuda = target is not None and target.backend == "cuda"
    is_pdl = pdl and is_cuda and target.arch >= 90  # griddepcontrol: sm_90 and later
    # Stages 2-5: launched to start under the previous kernel's tail (stage 1 plainly: its
    # predecessor in the stream is not ours and does not signal).
    launch_options = {"launch_pdl": True} if is_pdl else {}
    overflow_block = 64 if is_interpreter else OVERFLOW_BLOCK
    k_pad = max(MIN_K_PAD, triton.next_power_of_2(k))
    num_groups = num_groups_for(k_pad)
    capacity = capacity_factor * k_pad
    if fuse_threshold is None:
        fuse_threshold = is_cuda and num_rows >= FUSED_THRESHOLD_MIN_ROWS
    if group_max_stages is None:
        group_max_stages = 6 if fuse_threshold else 3
    if fuse_threshold:
        programs_per_row, group_max_warps = 1, threshold_warps
    if group_max_warps is None:
        is_nvidia = scores.device.type == "cuda" and torch.version.hip is None
        group_max_warps = 4 if is_nvidia else 8
    if programs_per_row is None:
        # Half of round 2's 4 programs per multiprocessor over all rows, rounded as measured
        # on the H200 in round 3 (4 per row at 64 rows: 128 / 298 us against 131 / 309 at 9).
        num_programs_wanted = 1 if is_interpreter else 4 * _num_sms(scores.device)
        programs_per_row = max(1, triton.cdiv(num_programs_wanted, num_rows) // 2)
    chunk_size, num_chunks = chunking(num_positions, num_groups, programs_per_row)
    tile = 16 if is_interpreter else collect_block
    # Rounded down: a grid just over a whole number of resident waves would add a wave for a
    # few programs.
    collect_programs = collect_programs_per_sm * _num_sms(scores.device)
    collect_chunk_size, collect_chunks = chunking(
        num_positions, tile, max(1, collect_programs // num_rows))
    # The staged collect's slices: one per program, staging_pieces tiles of (position, bits).
    stage_size = num_rows * collect_chunks * staging_pieces * tile if collect == "staged" else 0

    # The finish's bitmap (one bit per position) and its words' prefix sums: rows 128-byte
    # aligned, so no two rows share a cache line.
    num_words = triton.cdiv(num_positions, 32)
    words_per_row = triton.cdiv(num_words, 32) * 32
    # int32 parts (threshold: T0 of each row, then each row's largest key).
    num_partial_maxima = 0 if fuse_threshold else num_rows * num_chunks * num_groups
    sizes = [num_partial_maxima, num_rows, 2 * num_rows, num_rows * capacity,
             num_rows * capacity, num_rows * words_per_row, num_rows * words_per_row,
             stage_size, stage_size]
    sizes = [triton.cdiv(size, WORKSPACE_ALIGN) * WORKSPACE_ALIGN for size in sizes]
    workspace = torch.empty(sum(sizes), dtype=torch.int32, device=scores.device)
    (partial_max, counter, threshold, candidate_pos, candidate_bits, bitmap, prefix,
     stage_pos, stage_bits) = torch.split(workspace, sizes)

    threshold_options = dict(WAYS=max(2, threshold_ways), SLACK=threshold_slack,
                             BINS=histogram_bins(max(2, threshold_ways)))
    topk_group_max_kernel[(num_rows, num_chunks)](
        scores, lengths, partial_max, counter, bitmap, threshold, k, chunk_size, num_chunks,
        scores.stride(0), num_words, words_per_row,
        NUM_GROUPS=num_groups, STAGES=group_max_stages, PDL=is_pdl,
        THRESHOLD=fuse_threshold, **(threshold_options if fuse_threshold else {}),
        num_warps=group_max_warps)
    if stages < 2:
        return out
    if not fuse_threshold:
        topk_threshold_kernel[(num_rows,)](
            partial_max, lengths, threshold, k, num_chunks, NUM_GROUPS=num_groups,
            PARTS=threshold_parts, **threshold_options, PDL=is_pdl, num_warps=threshold_warps,
            **launch_options)
    if stages < 3:
        return out
    if collect == "staged":
        # One-warp programs on NVIDIA order their staging through __syncwarp (see sync_warp)
        # and may rank candidates with ballots (PTX).
        is_cuda_warp = is_cuda and collect_program_warps == 1
        is_ballot = staged_ballot and is_cuda_warp
        topk_staged_collect_kernel[(num_rows, collect_chunks)](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits, stage_pos,
            stage_bits, collect_chunk_size, scores.stride(0), capacity, BLOCK=tile,
            PIECES=staging_pieces, STAGES=collect_stages, WARP_SYNC=is_cuda_warp,
            RANK_ASM=ballot_rank_asm(tile // 32) if is_ballot else "",
            RANK_CONSTRAINTS=ballot_rank_constraints(tile // 32) if is_ballot else "",
            PDL=is_pdl, num_warps=collect_program_warps, **launch_options)
    else:
        topk_warp_collect_kernel[(num_rows, collect_chunks)](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits,
            collect_chunk_size, scores.stride(0), capacity, BLOCK=tile, STAGES=collect_stages,
            PDL=is_pdl, num_warps=collect_program_warps, **launch_options)
    if write_slots:
        table, requests, max_blocks = block_table, row_request, block_table.shape[1]
    else:
        table, requests, max_blocks = lengths, lengths, 0  # unused placeholders
    table_stride = table.stride(0) if write_slots else 0
    if stages < 4:
        return out
    is_fused = fuse_overflow and (is_cuda or is_interpreter)
    if not is_fused:
        topk_overflow_kernel[(num_rows,)](
            scores, lengths, counter, threshold, candidate_pos, candidate_bits, k,
            scores.stride(0), CAPACITY=capacity, BLOCK=overflow_block, PDL=is_pdl,
            num_warps=finish_warps, **launch_options)
    if stages < 5:
        return out
    ways = max(2, search_ways)
    topk_finish_kernel[(num_rows,)](
        lengths, counter, candidate_pos, candidate_bits, bitmap, prefix, table, requests, out,
        scores, threshold, k, words_per_row, max_blocks, block_size.bit_length() - 1,
        table_stride, scores.stride(0), CAPACITY=capacity, RESCAN=is_fused,
        BLOCK=64 if is_interpreter else RESCAN_BLOCK, K_PAD=k_pad,
        SCAN_BLOCK=16 if is_interpreter else SCAN_BLOCK,
        WAYS=ways, BINS=histogram_bins(ways), WRITE_SLOTS=write_slots, PDL=is_pdl,
        num_warps=finish_warps, **launch_options)
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
