"""Top-k stages 1 and 2: strided group maxima, then the candidates at or above a threshold.

Scores become int32 keys that order like the floats (signed comparison). A row's positions
fall into NUM_GROUPS strided groups, group g = {p : p % NUM_GROUPS == g}. With NUM_GROUPS >=
2 k, the need-th largest group maximum T0 is a key that at least `need` distinct positions
reach, so every one of the k best is >= T0, and few others are (about 1.4 k for scores in
random order). Strided groups keep that true for rows of any length (a row of length >= need
fills >= need groups) and for scores that rise or fall with the position.

  1. topk_group_max_kernel: several programs per row; each keeps a running maximum per group
     over its chunk in registers (no reductions, no atomics) and writes it out;
  2. topk_collect_kernel: each program merges its row's per-chunk maxima, bisects them for T0
     (the same T0 in every program of the row) and appends the positions and keys >= T0 of its
     chunk to the row's candidate buffer, one atomic add per tile to reserve room.
"""

import triton
import triton.language as tl

# Below the key of every score (-inf is -2139095041): marks "no position".
KEY_NONE = tl.constexpr(-2147483648)


@triton.jit
def orderable_key(x):
    """fp32 -> int32 that orders like the floats (signed); -0.0 is made +0.0 (§9 #6)."""
    x = tl.where(x == 0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 2147483647)


@triton.jit
def load_tile(p_row, o_s, m_s, is_full):
    """Scores at o_s; a full tile loads without a mask, so the loads can be 16 bytes wide."""
    if is_full:
        x = tl.load(p_row + o_s)
    else:
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
    return x


@triton.jit
def kth_largest_key(b_key, need):
    """The largest x with count(b_key >= x) >= need (KEY_NONE when need exceeds the keys)."""
    biased = b_key.to(tl.int64) + 2147483648  # in [0, 2^32): bisection on non-negatives
    low = tl.zeros((), tl.int64)
    high = tl.full((), 4294967296, tl.int64)
    while high - low > 1:
        middle = (low + high) // 2
        count = tl.sum((biased >= middle).to(tl.int32))
        if count >= need:
            low = middle
        else:
            high = middle
    return (low - 2147483648).to(tl.int32)


@triton.jit
def topk_group_max_kernel(
    # pointers
    scores_ptr, lengths_ptr, partial_max_ptr, counter_ptr,
    # sizes and strides
    chunk_size, num_chunks, stride_scores_row,
    # meta-parameters
    NUM_GROUPS: tl.constexpr,
):
    """partial_max[row, chunk, g] = max key of group g within the chunk (KEY_NONE if none);
    also zeroes the row's candidate counter for stage 2."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    if i_chunk == 0:
        tl.store(counter_ptr + i_row, 0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    # chunk_size is a multiple of NUM_GROUPS, so lane g of every tile is group g.
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    o_g = tl.arange(0, NUM_GROUPS)
    b_max = tl.full((NUM_GROUPS,), KEY_NONE, tl.int32)
    for tile in range(start, end, NUM_GROUPS):
        o_s = tile + o_g
        m_s = o_s < end
        key = orderable_key(load_tile(p_row, o_s, m_s, tile + NUM_GROUPS <= end))
        b_max = tl.maximum(b_max, tl.where(m_s, key, KEY_NONE))
    o_partial = (i_row.to(tl.int64) * num_chunks + i_chunk) * NUM_GROUPS
    tl.store(partial_max_ptr + o_partial + o_g, b_max)


@triton.jit
def topk_collect_kernel(
    # pointers
    scores_ptr, lengths_ptr, partial_max_ptr, counter_ptr, threshold_ptr,
    candidate_pos_ptr, candidate_key_ptr,
    # sizes and strides
    k, chunk_size, num_chunks, stride_scores_row, candidate_capacity,
    # meta-parameters
    NUM_GROUPS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Positions and keys >= T0 of the chunk -> the row's candidate buffer (in any order);
    counter[row] ends as the row's number of candidates (it may exceed the capacity: then
    only the first `candidate_capacity` are stored) and threshold[row] = T0."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    o_g = tl.arange(0, NUM_GROUPS)
    p_partial = partial_max_ptr + i_row.to(tl.int64) * num_chunks * NUM_GROUPS
    b_max = tl.full((NUM_GROUPS,), KEY_NONE, tl.int32)
    for i_part in range(0, num_chunks):
        b_max = tl.maximum(b_max, tl.load(p_partial + i_part * NUM_GROUPS + o_g))
    threshold = kth_largest_key(b_max, need)
    if i_chunk == 0:
        tl.store(threshold_ptr + i_row, threshold)

    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_counter = counter_ptr + i_row
    o_row_buffer = i_row.to(tl.int64) * candidate_capacity
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    for tile in range(start, end, BLOCK):
        o_s = tile + tl.arange(0, BLOCK)
        m_s = o_s < end
        key = orderable_key(load_tile(p_row, o_s, m_s, tile + BLOCK <= end))
        is_candidate = m_s & (key >= threshold)
        num_candidates = tl.sum(is_candidate.to(tl.int32))
        if num_candidates > 0:
            base = tl.atomic_add(p_counter, num_candidates, sem="relaxed")
            o_out = base + tl.cumsum(is_candidate.to(tl.int32), 0) - 1
            m_out = is_candidate & (o_out < candidate_capacity)
            tl.store(candidate_pos_ptr + o_row_buffer + o_out, o_s, mask=m_out)
            tl.store(candidate_key_ptr + o_row_buffer + o_out, key, mask=m_out)


def num_groups_for(k_pad: int) -> int:
    """Strided groups per row: twice the padded k keeps the candidates near 1.4 k."""
    return 2 * k_pad


def chunking(num_positions: int, num_groups: int, programs_per_row: int) -> tuple[int, int]:
    """(chunk_size, num_chunks): chunks are whole multiples of num_groups positions."""
    num_tiles = max(1, triton.cdiv(num_positions, num_groups))
    num_chunks = min(num_tiles, max(1, programs_per_row))
    chunk_size = triton.cdiv(num_tiles, num_chunks) * num_groups
    return chunk_size, max(1, triton.cdiv(num_positions, chunk_size))
