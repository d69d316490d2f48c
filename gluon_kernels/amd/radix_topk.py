"""Gluon multi-workgroup radix top-k: the indexer's top-k selection (`topk_positions`, §4.6).

Ranking key. Each candidate ``s < lengths[i]`` of a row gets one distinct 64-bit key:
``order32(score) << 32 | (2^32 - 1 - s)``, where ``order32`` maps a float to an unsigned
integer in the same order (sign bit flipped for positives, all bits for negatives) after
-0.0 -> +0.0 (§9 #6). Keys are distinct, and a larger key means a higher score, or an equal
score at a lower position (§8 #6), so "the k best" is exactly "the k largest keys".

Radix select, 8 bits per pass from the top (8 passes). A row's candidates are split over
``CHUNKS`` workgroups. In each pass every workgroup histograms the next digit of the keys that
still match the row's resolved prefix and adds its histogram into the row's shared global
histogram with atomics (``radix_histogram_kernel``); then one small program per row walks that
histogram from the top digit down, fixes the digit that holds the k-th largest key, and
subtracts the counts above it (``radix_select_kernel``). After the last pass the prefix *is*
the k-th largest key, and ``radix_gather_kernel`` writes every key >= it (exactly k per row)
to the row's output with an atomic cursor, in the atomics' order. The launcher sorts the
selected positions ascending (torch.sort): the contract's order (`atomk31.ops.topk`), which
is deterministic where the cursor's order is not.

The op checks its arguments before this launcher runs; the launch reads nothing back from the
device (sizes come from the tensors' shapes), so a CUDA / HIP graph can capture it.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from gluon_kernels.targets import GluonTarget, active_target, vector_layout

RADIX_BITS = 8
NUM_BINS = 1 << RADIX_BITS
KEY_BITS = 64
BLOCK = 1024  # candidates per loop step of one workgroup
NUM_WARPS = 4
MAX_CHUNK = 16384  # candidates per workgroup; longer rows get more workgroups


@gluon.jit
def _ranking_keys(scores_ptr, row, o_s, length, stride_row):
    """uint64 ranking keys of positions o_s of one row (module docstring); mask = candidate."""
    m_s = o_s < length
    score = gl.load(scores_ptr + row.to(gl.int64) * stride_row + o_s, mask=m_s, other=0.0)
    score = gl.where(score == 0.0, 0.0, score)  # -0.0 ranks as +0.0 (§9 #6)
    bits = score.to(gl.uint32, bitcast=True)
    is_negative = (bits >> 31) != 0
    ordered = gl.where(is_negative, ~bits, bits | 0x80000000)
    inverse_position = (0xFFFFFFFF - o_s.to(gl.int64)).to(gl.uint64)
    return (ordered.to(gl.uint64) << 32) | inverse_position, m_s


@gluon.jit
def radix_histogram_kernel(
    # pointers
    scores_ptr, lengths_ptr, prefix_ptr, histogram_ptr,
    # sizes and strides
    chunk_size, stride_scores_row,
    # meta-parameters
    SHIFT: gl.constexpr,  # bit position of this pass's digit
    BLOCK: gl.constexpr, NUM_BINS: gl.constexpr, LAYOUT: gl.constexpr,
):
    i_c = gl.program_id(0)
    row = gl.program_id(1)
    length = gl.load(lengths_ptr + row)
    prefix = gl.load(prefix_ptr + row).to(gl.uint64)
    counts = gl.zeros([NUM_BINS], gl.int32, layout=LAYOUT)
    start = i_c * chunk_size
    for offset in range(0, chunk_size, BLOCK):
        o_s = start + offset + gl.arange(0, BLOCK, layout=LAYOUT)
        keys, m_s = _ranking_keys(scores_ptr, row, o_s, length, stride_scores_row)
        if SHIFT + 8 < 64:
            # Only keys whose higher digits equal the prefix resolved so far stay in the race.
            m_s = m_s & ((keys >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        digit = ((keys >> SHIFT) & 0xFF).to(gl.int32)
        counts += gl.histogram(digit, NUM_BINS, mask=m_s, layout=LAYOUT)
    o_bin = gl.arange(0, NUM_BINS, layout=LAYOUT)
    gl.atomic_add(histogram_ptr + row * NUM_BINS + o_bin, counts, mask=counts > 0)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def radix_select_kernel(
    histogram_ptr, prefix_ptr, remaining_ptr,
    SHIFT: gl.constexpr, NUM_BINS: gl.constexpr, LAYOUT: gl.constexpr,
):
    row = gl.program_id(0)
    remaining = gl.load(remaining_ptr + row)
    if remaining > 0:
        # Bins from the highest digit down: an inclusive scan gives "keys with digit >= d".
        o_i = gl.arange(0, NUM_BINS, layout=LAYOUT)
        counts_desc = gl.load(histogram_ptr + row * NUM_BINS + (NUM_BINS - 1 - o_i))
        at_or_above = gl.associative_scan(counts_desc, 0, _add)
        # The first bin (from the top) where the running count reaches `remaining` holds
        # the k-th largest key.
        i_kth = gl.min(gl.where(at_or_above >= remaining, o_i, NUM_BINS), axis=0)
        above = gl.sum(gl.where(o_i < i_kth, counts_desc, 0), axis=0)
        digit = (NUM_BINS - 1 - i_kth).to(gl.uint64)
        prefix = gl.load(prefix_ptr + row).to(gl.uint64) | (digit << SHIFT)
        gl.store(prefix_ptr + row, prefix.to(gl.int64, bitcast=True))
        gl.store(remaining_ptr + row, remaining - above)
    # Clear the row's histogram for the next pass.
    o_bin = gl.arange(0, NUM_BINS, layout=LAYOUT)
    gl.store(histogram_ptr + row * NUM_BINS + o_bin, gl.zeros([NUM_BINS], gl.int32, LAYOUT))


@gluon.jit
def radix_gather_kernel(
    scores_ptr, lengths_ptr, threshold_ptr, cursor_ptr, selected_ptr,
    chunk_size, stride_scores_row, stride_selected_row,
    BLOCK: gl.constexpr, LAYOUT: gl.constexpr,
):
    i_c = gl.program_id(0)
    row = gl.program_id(1)
    length = gl.load(lengths_ptr + row)
    threshold = gl.load(threshold_ptr + row).to(gl.uint64)
    start = i_c * chunk_size
    for offset in range(0, chunk_size, BLOCK):
        o_s = start + offset + gl.arange(0, BLOCK, layout=LAYOUT)
        keys, m_s = _ranking_keys(scores_ptr, row, o_s, length, stride_scores_row)
        m_sel = m_s & (keys >= threshold)
        # One atomic per selected key: at most k per row over the whole grid.
        ones = gl.full([BLOCK], 1, gl.int32, layout=LAYOUT)
        slot = gl.atomic_add(cursor_ptr + row + o_s * 0, ones, mask=m_sel)
        gl.store(selected_ptr + row.to(gl.int64) * stride_selected_row + slot,
                 keys.to(gl.int64, bitcast=True), mask=m_sel)


def topk_positions_gluon(scores: torch.Tensor, k: int, lengths: torch.Tensor) -> torch.Tensor:
    """The k best positions per row in ascending order, -1 padded: int32 [Nq, k] (the
    `topk_positions` contract: scores [Nq, L] without NaN, lengths [Nq] in [0, L])."""
    num_rows, length = scores.shape
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or k == 0 or length == 0:
        return out
    target = active_target()
    scores = scores.float()
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    lengths = lengths.to(torch.int32).contiguous()
    row_k = torch.clamp(lengths, max=k)  # a short row returns all its candidates
    selected = launch_radix_topk(target, scores, lengths, row_k, k)
    return positions_of_selected_keys(selected, row_k)


def positions_of_selected_keys(selected: torch.Tensor, row_k: torch.Tensor) -> torch.Tensor:
    """Positions [Nq, k] int32 of the selected ranking keys in ascending order; -1 padded.

    selected [Nq, k] int64 holds uint64 ranking keys (bit patterns) in its first row_k[i]
    entries, in the gather's atomic order. A key's low 32 bits are 2^32 - 1 - position; the
    positions sort ascending with the unused entries (as 2^31 - 1, above every position) last.
    """
    num_rows, k = selected.shape
    is_taken = torch.arange(k, device=selected.device)[None, :] < row_k[:, None]
    positions = 0xFFFFFFFF - (selected & 0xFFFFFFFF)
    positions = torch.where(is_taken, positions, torch.iinfo(torch.int32).max)
    positions = torch.sort(positions, dim=1).values
    return torch.where(is_taken, positions, -1).to(torch.int32)


def launch_radix_topk(
    target: GluonTarget,
    scores: torch.Tensor,
    lengths: torch.Tensor,
    row_k: torch.Tensor,
    k: int,
) -> torch.Tensor:
    """Run the 8 radix passes and the gather; returns the selected keys [Nq, k] int64
    (uint64 bit patterns in row i's first row_k[i] entries, in any order)."""
    num_rows, length = scores.shape
    device = scores.device
    layout = vector_layout(target, NUM_WARPS)
    chunk_size = min(MAX_CHUNK, triton.cdiv(length, BLOCK) * BLOCK)
    num_chunks = triton.cdiv(length, chunk_size)
    histogram = torch.zeros(num_rows, NUM_BINS, dtype=torch.int32, device=device)
    prefix = torch.zeros(num_rows, dtype=torch.int64, device=device)
    remaining = row_k.clone()
    for shift in range(KEY_BITS - RADIX_BITS, -1, -RADIX_BITS):
        radix_histogram_kernel[(num_chunks, num_rows)](
            scores, lengths, prefix, histogram, chunk_size, scores.stride(0),
            SHIFT=shift, BLOCK=BLOCK, NUM_BINS=NUM_BINS, LAYOUT=layout, num_warps=NUM_WARPS)
        radix_select_kernel[(num_rows,)](
            histogram, prefix, remaining, SHIFT=shift, NUM_BINS=NUM_BINS, LAYOUT=layout,
            num_warps=NUM_WARPS)
    # A row with row_k == 0 keeps prefix 0 and would select everything; give it the largest
    # threshold so it selects nothing (its key would need all 64 bits set, never a candidate).
    threshold = torch.where(row_k > 0, prefix, torch.iinfo(torch.int64).max)
    selected = torch.full((num_rows, k), torch.iinfo(torch.int64).min, dtype=torch.int64,
                          device=device)
    cursor = torch.zeros(num_rows, dtype=torch.int32, device=device)
    radix_gather_kernel[(num_chunks, num_rows)](
        scores, lengths, threshold, cursor, selected, chunk_size, scores.stride(0),
        selected.stride(0), BLOCK=BLOCK, LAYOUT=layout, num_warps=NUM_WARPS)
    return selected
