"""Exact top-k of indexer scores in Triton: a threshold from group maxima, then bisection.

Contract: `atomk31.ops.topk` (`topk_positions`, and `topk_slots` = positions_to_slots of it):
the k best positions of each row, higher score first, equal scores -> lower position (§4.6,
§8 #6), -0.0 equal to +0.0 (§9 #6), rows shorter than k padded with -1.

Scores become 32-bit keys that order like the floats. Four launches, none with contended
atomics (a histogram of float keys piles most elements into a few bins):
  1. several programs per row write the maximum key of every group of G positions;
  2. one program per row finds T0, the k-th largest group maximum, by bisection on the key
     (at most 16384 maxima, held in registers). k distinct elements are >= T0, so every one
     of the k best is too, while few others are (about k for continuous scores);
  3. the programs of a row compact the positions and keys >= T0 into a candidate buffer,
     reserving room with one atomic add per tile;
  4. one program per row bisects the candidates for the exact k-th key T and, among keys
     equal to T, the position that keeps the lowest ones; it sorts the k chosen by
     (key, -position) and writes positions, or cache slots through the block table.
The scores are read twice. If more candidates than the buffer holds pass T0 (many equal
scores), step 4 rescans the row for each bisection step instead: slow, still exact.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import runs_on_interpreter

MAX_K = 4096  # the final sort holds the k chosen positions of a row in one program
MAX_GROUPS = 16384  # group maxima per row, bisected in registers
CANDIDATE_CAPACITY = 8192
BLOCK = 4096


@triton.jit
def orderable_key(x):
    """fp32 -> int64 in [0, 2^32) that orders like the floats; -0.0 is made +0.0 (§9 #6)."""
    x = tl.where(x == 0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) | -2147483648)).to(tl.uint32, bitcast=True)
    return key.to(tl.int64)


@triton.jit
def load_tile(p_row, o_s, m_s, is_full):
    """Scores at o_s; a full tile loads without a mask, so the loads can be 16 bytes wide."""
    if is_full:
        x = tl.load(p_row + o_s)
    else:
        x = tl.load(p_row + o_s, mask=m_s, other=0.0)
    return x


@triton.jit
def topk_group_max_kernel(
    scores_ptr, lengths_ptr, group_max_ptr,
    chunk_size, stride_scores_row, stride_group_row,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    """group_max[row, g] = max key of positions [g*GROUP, (g+1)*GROUP) below the length
    (0, below every key, for a group with none)."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_group = group_max_ptr + i_row.to(tl.int64) * stride_group_row
    start = i_chunk * chunk_size
    end = tl.minimum(start + chunk_size, length)
    for tile in range(start, end, BLOCK):
        o_s = tile + tl.arange(0, BLOCK)
        m_s = o_s < end
        key = tl.where(m_s, orderable_key(load_tile(p_row, o_s, m_s, tile + BLOCK <= end)), 0)
        group_max = tl.max(tl.reshape(key, (BLOCK // GROUP, GROUP)), axis=1)
        o_g = tile // GROUP + tl.arange(0, BLOCK // GROUP)
        tl.store(p_group + o_g, group_max.to(tl.int32), mask=o_g * GROUP < end)


@triton.jit
def topk_threshold_kernel(
    group_max_ptr, lengths_ptr, workspace_ptr,
    k, stride_group_row, stride_workspace_row,
    GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr,
):
    """workspace[row, 0] = T0: the largest key with >= need group maxima at or above it
    (0 when the row has fewer than need groups: every position is a candidate)."""
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    num_groups = tl.cdiv(length, GROUP)
    o_g = tl.arange(0, GROUPS_PAD)
    m_g = o_g < num_groups
    key = tl.load(group_max_ptr + i_row.to(tl.int64) * stride_group_row + o_g, mask=m_g,
                  other=0).to(tl.uint32, bitcast=True).to(tl.int64)
    low = tl.zeros((), tl.int64)
    count_low = num_groups
    high = tl.full((), 4294967296, tl.int64)
    # Invariant: count(key >= low) >= need > count(key >= high); fewer groups than need keep
    # T0 = 0, and exactly need maxima >= low is as tight as it gets.
    while (high - low > 1) & (count_low > need):
        middle = (low + high) // 2
        count = tl.sum((m_g & (key >= middle)).to(tl.int32))
        if count >= need:
            low = middle
            count_low = count
        else:
            high = middle
    tl.store(workspace_ptr + i_row.to(tl.int64) * stride_workspace_row, low)


@triton.jit
def topk_collect_kernel(
    scores_ptr, lengths_ptr, workspace_ptr, candidate_pos_ptr, candidate_key_ptr,
    chunk_size, stride_scores_row, stride_workspace_row, candidate_capacity,
    BLOCK: tl.constexpr,
):
    """Positions and keys >= T0 -> the row's candidate buffer; workspace[row, 1] counts them."""
    i_row = tl.program_id(0)
    i_chunk = tl.program_id(1)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    p_work = workspace_ptr + i_row.to(tl.int64) * stride_workspace_row
    threshold = tl.load(p_work)
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
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
            base = tl.atomic_add(p_work + 1, num_candidates.to(tl.int64), sem="relaxed")
            o_out = base + tl.cumsum(is_candidate.to(tl.int32), 0) - 1
            m_out = is_candidate & (o_out < candidate_capacity)
            tl.store(candidate_pos_ptr + o_row_buffer + o_out, o_s, mask=m_out)
            tl.store(candidate_key_ptr + o_row_buffer + o_out, key, mask=m_out)


@triton.jit
def load_candidates(p_row, p_pos, p_key, start, num_items, from_buffer, threshold,
                    BLOCK: tl.constexpr):
    """(keys int64, positions, mask) of candidates start..start+BLOCK: from the buffer, or
    from a rescan of the row keeping keys >= threshold."""
    o_i = start + tl.arange(0, BLOCK)
    m_i = o_i < num_items
    if from_buffer:
        position = tl.load(p_pos + o_i, mask=m_i, other=0)
        key = tl.load(p_key + o_i, mask=m_i, other=0)
    else:
        position = o_i
        key = orderable_key(tl.load(p_row + o_i, mask=m_i, other=0.0))
        m_i = m_i & (key >= threshold)
    return key, position, m_i


@triton.jit
def count_candidates(p_row, p_pos, p_key, num_items, from_buffer, threshold, key_at_least,
                     tie_key, tie_position_at_most, BLOCK: tl.constexpr):
    """Candidates with key >= key_at_least, plus those with key == tie_key at a position <=
    tie_position_at_most (pass tie_key = -1 to count none of the latter)."""
    total = tl.zeros((), tl.int32)
    for start in range(0, num_items, BLOCK):
        key, position, m_i = load_candidates(p_row, p_pos, p_key, start, num_items, from_buffer,
                                             threshold, BLOCK)
        hit = (key >= key_at_least) | ((key == tie_key) & (position <= tie_position_at_most))
        total += tl.sum((m_i & hit).to(tl.int32))
    return total


@triton.jit
def topk_finish_kernel(
    scores_ptr, lengths_ptr, workspace_ptr, candidate_pos_ptr, candidate_key_ptr, selected_ptr,
    block_table_ptr, row_request_ptr, out_ptr,
    k, stride_scores_row, stride_workspace_row, candidate_capacity, stride_selected_row,
    stride_table_r, max_blocks, block_size, stride_out_row,
    K_PAD: tl.constexpr, WRITE_SLOTS: tl.constexpr, BLOCK: tl.constexpr,
):
    i_row = tl.program_id(0)
    length = tl.load(lengths_ptr + i_row).to(tl.int32)
    need = tl.minimum(k, length)
    p_work = workspace_ptr + i_row.to(tl.int64) * stride_workspace_row
    p_row = scores_ptr + i_row.to(tl.int64) * stride_scores_row
    p_pos = candidate_pos_ptr + i_row.to(tl.int64) * candidate_capacity
    p_key = candidate_key_ptr + i_row.to(tl.int64) * candidate_capacity
    p_selected = selected_ptr + i_row.to(tl.int64) * stride_selected_row
    threshold = tl.load(p_work)
    num_candidates = tl.load(p_work + 1)
    from_buffer = num_candidates <= candidate_capacity
    num_items = tl.where(from_buffer, num_candidates, length).to(tl.int32)

    # The cut: the largest key `low` with count(key >= low) >= need. Stops early once exactly
    # need keys are >= low, else ends at the k-th key itself (high = low + 1).
    # Up to BLOCK candidates (the usual case) stay in registers for every count below.
    is_resident = num_items <= BLOCK
    key0, position0, m0 = load_candidates(p_row, p_pos, p_key, 0, num_items, from_buffer,
                                          threshold, BLOCK)
    low = threshold
    count_low = num_candidates.to(tl.int32)
    high = tl.full((), 4294967296, tl.int64)
    while (high - low > 1) & (count_low > need):
        middle = (low + high) // 2
        if is_resident:
            count = tl.sum((m0 & (key0 >= middle)).to(tl.int32))
        else:
            count = count_candidates(p_row, p_pos, p_key, num_items, from_buffer, threshold,
                                     middle, -1, -1, BLOCK)
        if count >= need:
            low = middle
            count_low = count
        else:
            high = middle
    # More keys equal to the k-th than places left: the lowest positions win (§4.6, §8 #6):
    # the smallest `last` with count(key > T or (key == T and position <= last)) >= need.
    cut = tl.where(count_low > need, low + 1, low)
    tie_key = tl.where(count_low > need, low, -1)
    last_low = tl.full((), -1, tl.int32)
    last_high = length - 1
    if count_low <= need:
        last_high = last_low + 1
    while last_high - last_low > 1:
        middle = (last_low + last_high) // 2
        if is_resident:
            is_hit = (key0 >= cut) | ((key0 == tie_key) & (position0 <= middle))
            count = tl.sum((m0 & is_hit).to(tl.int32))
        else:
            count = count_candidates(p_row, p_pos, p_key, num_items, from_buffer, threshold,
                                     cut, tie_key, middle, BLOCK)
        if count >= need:
            last_high = middle
        else:
            last_low = middle
    # The chosen ones, compacted (any order), then sorted by (key, -position).
    cursor = tl.zeros((), tl.int32)
    for start in range(0, num_items, BLOCK):
        key, position, m_i = load_candidates(p_row, p_pos, p_key, start, num_items,
                                             from_buffer, threshold, BLOCK)
        is_chosen = m_i & ((key >= cut) | ((key == tie_key) & (position <= last_high)))
        o_out = cursor + tl.cumsum(is_chosen.to(tl.int32), 0) - 1
        tl.store(p_selected + o_out, position, mask=is_chosen & (o_out < K_PAD))
        cursor += tl.sum(is_chosen.to(tl.int32))
    tl.debug_barrier()  # the selection written above is read back by other threads below

    o_k = tl.arange(0, K_PAD)
    m_k = o_k < need
    position = tl.load(p_selected + o_k, mask=m_k, other=0)
    key = orderable_key(tl.load(p_row + position, mask=m_k, other=0.0))
    composite = ((key - 2147483648) << 32) | (4294967295 - position.to(tl.int64))
    composite = tl.where(m_k, composite, tl.full((K_PAD,), -9223372036854775808, tl.int64))
    composite = tl.sort(composite, 0, descending=True)
    position = (4294967295 - (composite & 4294967295)).to(tl.int32)
    out = tl.where(m_k, position, -1)
    if WRITE_SLOTS:
        request = tl.load(row_request_ptr + i_row).to(tl.int64)
        column = out // block_size
        block = tl.load(block_table_ptr + request * stride_table_r + column,
                        mask=m_k & (column < max_blocks), other=-1)
        out = tl.where(block >= 0, block * block_size + out % block_size, -1)
    tl.store(out_ptr + i_row.to(tl.int64) * stride_out_row + o_k, out, mask=o_k < k)


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    block_table: torch.Tensor | None = None,
    row_request: torch.Tensor | None = None,
    block_size: int = 1,
    candidate_capacity: int = CANDIDATE_CAPACITY,
    programs_per_row: int | None = None,
    max_groups: int = MAX_GROUPS,
) -> torch.Tensor:
    """Positions [Nq, k] int32 of each row's k best scores (or their cache slots when
    block_table [N, max_blocks] and row_request [Nq] are given), best first, -1 padded.

    scores [Nq, L] fp32 (no NaN), lengths [Nq] in [0, L]; k <= MAX_K. `candidate_capacity`
    (>= k), `programs_per_row` (default: about 4 programs per multiprocessor) and
    `max_groups` (group maxima per row, a power of two <= MAX_GROUPS) tune it.
    """
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be [Nq, L] float32, got {list(scores.shape)} "
                         f"{scores.dtype}")
    num_rows, num_positions = scores.shape
    if k < 0 or k > MAX_K:
        raise ValueError(f"topk_triton handles 0 <= k <= {MAX_K}, got k={k}; use the torch "
                         "implementation for larger k")
    if lengths.shape != (num_rows,):
        raise ValueError(f"lengths must be [Nq={num_rows}], got {list(lengths.shape)}")
    write_slots = block_table is not None
    if write_slots and (row_request is None or row_request.shape != (num_rows,)):
        raise ValueError(f"topk slots need row_request [Nq={num_rows}] with the block table")
    if candidate_capacity < k:
        raise ValueError(f"candidate_capacity must be >= k={k}, got {candidate_capacity}")
    out = torch.empty(num_rows, k, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or k == 0:
        return out
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    device = scores.device
    is_interpreter = runs_on_interpreter(topk_finish_kernel)  # TRITON_INTERPRET=1
    block = 64 if is_interpreter else BLOCK
    # Groups of G positions: the fewest that keep the maxima of a row within MAX_GROUPS.
    group = triton.next_power_of_2(triton.cdiv(max(num_positions, 1), max_groups))
    block = max(block, group)
    num_groups = triton.cdiv(num_positions, group)
    if programs_per_row is None:
        num_programs_wanted = 1 if is_interpreter else 4 * _num_sms(device)
        programs_per_row = triton.cdiv(num_programs_wanted, num_rows)
    num_tiles = max(1, triton.cdiv(num_positions, block))
    num_chunks = min(num_tiles, max(1, programs_per_row))
    chunk_size = triton.cdiv(num_tiles, num_chunks) * block
    num_chunks = max(1, triton.cdiv(num_positions, chunk_size))

    # workspace row: [T0, candidate count] int64
    workspace = torch.zeros(num_rows, 2, dtype=torch.int64, device=device)
    group_max = torch.empty(num_rows, max(num_groups, 1), dtype=torch.int32, device=device)
    candidate_pos = torch.empty(num_rows, candidate_capacity, dtype=torch.int32, device=device)
    candidate_key = torch.empty(num_rows, candidate_capacity, dtype=torch.int64, device=device)
    k_pad = max(16, triton.next_power_of_2(k))
    selected = torch.empty(num_rows, k_pad, dtype=torch.int32, device=device)
    grid = (num_rows, num_chunks)
    topk_group_max_kernel[grid](
        scores, lengths, group_max, chunk_size, scores.stride(0), group_max.stride(0),
        GROUP=group, BLOCK=block, num_warps=8)
    topk_threshold_kernel[(num_rows,)](
        group_max, lengths, workspace, k, group_max.stride(0), workspace.stride(0),
        GROUP=group, GROUPS_PAD=max(16, triton.next_power_of_2(num_groups)), num_warps=8)
    topk_collect_kernel[grid](
        scores, lengths, workspace, candidate_pos, candidate_key, chunk_size, scores.stride(0),
        workspace.stride(0), candidate_capacity, BLOCK=block, num_warps=8)
    if write_slots:
        table, requests, max_blocks = block_table, row_request, block_table.shape[1]
    else:
        table, requests, max_blocks = lengths, lengths, 0  # unused placeholders
    topk_finish_kernel[(num_rows,)](
        scores, lengths, workspace, candidate_pos, candidate_key, selected, table, requests, out,
        k, scores.stride(0), workspace.stride(0), candidate_capacity, selected.stride(0),
        table.stride(0) if write_slots else 0, max_blocks, block_size, out.stride(0),
        K_PAD=k_pad, WRITE_SLOTS=write_slots, BLOCK=block, num_warps=8)
    return out


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
