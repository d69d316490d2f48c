"""Top-k stage 3: the candidates of a row ranked and written as positions or cache slots.

Usual case (the row's candidates fit the buffer): every candidate is >= T0 and every position
outside the buffer is below T0, so the candidates ranked by (higher key, then lower position)
start with the row's answer (§4.6, §8 #6).

  3a. topk_overflow_kernel, one program per row, for the rare row whose candidates overflowed
     the buffer (many equal scores, e.g. all equal or a -inf tail; or group maxima that say
     little): it rescans the row for the cut key T, the need-th largest key (T = T0 at once
     when fewer than need keys exceed T0, the tied case; else by bisection over the row, slow
     but exact), and writes the keys > T and the lowest positions with key == T, `need` of
     them, into the buffer. Other rows return at once.
  3b. topk_finish_kernel, SPLIT programs per row: program s owns the ranks [s R, (s + 1) R).
     It finds the candidates at its two boundary ranks by a many-way search on the keys
     (then on the positions among equal keys), keeps the R candidates between them, sorts
     only those and writes its slice of the output.
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
def topk_overflow_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_key_ptr,
    # sizes and strides
    k, stride_scores_row,
    # meta-parameters
    CAPACITY: tl.constexpr, BLOCK: tl.constexpr,
):
    """A row with more candidates than the buffer holds: its need best into the buffer, and
    counter[row] = need."""
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
def candidate_at_rank(key, position, is_valid, key_low, rank, WAYS: tl.constexpr,
                      BINS: tl.constexpr):
    """(key, position) of the candidate of 0-based `rank` in the order higher key first, then
    lower position; rank < the number of valid candidates (invalid ones hold KEY_NONE), whose
    smallest key is key_low."""
    key_at = kth_largest_key(key, rank + 1, key_low, WAYS, BINS)
    num_above = tl.sum((key > key_at).to(tl.int32))
    is_tie = is_valid & (key == key_at)
    num_ties = tl.sum(is_tie.to(tl.int32))
    if num_ties == 1:  # distinct keys, the usual case: no second search
        position_at = tl.max(tl.where(is_tie, position, -1))
    else:  # the (rank - num_above)-th lowest tied position: the largest of the negated ones
        negated = tl.where(is_tie, -position, KEY_NONE)
        negated_low = tl.min(tl.where(is_tie, -position, 0))  # -(the highest tied position)
        position_at = -kth_largest_key(negated, rank - num_above + 1, negated_low, WAYS,
                                       BINS)
    return key_at, position_at


@triton.jit
def topk_finish_kernel(
    # pointers
    lengths_ptr, counter_ptr, candidate_pos_ptr, candidate_key_ptr, selected_ptr,
    block_table_ptr, row_request_ptr, out_ptr,
    # sizes and strides
    k, max_blocks, block_shift, stride_table_row,
    # meta-parameters
    CAPACITY: tl.constexpr,  # candidates per row in the buffer, a power of two >= k
    SLICE: tl.constexpr,  # output ranks per program, a power of two
    WAYS: tl.constexpr, BINS: tl.constexpr, WRITE_SLOTS: tl.constexpr,
):
    i_row = tl.program_id(0)
    i_slice = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    num_candidates = tl.load(counter_ptr + i_row)  # <= CAPACITY after topk_overflow_kernel
    o_c = tl.arange(0, CAPACITY)
    m_c = o_c < num_candidates
    position = tl.load(candidate_pos_ptr + i_row.to(tl.int64) * CAPACITY + o_c, mask=m_c,
                       other=0)
    bits = tl.load(candidate_key_ptr + i_row.to(tl.int64) * CAPACITY + o_c, mask=m_c, other=0)
    key = tl.where(m_c, orderable_key(bits.to(tl.float32, bitcast=True)), KEY_NONE)
    # This program's ranks [first, last): the candidates at or after rank `first` and
    # before rank `last`.
    first = i_slice * SLICE
    last = tl.minimum(first + SLICE, need)
    is_chosen = o_c < tl.where(first < last, num_candidates, 0)  # none past the row's need
    if first < last:
        key_low = tl.min(tl.where(m_c, key, 2147483647))
        if first > 0:
            key_first, position_first = candidate_at_rank(
                key, position, m_c, key_low, first, WAYS, BINS)
            is_chosen = is_chosen & ((key < key_first)
                                     | ((key == key_first) & (position >= position_first)))
        if last < num_candidates:
            key_last, position_last = candidate_at_rank(
                key, position, m_c, key_low, last, WAYS, BINS)
            is_chosen = is_chosen & ((key > key_last)
                                     | ((key == key_last) & (position < position_last)))
    # Compact the chosen through this program's scratch slice, then sort them by
    # (key, lower position first) in one int64: position < 2^31.
    composite = (key.to(tl.int64) << 32) | (2147483647 - position).to(tl.int64)
    p_selected = selected_ptr + (i_row.to(tl.int64) * tl.num_programs(1) + i_slice) * SLICE
    o_out = tl.cumsum(is_chosen.to(tl.int32), 0) - 1
    tl.store(p_selected + o_out, composite, mask=is_chosen & (o_out < SLICE))  # <= SLICE chosen
    tl.debug_barrier()  # the slice written above is read back by other threads below
    o_r = tl.arange(0, SLICE)
    m_r = o_r < last - first
    composite = tl.load(p_selected + o_r, mask=m_r, other=-9223372036854775808)
    composite = tl.sort(composite, 0, descending=True)
    out = tl.where(m_r, (2147483647 - (composite & 2147483647)).to(tl.int32), -1)
    if WRITE_SLOTS:
        # block_size = 2^block_shift: shifts, not divisions by a run-time value.
        p_request = row_request_ptr + i_row  # a vector load: frees scalar registers (AMD)
        request = tl.load(p_request + tl.zeros_like(o_r)).to(tl.int64)
        column = out >> block_shift
        block = tl.load(block_table_ptr + request * stride_table_row + column,
                        mask=(out >= 0) & (column < max_blocks), other=-1)
        offset = out & ((1 << block_shift) - 1)
        out = tl.where(block >= 0, (block << block_shift) + offset, -1)
    o_col = first + o_r
    tl.store(out_ptr + i_row.to(tl.int64) * k + o_col, out, mask=o_col < k)  # out: [Nq, k]
