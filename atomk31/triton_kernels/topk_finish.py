"""Top-k stage 3: a row's best candidates written in position order, as positions or slots.

Usual case (the row's candidates fit the buffer): every candidate is >= T0 and every position
outside the buffer is below T0, so the row's answer is the best `need` of its candidates by
(higher key, then lower position) (§4.6, §8 #6).

  3a. topk_overflow_kernel, one program per row, for the rare row whose candidates overflowed
     the buffer (many equal scores, e.g. all equal or a -inf tail; or group maxima that say
     little): it rescans the row for the cut key T, the need-th largest key (T = T0 at once
     when fewer than need keys exceed T0, the tied case; else by bisection over the row, slow
     but exact), and writes the keys > T and the lowest positions with key == T, `need` of
     them, into the buffer. Other rows return at once.
  3b. topk_finish_kernel, one program per row: the exact cut among the candidates (the
     need-th largest key T by a many-way search; keys > T all in, keys == T the lowest
     positions), then the selected positions written in ascending order through a bitmap
     and a prefix sum of its words' popcounts: no sort (the output's order is positions, see
     `atomk31.ops.topk`).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import (
    KEY_NONE,
    kth_largest_key,
    load_tile,
    orderable_key,
)


@triton.jit
def count_keys_at_least(p_row, length, key_at_least, BLOCK: tl.constexpr):
    """Number of positions < length whose key is >= key_at_least."""
    total = tl.zeros((), tl.int32)
    for start in range(0, length, BLOCK):
        o_s = start + tl.arange(0, BLOCK)
        m_s = o_s < length
        key = orderable_key(load_tile(p_row, o_s, m_s, start + BLOCK <= length))
        total += tl.sum((m_s & (key >= key_at_least)).to(tl.int32))
    return total


@triton.jit
def collect_best_of_row(p_row, p_pos, p_key, length, need, threshold, BLOCK: tl.constexpr):
    """Write the row's need best (position, key) to the buffer, in position order."""
    # The cut T: count(key > T) < need <= count(key >= T). int32 throughout: no score has
    # the key 2^31 - 1 (a NaN), so count(key >= 2^31 - 1) = 0.
    num_above = count_keys_at_least(p_row, length, threshold + 1, BLOCK)
    cut = threshold
    num_above_cut = num_above
    if num_above >= need:
        low = threshold + 1  # count(key >= low) >= need
        high = tl.full((), 2147483647, tl.int32)  # count(key >= high) < need
        count_high = tl.zeros((), tl.int32)
        while high - 1 > low:  # no overflow: high - 1 >= 0 > low - 2^31
            middle = (low >> 1) + (high >> 1) + (low & high & 1)  # floor((low + high) / 2)
            count = count_keys_at_least(p_row, length, middle, BLOCK)
            if count >= need:
                low = middle
            else:
                high = middle
                count_high = count
        cut = low
        num_above_cut = count_high
    num_ties = need - num_above_cut  # the lowest positions among keys == T (§8 #6)
    cursor = tl.zeros((), tl.int32)
    ties_seen = tl.zeros((), tl.int32)
    start = tl.zeros((), tl.int32)
    while (start < length) & (cursor < need):
        o_s = start + tl.arange(0, BLOCK)
        m_s = o_s < length
        x = load_tile(p_row, o_s, m_s, start + BLOCK <= length)
        key = orderable_key(x)
        is_tie = m_s & (key == cut)
        tie_rank = ties_seen + tl.cumsum(is_tie.to(tl.int32), 0) - 1
        is_chosen = (m_s & (key > cut)) | (is_tie & (tie_rank < num_ties))
        o_out = cursor + tl.cumsum(is_chosen.to(tl.int32), 0) - 1
        tl.store(p_pos + o_out, o_s, mask=is_chosen)
        tl.store(p_key + o_out, x.to(tl.int32, bitcast=True), mask=is_chosen)
        cursor += tl.sum(is_chosen.to(tl.int32))
        ties_seen += tl.sum(is_tie.to(tl.int32))
        start += BLOCK


@triton.jit
def popcount(word):
    """Set bits of each int32 word: SWAR bit tricks (portable to HIP, exact under the
    interpreter; no multiply, so no wrap-around for numpy to warn about)."""
    x = word.to(tl.uint32, bitcast=True)
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    return (x & 63).to(tl.int32)


@triton.jit
def cut_of_candidates(key, position, is_valid, need, threshold, top, WAYS: tl.constexpr,
                      BINS: tl.constexpr):
    """(key_cut, position_cut): the `need` best candidates (higher key, then lower position;
    need <= the number of valid ones, whose keys are > KEY_NONE) are those with key > key_cut
    and those with key == key_cut at positions <= position_cut (§8 #6). key_cut is the need-th
    largest key or (the search stops as soon as it finds one) a key that exactly the need
    best reach; position_cut is 2^31 - 1 when every tie at it is taken. The key search
    starts from [threshold, top] (T0 <= every candidate, the row's largest key >= every one:
    no reductions before its first round)."""
    # SLACK 0: stop at any x with count(key >= x) == need; then the keys >= x are the answer
    # (no tie is left out), as they are above and at the exact need-th largest key.
    key_cut = kth_largest_key(key, need, threshold, top, WAYS, BINS, 0)
    is_tie = is_valid & (key == key_cut)
    # Both counts from one reduction (each < 2^16: CAPACITY <= 16384).
    packed = tl.sum((key > key_cut).to(tl.int32) + (is_tie.to(tl.int32) << 16), 0)
    num_ties_wanted = need - (packed & 65535)
    position_cut = tl.full((), 2147483647, tl.int32)
    if (packed >> 16) > num_ties_wanted:
        # The num_ties_wanted-th lowest tied position: the largest of the negated ones.
        negated = tl.where(is_tie, -position, KEY_NONE)
        negated_low = tl.min(tl.where(is_tie, -position, 0), 0)  # -(highest tied position)
        position_cut = -kth_largest_key(negated, num_ties_wanted, negated_low,
                                        tl.max(negated, 0), WAYS, BINS)
    return key_cut, position_cut


@triton.jit
def topk_overflow_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_key_ptr,
    # sizes and strides
    k, stride_scores_row,
    # meta-parameters
    CAPACITY: tl.constexpr, BLOCK: tl.constexpr,
):
    """A row with more candidates than the buffer holds: its need best into the buffer, and
    counter[row] = need. (Its own launch, ~1.2 us in a CUDA graph; the finish can do it
    instead with RESCAN, except on AMD, where it then spills SGPRs on gfx942 / gfx950.)"""
    i_row = tl.program_id(0)
    if tl.load(counter_ptr + i_row) > CAPACITY:
        length = tl.load(lengths_ptr + i_row).to(tl.int32)
        need = tl.minimum(k, length)
        p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
        collect_best_of_row(p_row, candidate_pos_ptr + i_row.to(tl.int64) * CAPACITY,
                            candidate_key_ptr + i_row.to(tl.int64) * CAPACITY, length, need,
                            tl.load(threshold_ptr + i_row), BLOCK)
        tl.store(counter_ptr + i_row, need)


@triton.jit
def topk_finish_kernel(
    # pointers
    lengths_ptr, counter_ptr, candidate_pos_ptr, candidate_bits_ptr, bitmap_ptr, prefix_ptr,
    block_table_ptr, row_request_ptr, out_ptr, scores_ptr, threshold_ptr,
    # sizes and strides
    k, words_per_row, max_blocks, block_shift, stride_table_row, stride_scores_row,
    # meta-parameters
    CAPACITY: tl.constexpr,  # candidates per row in the buffer, a power of two >= k
    RESCAN: tl.constexpr,  # do topk_overflow_kernel's job first (then it is not launched)
    BLOCK: tl.constexpr,  # positions per tile of that rescan
    K_PAD: tl.constexpr,  # k rounded up to a power of two
    SCAN_BLOCK: tl.constexpr,  # bitmap words per step of the prefix sum
    WAYS: tl.constexpr, BINS: tl.constexpr, WRITE_SLOTS: tl.constexpr,
):
    """One program per row: the row's `need` best candidates written in ascending position
    order (or as their cache slots), then -1 up to k. No sort: the selected positions are
    marked in the row's bitmap (one bit per position, zeroed by stage 1), the words' popcounts
    prefix-summed, and each selected candidate's output index is the number of selected
    positions before it: prefix[p >> 5] + popcount(word & ((1 << (p & 31)) - 1))."""
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    p_out = out_ptr + i_row.to(tl.int64) * k  # out: [Nq, k]
    o_k = tl.arange(0, K_PAD)
    tl.store(p_out + o_k, tl.full((K_PAD,), -1, tl.int32), mask=(o_k >= need) & (o_k < k))
    if need > 0:
        o_row_buffer = i_row.to(tl.int64) * CAPACITY
        p_pos = candidate_pos_ptr + o_row_buffer
        p_bits = candidate_bits_ptr + o_row_buffer
        o_c = tl.arange(0, CAPACITY)
        # The whole buffer, unmasked: in flight together with the counter's load (the
        # entries past the count are masked out below), the positions too (128 registers,
        # no spill on sm_90; faster than loading them after the search).
        bits = tl.load(p_bits + o_c)
        position = tl.load(p_pos + o_c)
        num_candidates = tl.load(counter_ptr + i_row)  # <= CAPACITY after the overflow stage
        threshold = tl.load(threshold_ptr + i_row)
        top = tl.load(threshold_ptr + tl.num_programs(0) + i_row)  # the row's largest key
        if RESCAN:
            if num_candidates > CAPACITY:
                collect_best_of_row(scores_ptr + i_row.to(tl.int64) * stride_scores_row,
                                    p_pos, p_bits, length, need, threshold, BLOCK)
                num_candidates = need
                tl.debug_barrier()  # the buffer written above is read by other threads below
                bits = tl.load(p_bits + o_c)
                position = tl.load(p_pos + o_c)
        m_c = o_c < num_candidates
        key = tl.where(m_c, orderable_key(bits.to(tl.float32, bitcast=True)), KEY_NONE)
        key_cut, position_cut = cut_of_candidates(key, position, m_c, need, threshold, top,
                                                  WAYS, BINS)
        is_selected = m_c & ((key > key_cut) | ((key == key_cut) & (position <= position_cut)))
        p_bitmap = bitmap_ptr + i_row.to(tl.int64) * words_per_row
        p_prefix = prefix_ptr + i_row.to(tl.int64) * words_per_row
        tl.atomic_or(p_bitmap + (position >> 5), tl.full((CAPACITY,), 1, tl.int32)
                     << (position & 31), mask=is_selected, sem="relaxed")
        # The bitmap and prefix words are read back by other threads of the program: a
        # barrier, and loads from L2 (.cg), where the atomics and stores land.
        tl.debug_barrier()
        num_words = tl.cdiv(length, 32)
        total = tl.zeros((), tl.int32)
        for start in range(0, num_words, SCAN_BLOCK):
            o_w = start + tl.arange(0, SCAN_BLOCK)
            m_w = o_w < num_words
            count = popcount(tl.load(p_bitmap + o_w, mask=m_w, other=0, cache_modifier=".cg"))
            tl.store(p_prefix + o_w, total + tl.cumsum(count, 0) - count, mask=m_w)
            total += tl.sum(count, 0)
        tl.debug_barrier()
        word_index = position >> 5
        bit = position & 31
        word = tl.load(p_bitmap + word_index, mask=is_selected, other=0, cache_modifier=".cg")
        before = tl.load(p_prefix + word_index, mask=is_selected, other=0,
                         cache_modifier=".cg")
        below_bit = (tl.full((CAPACITY,), 1, tl.uint32) << bit.to(tl.uint32)) - 1
        rank = before + popcount(word.to(tl.uint32, bitcast=True) & below_bit)
        out = position
        if WRITE_SLOTS:
            # block_size = 2^block_shift: shifts, not divisions by a run-time value.
            p_request = row_request_ptr + i_row  # a vector load: frees scalar registers (AMD)
            request = tl.load(p_request + tl.zeros_like(o_c)).to(tl.int64)
            column = position >> block_shift
            block = tl.load(block_table_ptr + request * stride_table_row + column,
                            mask=is_selected & (column < max_blocks), other=-1)
            offset = position & ((1 << block_shift) - 1)
            out = tl.where(block >= 0, (block << block_shift) + offset, -1)
        tl.store(p_out + rank, out, mask=is_selected)
