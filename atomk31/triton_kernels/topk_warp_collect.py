"""Top-k stage 2, one atomic add per tile: the scores >= T0 into the row's candidate buffer.

topk_warp_collect_kernel avoids what held round 2's collect at ~0.8 TB/s on the H200 (block
barriers through shared memory in every tile's sum, prefix sum and atomic broadcast, 48 in
its sm_90 SASS, one tile in flight, 4 programs of 4 warps per multiprocessor; at 128K to 1M
positions nearly every tile holds a candidate). Here: one-warp programs (16 per
multiprocessor), each streaming its chunk in small tiles whose loads Triton's software
pipeliner keeps STAGES tiles ahead (cp.async into shared memory: the bytes in flight cost no
registers; sm_90 SASS: LDGSTS.128, 64 registers at 256-score tiles); the tile's candidate
count, its prefix sum and the broadcast of the atomic add's result stay within the warp. The
compare is on the fp32 scores against T0 as a float (x >= T0 <=> key(x) >= key(T0), -0.0
equal to +0.0 either way), so no key is computed per score, and the raw score bits are
stored (the finish turns the few candidates into keys).

Tried and dropped (SASS, sm_90): one atomic add per candidate (ptxas aggregates each warp's
into one, but one per score register: up to 16 dependent round trips per tile), and per-thread
atomic adds on [threads, 4] tiles used one tile later (ptxas shuffles the aggregated result at
once, so the round trip is not overlapped).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import wait_for_previous_launch


@triton.jit
def score_of_key(key):
    """The fp32 score whose orderable key is `key` (the inverse of orderable_key)."""
    bits = key ^ ((key >> 31) & 2147483647)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def append_candidates(x, o_s, is_candidate, p_counter, p_pos, p_bits, candidate_capacity):
    """Append the (o_s, bits of the score x) pairs where is_candidate to a row's buffer
    (p_pos, p_bits): one atomic add reserves room; a tile without candidates costs nothing."""
    num_candidates = tl.sum(is_candidate.to(tl.int32), 0)
    if num_candidates > 0:
        base = tl.atomic_add(p_counter, num_candidates, sem="relaxed")
        o_out = base + tl.cumsum(is_candidate.to(tl.int32), 0) - 1
        m_out = is_candidate & (o_out < candidate_capacity)
        tl.store(p_pos + o_out, o_s, mask=m_out)
        tl.store(p_bits + o_out, x.to(tl.int32, bitcast=True), mask=m_out)


@triton.jit
def topk_warp_collect_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_bits_ptr,
    # sizes and strides
    chunk_size, stride_scores_row, candidate_capacity,
    # meta-parameters
    BLOCK: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False,
):
    """Positions and score bits of the chunk's scores >= T0 -> the row's buffer (any order);
    counter[row] ends as the row's number of candidates (it may exceed the capacity: then
    only the first `candidate_capacity` are stored). chunk_size is a multiple of BLOCK.
    STAGES > 1: the full tiles' loads are software pipelined that many tiles deep (cp.async
    into shared memory on NVIDIA: bytes in flight without registers); 1: the next tile's
    load issued by hand before the current tile is filtered (registers)."""
    wait_for_previous_launch(PDL)
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    threshold = score_of_key(tl.load(threshold_ptr + i_row))
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_counter = counter_ptr + i_row
    o_row_buffer = i_row.to(tl.int64) * candidate_capacity
    p_pos = candidate_pos_ptr + o_row_buffer
    p_bits = candidate_bits_ptr + o_row_buffer
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    num_full = tl.maximum(end - start, 0) // BLOCK
    o_b = tl.arange(0, BLOCK)
    p_chunk = p_row + start
    if STAGES > 1:
        for i_tile in tl.range(0, num_full, num_stages=STAGES):
            x = tl.load(p_chunk + i_tile * BLOCK + o_b)
            append_candidates(x, start + i_tile * BLOCK + o_b, x >= threshold, p_counter,
                              p_pos, p_bits, candidate_capacity)
    else:  # by hand: tile i + 1 loads while tile i is filtered
        x = tl.zeros((BLOCK,), tl.float32)
        if num_full > 0:
            x = tl.load(p_chunk + o_b)
        for i_tile in range(0, num_full):
            # The last iteration reloads its own tile (in bounds, unmasked), no branch.
            x_next = tl.load(p_chunk + tl.minimum(i_tile + 1, num_full - 1) * BLOCK + o_b)
            append_candidates(x, start + i_tile * BLOCK + o_b, x >= threshold, p_counter,
                              p_pos, p_bits, candidate_capacity)
            x = x_next
    tail = start + num_full * BLOCK
    if tail < end:
        o_s = tail + o_b
        m_s = o_s < end
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
        append_candidates(x, o_s, m_s & (x >= threshold), p_counter, p_pos, p_bits,
                          candidate_capacity)

