"""Top-k stage 3: one program per row ranks its candidates and writes positions or slots.

Usual case (the row's candidates fit the buffer): every candidate is >= T0 and every position
outside the buffer is below T0, so sorting the buffer by (key, lower position first) and
keeping the first `need` is the exact answer (§4.6, §8 #6). No threshold search is needed.

Overflow (more candidates than the buffer holds: many equal scores, e.g. all equal or a -inf
tail; or group maxima that say little): the program rescans its row. It finds the cut key T,
the need-th largest key (T = T0 at once when fewer than need keys exceed T0, the tied case;
else by bisection over the row, slow but exact), then collects the keys > T and the lowest
positions with key == T in position order, stopping once it has `need`, into the buffer, and
ranks those as above.
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import load_tile, orderable_key


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
        key = orderable_key(load_tile(p_row, o_s, m_s, start + BLOCK <= length))
        is_tie = m_s & (key == cut)
        tie_rank = ties_seen + tl.cumsum(is_tie.to(tl.int32), 0) - 1
        is_chosen = (m_s & (key > cut)) | (is_tie & (tie_rank < num_ties))
        o_out = cursor + tl.cumsum(is_chosen.to(tl.int32), 0) - 1
        tl.store(p_pos + o_out, o_s, mask=is_chosen)
        tl.store(p_key + o_out, key, mask=is_chosen)
        cursor += tl.sum(is_chosen.to(tl.int32))
        ties_seen += tl.sum(is_tie.to(tl.int32))
        start += BLOCK


@triton.jit
def topk_finish_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_key_ptr,
    block_table_ptr, row_request_ptr, out_ptr,
    # sizes and strides
    k, stride_scores_row, max_blocks, block_shift, stride_table_row,
    # meta-parameters
    CAPACITY: tl.constexpr,  # candidates per row in the buffer, a power of two >= k
    WRITE_SLOTS: tl.constexpr, BLOCK: tl.constexpr,
):
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    p_pos = candidate_pos_ptr + i_row.to(tl.int64) * CAPACITY
    p_key = candidate_key_ptr + i_row.to(tl.int64) * CAPACITY
    num_candidates = tl.load(counter_ptr + i_row)
    if num_candidates > CAPACITY:
        p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
        collect_best_of_row(p_row, p_pos, p_key, length, need, tl.load(threshold_ptr + i_row),
                            BLOCK)
        num_candidates = need
        tl.debug_barrier()  # the buffer written above is read back by other threads below

    # Rank by (key, lower position first) in one int64: position < 2^31.
    o_c = tl.arange(0, CAPACITY)
    m_c = o_c < num_candidates
    position = tl.load(p_pos + o_c, mask=m_c, other=0)
    key = tl.load(p_key + o_c, mask=m_c, other=0)
    composite = (key.to(tl.int64) << 32) | (2147483647 - position).to(tl.int64)
    composite = tl.where(m_c, composite, tl.full((CAPACITY,), -9223372036854775808, tl.int64))
    composite = tl.sort(composite, 0, descending=True)
    position = (2147483647 - (composite & 2147483647)).to(tl.int32)
    out = tl.where(o_c < need, position, -1)
    if WRITE_SLOTS:
        # block_size = 2^block_shift: shifts, not divisions by a run-time value.
        p_request = row_request_ptr + i_row  # a vector load: frees scalar registers (AMD)
        request = tl.load(p_request + tl.zeros_like(o_c)).to(tl.int64)
        column = out >> block_shift
        block = tl.load(block_table_ptr + request * stride_table_row + column,
                        mask=(out >= 0) & (column < max_blocks), other=-1)
        offset = out & ((1 << block_shift) - 1)
        out = tl.where(block >= 0, (block << block_shift) + offset, -1)
    tl.store(out_ptr + i_row.to(tl.int64) * k + o_c, out, mask=o_c < k)  # out: [Nq, k]
