"""Top-k stage 1: strided group maxima, the threshold T0 (and the key helpers the finish
shares).

Scores become int32 keys that order like the floats (signed comparison). A row's positions
fall into NUM_GROUPS strided groups, group g = {p : p % NUM_GROUPS == g}. With NUM_GROUPS >=
2 k, the need-th largest group maximum T0 is a key that at least `need` distinct positions
reach, so every one of the k best is >= T0, and few others are (about 1.4 k for scores in
random order). Strided groups keep that true for rows of any length (a row of length >= need
fills >= need groups) and for scores that rise or fall with the position.

  1. topk_group_max_kernel: several programs per row; each keeps a running maximum per group
     over its chunk in registers (no reductions, no atomics) and writes it out;
  1b. topk_threshold_kernel: one program per row merges the per-chunk maxima and finds T0
     once (a many-way search: few dependent block reductions, see kth_largest_key).
Stage 2, the candidates >= T0: topk_staged_collect.py.
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
def score_of_key(key):
    """The fp32 score whose orderable key is `key` (the inverse of orderable_key)."""
    bits = key ^ ((key >> 31) & 2147483647)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def load_tile(p_row, o_s, m_s, is_full):
    """Scores at o_s; a full tile loads without a mask, so the loads can be 16 bytes wide."""
    if is_full:
        x = tl.load(p_row + o_s)
    else:
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
    return x


@triton.jit
def kth_largest_key(b_key, need, low, top, WAYS: tl.constexpr, BINS: tl.constexpr,
                    SLACK: tl.constexpr = -1):
    """The largest x with count(b_key >= x) >= need, given a `low` with count(b_key >= low)
    >= need (the smallest key of interest: the closer, the fewer rounds) and `top` >= every
    key (the largest: a reduction the caller may know the answer of).
    With SLACK >= 0 it may stop early at any x with need <= count(b_key >= x) <= need +
    SLACK (a lower bound of the answer that is good enough for a threshold; 0: a key the
    `need` best reach exactly, which tells the same selection as the answer; -1: exact).

    A WAYS-way search: each round splits the interval into WAYS bins of 2^shift keys, counts
    the keys per bin with one histogram and keeps the bin that holds the answer, so a range
    of 2^n keys takes n / log2(WAYS) rounds (a bisection would take 32 dependent block
    reductions), and no [keys, WAYS] comparison is held in registers.
    A round is one masked histogram (keys below `low` left out: bin j's edge is low + j
    2^shift, so WAYS edges need only WAYS bins), one reverse cumulative sum (keys >= each
    edge) and ONE reduction that finds the last edge `need` keys reach together with its
    count (packed count * BINS + (BINS - 1 - j): the smallest count >= need, the highest
    edge among equal ones), the per-key arithmetic in 32 bits: each block reduction is a
    barrier, and the search is latency-bound on them.
    """
    # Invariant: count(b_key >= low) >= need > count(b_key >= high), and count_low >=
    # count(b_key >= low) (a bound until the first round). int64 bounds: the interval can
    # be 2^32 wide.
    low = low.to(tl.int64)
    high = top.to(tl.int64) + 1
    count_low = tl.full((), 1073741824, tl.int32)
    o_bin = tl.arange(0, BINS)
    while (high - low > 1) & (count_low > need + SLACK):
        shift = tl.zeros((), tl.int64)  # the smallest with WAYS 2^shift >= high - low
        while (tl.full((), WAYS, tl.int64) << shift) < high - low:
            shift += 1
        # Per key in 32 bits (int64 doubled the round's instructions): key - low modulo
        # 2^32 is exact for the keys >= low; the keys below are left out by the mask.
        low_key = low.to(tl.int32)
        offset = b_key.to(tl.uint32, bitcast=True) - low_key.to(tl.uint32, bitcast=True)
        bucket = tl.minimum(offset >> shift.to(tl.uint32), WAYS - 1).to(tl.int32)
        histogram = tl.histogram(bucket, BINS, mask=b_key >= low_key)
        count = tl.cumsum(histogram, 0, reverse=True)  # keys >= low + j 2^shift
        packed = count * BINS + (BINS - 1 - o_bin)
        best = tl.min(tl.where(count >= need, packed, 2147483647), 0)
        edge = (BINS - 1 - best % BINS).to(tl.int64)
        count_low = best // BINS
        high = tl.minimum(high, low + ((edge + 1) << shift))
        low = low + (edge << shift)
    return low.to(tl.int32)


@triton.jit
def topk_group_max_kernel(
    # pointers
    scores_ptr, lengths_ptr, partial_max_ptr, counter_ptr, bitmap_ptr, threshold_ptr,
    # sizes and strides
    k, chunk_size, num_chunks, stride_scores_row, num_words, words_per_row,
    # meta-parameters
    NUM_GROUPS: tl.constexpr, STAGES: tl.constexpr,
    # One program per row (num_chunks = 1): stage 2's threshold here, no partial maxima.
    THRESHOLD: tl.constexpr = False, WAYS: tl.constexpr = 64, BINS: tl.constexpr = 64,
    SLACK: tl.constexpr = -1,
):
    """partial_max[row, chunk, g] = max key of group g within the chunk (KEY_NONE if none);
    also zeroes the row's candidate counter for stage 2 and the chunk's words of the row's
    bitmap (one bit per position, num_words = cdiv(L, 32)) for the finish. The maxima are
    taken on the fp32 scores (one max per score, the keys of the maxima at the end: the key
    orders like the float, and -0.0 / +0.0 give one key). STAGES > 1: the full tiles' loads
    software pipelined that many tiles deep (cp.async into shared memory on NVIDIA), then the
    tail; 1: every tile through the tail's loop. THRESHOLD (one program per row): the row's
    threshold (topk_threshold_kernel's output) from the maxima in registers instead."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    if i_chunk == 0:
        tl.store(counter_ptr + i_row, 0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    # chunk_size is a multiple of NUM_GROUPS, so lane g of every tile is group g, and group g
    # has a position in the chunk iff its first one, start + g, is before the end.
    start = i_chunk * chunk_size
    o_g = tl.arange(0, NUM_GROUPS)
    # The chunk's bitmap words (NUM_GROUPS >= 32 divides chunk_size: whole words), whatever
    # the row's length: the finish reads the words of positions < length.
    p_bitmap = bitmap_ptr + i_row.to(tl.int64) * words_per_row
    word_end = tl.minimum((start + chunk_size) // 32, num_words)
    for word in range(start // 32, word_end, NUM_GROUPS):
        tl.store(p_bitmap + word + o_g, tl.zeros((NUM_GROUPS,), tl.int32),
                 mask=word + o_g < word_end)
    end = tl.minimum(start + chunk_size, length)
    is_nonempty = start + o_g < end
    b_max = tl.full((NUM_GROUPS,), float("-inf"), tl.float32)
    if STAGES > 1:
        num_full = tl.maximum(end - start, 0) // NUM_GROUPS
        p_chunk = p_row + start
        for i_tile in tl.range(0, num_full, num_stages=STAGES):
            b_max = tl.maximum(b_max, tl.load(p_chunk + i_tile * NUM_GROUPS + o_g))
        start += num_full * NUM_GROUPS
    for tile in range(start, end, NUM_GROUPS):
        o_s = tile + o_g
        m_s = o_s < end
        if tile + NUM_GROUPS <= end:  # unmasked: 16-byte loads
            b_max = tl.maximum(b_max, tl.load(p_row + o_s))
        else:
            b_max = tl.maximum(b_max, tl.load(p_row + o_s, mask=m_s, other=float("-inf")))
    key = tl.where(is_nonempty, orderable_key(b_max), KEY_NONE)
    if THRESHOLD:
        store_threshold(key, k, length, threshold_ptr, i_row, tl.num_programs(0), WAYS, BINS,
                        SLACK)
    else:
        o_partial = (i_row.to(tl.int64) * num_chunks + i_chunk) * NUM_GROUPS
        tl.store(partial_max_ptr + o_partial + o_g, key)


@triton.jit
def store_threshold(b_max, k, length, threshold_ptr, i_row, num_rows, WAYS: tl.constexpr,
                    BINS: tl.constexpr, SLACK: tl.constexpr):
    """threshold[row] = T0 from the row's group maxima (keys, KEY_NONE for empty groups) and
    threshold[num_rows + row] = the row's largest key (see topk_threshold_kernel)."""
    need = tl.maximum(tl.minimum(k, length), 1)  # an empty row collects nothing anyway
    # The search starts at the smallest maximum of a nonempty group: with SLACK it may stop
    # there, and KEY_NONE is no score (an empty row: 2^31 - 1, which no score reaches).
    low = tl.min(tl.where(b_max != KEY_NONE, b_max, 2147483647), 0)
    top = tl.max(b_max, 0)
    tl.store(threshold_ptr + num_rows + i_row, top)
    tl.store(threshold_ptr + i_row,
             kth_largest_key(b_max, need, low, top, WAYS, BINS, SLACK))


@triton.jit
def topk_threshold_kernel(
    # pointers
    partial_max_ptr, lengths_ptr, threshold_ptr,
    # sizes
    k, num_chunks,
    # meta-parameters
    NUM_GROUPS: tl.constexpr, WAYS: tl.constexpr, BINS: tl.constexpr, PARTS: tl.constexpr,
    SLACK: tl.constexpr,
):
    """threshold[row] = T0, the need-th largest group maximum of the row (and threshold[Nq +
    row] = the row's largest key, for the finish's search), or with SLACK >= 0
    any key that between need and need + SLACK group maxima reach (fewer search rounds, at
    most SLACK more maxima among the candidates; -1: exact). PARTS > 1 loads
    that many chunks' maxima per iteration (with one load in flight per chunk the kernel
    waits num_chunks dependent round trips); PARTS = 1 loads one chunk at a time."""
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    o_g = tl.arange(0, NUM_GROUPS)
    p_partial = partial_max_ptr + i_row.to(tl.int64) * num_chunks * NUM_GROUPS
    b_max = tl.full((NUM_GROUPS,), KEY_NONE, tl.int32)
    if PARTS == 1:
        for i_part in range(0, num_chunks):
            b_max = tl.maximum(b_max, tl.load(p_partial + i_part * NUM_GROUPS + o_g))
    else:
        o_p = tl.arange(0, PARTS)
        for i_part in range(0, num_chunks, PARTS):
            m_p = (i_part + o_p) < num_chunks
            b_part = tl.load(p_partial + (i_part + o_p)[:, None] * NUM_GROUPS + o_g[None, :],
                             mask=m_p[:, None], other=KEY_NONE)
            b_max = tl.maximum(b_max, tl.max(b_part, 0))
    store_threshold(b_max, k, length, threshold_ptr, i_row, tl.num_programs(0), WAYS, BINS,
                    SLACK)


def histogram_bins(ways: int) -> int:
    """Bins of kth_largest_key's histogram: WAYS used, padded to a power of two that is a
    multiple of every warp size (32 on NVIDIA, 64 on AMD)."""
    return max(64, ways)


def num_groups_for(k_pad: int) -> int:
    """Strided groups per row: twice the padded k keeps the candidates near 1.4 k."""
    return 2 * k_pad


def chunking(num_positions: int, tile: int, programs_per_row: int) -> tuple[int, int]:
    """(chunk_size, num_chunks) of a row split among programs_per_row programs (fewer if the
    row has fewer tiles): chunks are whole multiples of `tile` positions (stage 1: NUM_GROUPS;
    the collect: its tile)."""
    num_tiles = max(1, triton.cdiv(num_positions, tile))
    num_chunks = min(num_tiles, max(1, programs_per_row))
    chunk_size = triton.cdiv(num_tiles, num_chunks) * tile
    return chunk_size, max(1, triton.cdiv(num_positions, chunk_size))

