"""Top-k stage 2, the streaming filter: the scores >= T0 into the row's candidate buffer,
staged per program so that no tile waits on an atomic round trip.

Reserving room in the row's buffer with one atomic add per tile that holds a candidate makes
each tile's stores wait on the add's result: a round trip to L2 (~1 us) per tile, which caps
the collect near 16 tiles of 256 scores per microsecond per multiprocessor. Instead,
topk_staged_collect_kernel's one-warp programs (16 per multiprocessor, each streaming its
chunk in tiles whose loads Triton's pipeliner keeps STAGES tiles ahead) append each tile's
candidates to their own staging slice (offsets known within the warp: no atomic, nothing to
wait for), and move the slice to the row's buffer with one atomic add when it could
overflow, and at the end. For scores in random order a program's chunk holds ~90 candidates
(1.4 k over ~33 programs per row): one atomic add per program. The compare is on the fp32
scores against T0 as a float (x >= T0 <=> key(x) >= key(T0), -0.0 equal to +0.0 either way),
so no key is computed per score, and the raw score bits are stored (the finish turns the few
candidates into keys); the order of candidates in the buffer is any.
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import score_of_key


@triton.jit
def sync_warp(WARP_SYNC: tl.constexpr):
    """Order the program's (one warp's) global stores before its threads' later loads: on
    NVIDIA bar.warp.sync (__syncwarp: memory ordering among the warp's threads; a block
    barrier here would stop Triton's pipeliner from pipelining the collect's loop), else a
    block barrier (AMD; a no-op under the interpreter, which runs a program as one thread)."""
    if WARP_SYNC:
        tl.inline_asm_elementwise("bar.warp.sync -1;\n mov.u32 $0, $1;", "=r,r",
                                  [tl.arange(0, 32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.debug_barrier()


@triton.jit
def flush_staged(p_stage_pos, p_stage_bits, num_staged, p_counter, p_pos, p_bits,
                 candidate_capacity, WARP_SYNC: tl.constexpr):
    """Move the num_staged (position, bits) pairs of the program's staging slice to the row's
    buffer (those that fit its capacity): one atomic add reserves room, then a copy 32 pairs
    at a time (few registers)."""
    base = tl.atomic_add(p_counter, num_staged, sem="relaxed")
    sync_warp(WARP_SYNC)  # the slice was written by other threads of the warp
    o_b = tl.arange(0, 32)
    # Nothing to copy once the buffer is full (the row overflows: the rescan fills it).
    num_copied = tl.minimum(num_staged, tl.maximum(candidate_capacity - base, 0))
    for start in range(0, num_copied, 32):
        o_s = start + o_b
        m_s = o_s < num_copied
        position = tl.load(p_stage_pos + o_s, mask=m_s, other=0)
        bits = tl.load(p_stage_bits + o_s, mask=m_s, other=0)
        tl.store(p_pos + base + o_s, position, mask=m_s)
        tl.store(p_bits + base + o_s, bits, mask=m_s)
    sync_warp(WARP_SYNC)  # the slice's loads done before other threads rewrite it


def ballot_rank_asm(num_per_thread: int) -> str:
    """PTX for tl.inline_asm_elementwise (pack = num_per_thread, all of a thread's elements of
    a one-warp tile): each candidate's rank among the tile's candidates, register by register:
    rank = (candidates in earlier registers of all lanes) + (in this register of lower lanes),
    from one vote.ballot and two popc per register. A bijection onto [0, count), not position
    order (the staging slice is unordered); ~6 instructions per element where tl.cumsum's
    warp scan took ~24 (sm_90 SASS)."""
    lines = ["{", ".reg .pred p;", ".reg .b32 b, m, o, t;", "mov.u32 m, %lanemask_lt;",
             "mov.u32 o, 0;"]
    for r in range(num_per_thread):
        lines += [f"setp.ne.s32 p, ${num_per_thread + r}, 0;",
                  "vote.sync.ballot.b32 b, p, 0xffffffff;", "and.b32 t, b, m;", "popc.b32 t, t;",
                  f"add.s32 ${r}, t, o;", "popc.b32 t, b;", "add.s32 o, o, t;"]
    return "\n".join(lines + ["}"])


def ballot_rank_constraints(num_per_thread: int) -> str:
    return ",".join(["=r"] * num_per_thread + ["r"] * num_per_thread)


@triton.jit
def stage_tile(x, o_s, is_candidate, num_staged, p_stage_pos, p_stage_bits, p_counter, p_pos,
               p_bits, candidate_capacity, BLOCK: tl.constexpr, PIECES: tl.constexpr,
               WARP_SYNC: tl.constexpr, RANK_ASM: tl.constexpr,
               RANK_CONSTRAINTS: tl.constexpr):
    """Append the tile's candidates to the staging slice (flushed first if they might not
    fit); returns the new number staged. RANK_ASM (NVIDIA, one warp): the candidates' slots
    from ballots (ballot_rank_asm); "": from tl.cumsum."""
    num_candidates = tl.sum(is_candidate.to(tl.int32), 0)
    if num_candidates > 0:
        if num_staged + num_candidates > PIECES * BLOCK:
            flush_staged(p_stage_pos, p_stage_bits, num_staged, p_counter, p_pos, p_bits,
                         candidate_capacity, WARP_SYNC)
            num_staged = 0
        if RANK_ASM != "":
            o_out = num_staged + tl.inline_asm_elementwise(
                RANK_ASM, RANK_CONSTRAINTS, [is_candidate.to(tl.int32)], dtype=tl.int32,
                is_pure=True, pack=BLOCK // 32)
        else:
            o_out = num_staged + tl.cumsum(is_candidate.to(tl.int32), 0) - 1
        tl.store(p_stage_pos + o_out, o_s, mask=is_candidate)
        tl.store(p_stage_bits + o_out, x.to(tl.int32, bitcast=True), mask=is_candidate)
        num_staged += num_candidates
    return num_staged


@triton.jit
def topk_staged_collect_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_bits_ptr,
    stage_pos_ptr, stage_bits_ptr,
    # sizes and strides
    chunk_size, stride_scores_row, candidate_capacity,
    # meta-parameters
    BLOCK: tl.constexpr,  # positions per tile
    PIECES: tl.constexpr,  # staging slice of a program: PIECES * BLOCK pairs
    STAGES: tl.constexpr,  # the full tiles' loads pipelined that many tiles deep
    WARP_SYNC: tl.constexpr,  # NVIDIA with one warp per program: see sync_warp
    RANK_ASM: tl.constexpr = "",  # NVIDIA, one warp: ballot_rank_asm(BLOCK // 32); "": cumsum
    RANK_CONSTRAINTS: tl.constexpr = "",
):
    """The scores >= T0 of the chunk (chunk_size a multiple of BLOCK) appended, through the
    program's staging slice, to the row's candidate buffer (positions and score bits):
    counter[row] ends as the row's number of candidates, only the first
    `candidate_capacity` stored."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    threshold = score_of_key(tl.load(threshold_ptr + i_row))
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_counter = counter_ptr + i_row
    o_row_buffer = i_row.to(tl.int64) * candidate_capacity
    p_pos = candidate_pos_ptr + o_row_buffer
    p_bits = candidate_bits_ptr + o_row_buffer
    o_stage = (i_row.to(tl.int64) * tl.num_programs(1) + i_chunk) * (PIECES * BLOCK)
    p_stage_pos = stage_pos_ptr + o_stage
    p_stage_bits = stage_bits_ptr + o_stage
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    num_full = tl.maximum(end - start, 0) // BLOCK
    o_b = tl.arange(0, BLOCK)
    p_chunk = p_row + start
    num_staged = tl.zeros((), tl.int32)
    for i_tile in tl.range(0, num_full, num_stages=STAGES):
        x = tl.load(p_chunk + i_tile * BLOCK + o_b)
        num_staged = stage_tile(x, start + i_tile * BLOCK + o_b, x >= threshold, num_staged,
                                p_stage_pos, p_stage_bits, p_counter, p_pos, p_bits,
                                candidate_capacity, BLOCK, PIECES, WARP_SYNC, RANK_ASM,
                                RANK_CONSTRAINTS)
    tail = start + num_full * BLOCK
    if tail < end:
        o_s = tail + o_b
        m_s = o_s < end
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
        num_staged = stage_tile(x, o_s, m_s & (x >= threshold), num_staged, p_stage_pos,
                                p_stage_bits, p_counter, p_pos, p_bits, candidate_capacity,
                                BLOCK, PIECES, WARP_SYNC, RANK_ASM, RANK_CONSTRAINTS)
    if num_staged > 0:
        flush_staged(p_stage_pos, p_stage_bits, num_staged, p_counter, p_pos, p_bits,
                     candidate_capacity, WARP_SYNC)
