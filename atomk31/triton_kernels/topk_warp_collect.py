"""Top-k stage 2 at copy bandwidth: the scores >= T0 into the row's candidate buffer.

topk_warp_collect_kernel does topk_stream_collect_kernel's job (same buffers, same counter)
without what held that one at ~0.8 TB/s on the H200 (round 2: block barriers through shared
memory in every tile's sum, prefix sum and atomic broadcast, 48 in its sm_90 SASS, one tile
in flight, 4 programs of 4 warps per multiprocessor; at 128K to 1M positions nearly every
tile holds a candidate). Here: one-warp programs (16 per multiprocessor), each streaming its
chunk in small tiles whose loads Triton's software pipeliner keeps STAGES tiles ahead
(cp.async into shared memory: the bytes in flight cost no registers; sm_90 SASS: LDGSTS.128,
64 registers at 256-score tiles); the tile's candidate count, its prefix sum and the
broadcast of the atomic add's result stay within the warp. The compare is on the fp32
scores against T0 as a float (x >= T0 <=> key(x) >= key(T0), -0.0 equal to +0.0 either way),
so no key is computed per score, and the raw score bits are stored (the finish turns the few
candidates into keys).

Tried and dropped (SASS, sm_90): one atomic add per candidate (ptxas aggregates each warp's
into one, but one per score register: up to 16 dependent round trips per tile), and per-thread
atomic adds on [lanes, 4] tiles used one tile later (ptxas shuffles the aggregated result at
once, so the round trip is not overlapped).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import append_candidates


@triton.jit
def score_of_key(key):
    """The fp32 score whose orderable key is `key` (the inverse of orderable_key)."""
    bits = key ^ ((key >> 31) & 2147483647)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def topk_warp_collect_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_bits_ptr,
    # sizes and strides
    chunk_size, stride_scores_row, candidate_capacity,
    # meta-parameters
    BLOCK: tl.constexpr, STAGES: tl.constexpr,
):
    """Positions and score bits of the chunk's scores >= T0 -> the row's buffer (any order);
    counter[row] ends as the row's number of candidates (it may exceed the capacity: then
    only the first `candidate_capacity` are stored). chunk_size is a multiple of BLOCK.
    STAGES > 1: the full tiles' loads are software pipelined that many tiles deep (cp.async
    into shared memory on NVIDIA: bytes in flight without registers); 1: the next tile's
    load issued by hand before the current tile is filtered (registers)."""
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
            append_candidates(x, start + i_tile * BLOCK + o_b, x >= threshold, p_counter, p_pos,
                          p_bits, candidate_capacity)
    else:  # by hand: tile i + 1 loads while tile i is filtered
        x = tl.zeros((BLOCK,), tl.float32)
        if num_full > 0:
            x = tl.load(p_chunk + o_b)
        for i_tile in range(0, num_full):
            # The last iteration reloads its own tile (in bounds, unmasked), no branch.
            x_next = tl.load(p_chunk + tl.minimum(i_tile + 1, num_full - 1) * BLOCK + o_b)
            append_candidates(x, start + i_tile * BLOCK + o_b, x >= threshold, p_counter, p_pos,
                          p_bits, candidate_capacity)
            x = x_next
    tail = start + num_full * BLOCK
    if tail < end:
        o_s = tail + o_b
        m_s = o_s < end
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
        append_candidates(x, o_s, m_s & (x >= threshold), p_counter, p_pos, p_bits,
                      candidate_capacity)


@triton.jit
def columns(x):
    """The 4 columns of a [LANES, 4] tile, [LANES] each: in-thread moves when each thread
    holds one row (16 bytes)."""
    even, odd = tl.split(tl.reshape(x, (x.shape[0], 2, 2)))  # columns (0, 2) and (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def store_column(x, o_s, is_candidate, o_out, p_pos, p_bits, candidate_capacity):
    m_out = is_candidate & (o_out < candidate_capacity)
    tl.store(p_pos + o_out, o_s, mask=m_out)
    tl.store(p_bits + o_out, x.to(tl.int32, bitcast=True), mask=m_out)


@triton.jit
def append_lane_tiles(x_a, x_b, o_a, o_b, m_a, m_b, threshold, p_counter, p_pos, p_bits,
                      candidate_capacity):
    """Append the candidates of two [LANES, 4] tiles (scores x_a, x_b at positions o_a, o_b:
    [LANES] row starts; m_a, m_b: [LANES, 4] in-bounds masks). Each thread counts its own 8
    scores and reserves room with its own atomic add (ptxas merges the warp's into one add and
    a 5-step shuffle scan); its offsets are a running sum over its 8 scores. No tl.cumsum: its
    result layout cost shared-memory round trips of the 64-bit store addresses."""
    a0, a1, a2, a3 = columns(x_a)
    b0, b1, b2, b3 = columns(x_b)
    ma0, ma1, ma2, ma3 = columns(m_a & (x_a >= threshold))
    mb0, mb1, mb2, mb3 = columns(m_b & (x_b >= threshold))
    num_candidates = (ma0.to(tl.int32) + ma1.to(tl.int32) + ma2.to(tl.int32)
                      + ma3.to(tl.int32) + mb0.to(tl.int32) + mb1.to(tl.int32)
                      + mb2.to(tl.int32) + mb3.to(tl.int32))
    if tl.max(num_candidates, 0) > 0:
        o_out = tl.atomic_add(p_counter + tl.zeros_like(num_candidates), num_candidates,
                              mask=num_candidates > 0, sem="relaxed")
        store_column(a0, o_a, ma0, o_out, p_pos, p_bits, candidate_capacity)
        o_out += ma0.to(tl.int32)
        store_column(a1, o_a + 1, ma1, o_out, p_pos, p_bits, candidate_capacity)
        o_out += ma1.to(tl.int32)
        store_column(a2, o_a + 2, ma2, o_out, p_pos, p_bits, candidate_capacity)
        o_out += ma2.to(tl.int32)
        store_column(a3, o_a + 3, ma3, o_out, p_pos, p_bits, candidate_capacity)
        o_out += ma3.to(tl.int32)
        store_column(b0, o_b, mb0, o_out, p_pos, p_bits, candidate_capacity)
        o_out += mb0.to(tl.int32)
        store_column(b1, o_b + 1, mb1, o_out, p_pos, p_bits, candidate_capacity)
        o_out += mb1.to(tl.int32)
        store_column(b2, o_b + 2, mb2, o_out, p_pos, p_bits, candidate_capacity)
        o_out += mb2.to(tl.int32)
        store_column(b3, o_b + 3, mb3, o_out, p_pos, p_bits, candidate_capacity)


@triton.jit
def topk_lane_collect_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_bits_ptr,
    # sizes and strides
    chunk_size, stride_scores_row, candidate_capacity,
    # meta-parameters
    LANES: tl.constexpr,  # threads of the program: 32 num_warps
    STAGES: tl.constexpr,
):
    """topk_warp_collect_kernel's result in ~1/3 of its instructions per score (sm_90 SASS:
    ~100 per 256 scores with candidates, ~40 without; 48 registers): each iteration filters
    two [LANES, 4] tiles (16 bytes per thread each, loads pipelined STAGES iterations deep),
    one atomic add per thread with candidates (one per warp after ptxas merges them).
    chunk_size is a multiple of 8 LANES."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    threshold = score_of_key(tl.load(threshold_ptr + i_row))
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_counter = counter_ptr + i_row
    o_row_buffer = i_row.to(tl.int64) * candidate_capacity
    p_pos = candidate_pos_ptr + o_row_buffer
    p_bits = candidate_bits_ptr + o_row_buffer
    TILE: tl.constexpr = LANES * 4
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    num_full = tl.maximum(end - start, 0) // (2 * TILE)
    o_lane = tl.arange(0, LANES) * 4  # the first position of each thread's row, in a tile
    o_t = o_lane[:, None] + tl.arange(0, 4)[None, :]
    is_all = o_t >= 0
    for i_pair in tl.range(0, num_full, num_stages=STAGES):
        o_a = start + i_pair * (2 * TILE)
        x_a = tl.load(p_row + o_a + o_t)
        x_b = tl.load(p_row + o_a + TILE + o_t)
        append_lane_tiles(x_a, x_b, o_a + o_lane, o_a + TILE + o_lane, is_all, is_all,
                          threshold, p_counter, p_pos, p_bits, candidate_capacity)
    o_a = start + num_full * (2 * TILE)
    if o_a < end:
        m_a = o_a + o_t < end
        m_b = o_a + TILE + o_t < end
        x_a = tl.load(p_row + o_a + o_t, mask=m_a, other=0.0)
        x_b = tl.load(p_row + o_a + TILE + o_t, mask=m_b, other=0.0)
        append_lane_tiles(x_a, x_b, o_a + o_lane, o_a + TILE + o_lane, m_a, m_b, threshold,
                          p_counter, p_pos, p_bits, candidate_capacity)
