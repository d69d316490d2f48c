"""topk: the indexer's top-k selection (§4.6) and the position -> cache-slot mapping.

Contract
--------
topk_positions(scores, k, lengths) -> positions
  scores   [Nq, L] fp32 indexer scores (`indexer_score`); must not hold NaN.
  k        int >= 0 (index_topk, or less for short rows).
  lengths  [Nq] int in [0, L]: row i ranks only scores[i, :lengths[i]].
  positions [Nq, k] int32: the set of the row's k best positions (higher score first, equal
  scores -> lower position, §4.6, §8 #6; -0.0 equal to +0.0, §9 #6) in ASCENDING POSITION
  order, not best first: no consumer needs the ranking (sparse MLA sums over the selection,
  softmax is order-free), position order is deterministic (no atomics' order leaks into
  attention's summation order, so runs and backends stay bit-comparable), and attention then
  reads the cache in position order as dense attention does. A row with lengths[i] < k
  returns all its positions (ascending) and then -1 padding; k > L is allowed. Exact: no
  tolerance.

topk_slots(scores, k, lengths, block_table, row_request, block_size) -> slots
  exactly positions_to_slots(topk_positions(scores, k, lengths), block_table, row_request,
  block_size): the selection as the cache slots attention reads (one fused kernel on GPUs).

positions_to_slots(positions, block_table, row_request, block_size) -> slots
  positions   [Nq, k] int (-1 = none), absolute token positions of the row's request.
  block_table [N, max_blocks] int32, -1 padded; row_request [Nq] int32 in [0, N).
  slots [Nq, k] int32: block_table[row_request[i], p // block_size] * block_size
  + p % block_size, -1 kept (and -1 where the block table has no block for p).

Also here, shared by `indexer_score` and `dense_mla`: `check_paged_rows` (boundary checks of
the block table and query rows), `group_rows_by_request` and `causal_slots_of_request`.
"""

import torch

from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import READS_DEVICE, needs_gpu, needs_rocm


def check_paged_rows(
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
) -> None:
    """Raise ValueError unless the block table and query rows address the cache consistently.

    block_table [N, max_blocks], row_request [Nq] in [0, N), row_position [Nq] >= 0, with
    every row's position inside the block table's width.
    """
    if block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [N, max_blocks], got {list(block_table.shape)}")
    if row_request.dim() != 1 or row_position.shape != row_request.shape:
        raise ValueError(
            f"row_request and row_position must both be [Nq], got "
            f"{list(row_request.shape)} and {list(row_position.shape)}"
        )
    if row_request.numel() == 0:
        return
    num_requests, max_blocks = block_table.shape
    if int(row_request.min()) < 0 or int(row_request.max()) >= num_requests:
        raise ValueError(
            f"row_request must index the block table's {num_requests} requests, got values "
            f"in [{int(row_request.min())}, {int(row_request.max())}]"
        )
    if int(row_position.min()) < 0:
        raise ValueError(f"row_position must be >= 0, got {int(row_position.min())}")
    max_position = int(row_position.max())
    if max_position // block_size >= max_blocks:
        raise ValueError(
            f"position {max_position} needs block {max_position // block_size} but the "
            f"block table has {max_blocks} columns; allocate blocks before the forward"
        )


def positions_to_slots_torch(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Map positions [Nq, k] of each row's request to cache slots [Nq, k] int32 (-1 kept)."""
    if positions.dim() != 2 or positions.shape[0] != row_request.shape[0]:
        raise ValueError(
            f"positions must be [Nq={row_request.shape[0]}, k], got {list(positions.shape)}"
        )
    max_blocks = block_table.shape[1]
    safe = positions.long().clamp_min(0)
    column = safe // block_size
    is_valid = (positions >= 0) & (column < max_blocks)
    if max_blocks == 0:
        return torch.full_like(positions, -1, dtype=torch.int32)
    blocks = block_table[row_request.long()[:, None], column.clamp_max(max_blocks - 1)].long()
    slots = blocks * block_size + safe % block_size
    return torch.where(is_valid & (blocks >= 0), slots, -1).to(torch.int32)


def causal_slots_of_request(
    block_table: torch.Tensor, request: int, length: int, block_size: int
) -> torch.Tensor:
    """Slots [length] int64 of positions 0..length-1 of one request; all must be allocated."""
    positions = torch.arange(length, device=block_table.device)[None]
    request_index = torch.tensor([request], device=block_table.device)
    slots = positions_to_slots_torch(positions, block_table, request_index, block_size)[0]
    if bool((slots < 0).any()):
        missing = int(torch.nonzero(slots < 0)[0, 0])
        raise ValueError(
            f"request {request} has no block for position {missing} (block_table column "
            f"{missing // block_size} is -1); allocate blocks before the forward"
        )
    return slots.long()


def group_rows_by_request(
    row_request: torch.Tensor, row_position: torch.Tensor
) -> list[tuple[int, torch.Tensor, int]]:
    """[(request, row indices [n] int64, key length = max position of those rows + 1)].

    Rows of one request share their keys, so ops gather each request's keys once.
    """
    groups = []
    for request in torch.unique(row_request).tolist():
        rows = torch.nonzero(row_request == request).squeeze(1)
        groups.append((request, rows, int(row_position[rows].max()) + 1))
    return groups


def topk_positions_torch(scores: torch.Tensor, k: int, lengths: torch.Tensor) -> torch.Tensor:
    """The k best positions per row in ascending order, -1 padded (module docstring):
    int32 [Nq, k]."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [Nq, L], got {list(scores.shape)}")
    num_rows, length = scores.shape
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if lengths.shape != (num_rows,):
        raise ValueError(f"lengths must be [Nq={num_rows}], got {list(lengths.shape)}")
    if num_rows and (int(lengths.min()) < 0 or int(lengths.max()) > length):
        raise ValueError(
            f"lengths must lie in [0, L={length}], got [{int(lengths.min())}, "
            f"{int(lengths.max())}]"
        )
    positions = torch.arange(length, device=scores.device)
    is_candidate = positions[None, :] < lengths[:, None]
    # -0.0 -> +0.0 (§9 #6); then -inf beyond the row's length. A stable descending sort
    # keeps equal scores in position order, so ties go to the lower position (§8 #6), and
    # real candidates (even at -inf) stay ahead of the padding, which lies at higher positions.
    ranked = torch.where(scores == 0, 0.0, scores.float()).masked_fill(~is_candidate, -torch.inf)
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, :k]
    # The selected set in position order: the padding (positions >= length, all at the end)
    # sorts last as `length` and becomes -1.
    order = torch.sort(torch.where(order < lengths[:, None], order, length), dim=1).values
    order = torch.where(order < lengths[:, None], order, -1)
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)
    out[:, : order.shape[1]] = order.to(torch.int32)
    return out


def topk_slots_torch(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Cache slots [Nq, k] int32 of each row's top-k positions in position order, -1 padded:
    exactly positions_to_slots(topk_positions(scores, k, lengths), ...)."""
    positions = topk_positions_torch(scores, k, lengths)
    return positions_to_slots_torch(positions, block_table, row_request, block_size)


topk_positions = topk_positions_torch
positions_to_slots = positions_to_slots_torch


def check_topk(scores: torch.Tensor, k: int, lengths: torch.Tensor,
               block_table: torch.Tensor | None = None, row_request: torch.Tensor | None = None,
               block_size: int | None = None) -> None:
    """The host-side argument check of `topk_positions` / `topk_slots` (no device reads)."""
    if scores.dim() != 2 or lengths.shape != (scores.shape[0],) or k < 0:
        raise ValueError(f"topk: expected scores [Nq, L], lengths [Nq] and k >= 0, got "
                         f"{list(scores.shape)}, {list(lengths.shape)} and k={k}")
    if block_table is None:
        return
    if block_table.dim() != 2 or row_request is None or row_request.shape != lengths.shape:
        raise ValueError(f"topk_slots: expected block_table [N, max_blocks] and row_request "
                         f"[Nq={scores.shape[0]}], got {list(block_table.shape)} and "
                         f"{None if row_request is None else list(row_request.shape)}")
    if block_size is None or block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"topk_slots: block_size must be a power of two, got {block_size}")


define_op("topk_positions", check=check_topk)
define_op("topk_slots", check=check_topk)
register("topk_positions", "torch", topk_positions_torch, not_in_graph=READS_DEVICE)
register("topk_positions", "triton", "atomk31.triton_kernels.topk:topk_triton",
         why_not=needs_gpu)
register("topk_positions", "amd", "gluon_kernels.amd.radix_topk:topk_positions_gluon",
         why_not=needs_rocm(("gfx950", "gfx942")))
register("positions_to_slots", "torch", positions_to_slots_torch)
register("topk_slots", "torch", topk_slots_torch, not_in_graph=READS_DEVICE)
register("topk_slots", "triton", "atomk31.triton_kernels.topk:topk_triton", why_not=needs_gpu)
register("topk_slots", "amd", "atomk31.ops.amd_adapters:topk_slots_radix",
         why_not=needs_rocm(("gfx950", "gfx942")))
