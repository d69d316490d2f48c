"""Top-k stage 3 in one launch: the overflow rescan where needed, then one sort per row.

topk_sort_finish_kernel (one program per row) does topk_overflow_kernel's and
topk_finish_kernel's jobs: a row whose candidates overflowed its buffer first rescans its
row for its need best (collect_best_of_row, the rare case); then the row's candidates (all
of them, at most CAPACITY) are sorted in one tl.sort by (higher key, then lower position) and
the first k written. The finish kernel's boundary search (a many-way search over the keys:
several dependent histogram rounds) and its compaction through scratch memory are gone: the
sort is over CAPACITY (2 k) entries instead of k, and the overflow check is no launch of its
own.
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.topk_collect import orderable_key
from atomk31.triton_kernels.topk_finish import collect_best_of_row

# Sorts after every candidate: below (KEY_NONE << 32).
COMPOSITE_NONE = tl.constexpr(-9223372036854775808)


@triton.jit
def topk_sort_finish_kernel(
    # pointers
    scores_ptr, lengths_ptr, counter_ptr, threshold_ptr, candidate_pos_ptr, candidate_bits_ptr,
    block_table_ptr, row_request_ptr, out_ptr,
    # sizes and strides
    k, stride_scores_row, max_blocks, stride_table_row,
    # meta-parameters
    CAPACITY: tl.constexpr,  # candidates per row in the buffer, a power of two >= k
    BLOCK: tl.constexpr,  # positions per tile of the overflow rescan
    WRITE_SLOTS: tl.constexpr,
    BLOCK_SHIFT: tl.constexpr,  # block_size = 2^BLOCK_SHIFT
    RESCAN: tl.constexpr,  # else topk_overflow_kernel ran before: no row overflows here
):
    """out[row, :k] = the row's k best positions (or cache slots), best first, -1 padded.
    RESCAN: an overflowing row is rescanned here (gfx950 spills scalar registers with it and
    the slot mapping in one kernel: there topk_overflow_kernel runs first instead)."""
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    num_candidates = tl.load(counter_ptr + i_row)
    p_pos = candidate_pos_ptr + i_row.to(tl.int64) * CAPACITY
    p_bits = candidate_bits_ptr + i_row.to(tl.int64) * CAPACITY
    if RESCAN and num_candidates > CAPACITY:  # many equal scores: the need best, in order
        collect_best_of_row(scores_ptr + i_row.to(tl.int64) * stride_scores_row, p_pos, p_bits,
                            length, need, tl.load(threshold_ptr + i_row), BLOCK)
        num_candidates = need
        tl.debug_barrier()  # the buffer written above is read back by other threads below
    o_c = tl.arange(0, CAPACITY)
    m_c = o_c < num_candidates
    position = tl.load(p_pos + o_c, mask=m_c, other=0)
    key = orderable_key(tl.load(p_bits + o_c, mask=m_c, other=0).to(tl.float32, bitcast=True))
    # One int64 per candidate, (key, lower position first) in descending order: position
    # < 2^31.
    composite = (key.to(tl.int64) << 32) | (2147483647 - position).to(tl.int64)
    composite = tl.sort(tl.where(m_c, composite, COMPOSITE_NONE), 0, descending=True)
    out = tl.where(o_c < need, (2147483647 - (composite & 2147483647)).to(tl.int32), -1)
    if WRITE_SLOTS:
        # block_size = 2^BLOCK_SHIFT: shifts, not divisions.
        p_request = row_request_ptr + i_row  # a vector load: frees scalar registers (AMD)
        request = tl.load(p_request + tl.zeros_like(o_c)).to(tl.int64)
        column = out >> BLOCK_SHIFT
        block = tl.load(block_table_ptr + request * stride_table_row + column,
                        mask=(out >= 0) & (column < max_blocks), other=-1)
        offset = out & ((1 << BLOCK_SHIFT) - 1)
        out = tl.where(block >= 0, (block << BLOCK_SHIFT) + offset, -1)
    tl.store(out_ptr + i_row.to(tl.int64) * k + o_c, out, mask=o_c < k)  # out: [Nq, k]
