"""KDA chunked prefill: the chunk table built on the GPU, without a host sync.

The host planner of ``kda_prefill.py`` reads cu_seqlens (and snapshot_at) on the host: a
device-to-host copy that waits for every queued kernel, then Python, then a host-to-device
copy, all while the GPU idles (the first stage cannot start before the table exists). Without
snapshot cuts the table only depends on cu_seqlens, so one program builds it on the GPU:

* ``request_chunks [N+1]``: request r owns chunks ``request_chunks[r] .. request_chunks[r+1]``
  (``ceil(T_r / 64)`` of them, in request order),
* per chunk slot c < ``max_chunks``: ``chunk_start``, ``chunk_len`` (0 for the slots past the
  last request's chunks: the stages then read and write nothing there but scratch rows) and
  ``chunk_snapshot`` (-1: no snapshot).

``max_chunks = T // 64 + N`` bounds ``Σ_r ceil(T_r / 64)`` from the shapes alone, so the grids
are known on the host. The values of cu_seqlens are not validated (that needs the host).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def kda_prefill_plan_kernel(
    cu_seqlens_ptr, chunk_start_ptr, chunk_len_ptr, chunk_snapshot_ptr, request_chunks_ptr,
    num_requests, max_chunks,
    BT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    o_r = tl.arange(0, BLOCK_N)
    m_r = o_r < num_requests
    b_begin = tl.load(cu_seqlens_ptr + o_r, mask=m_r, other=0)
    b_end = tl.load(cu_seqlens_ptr + o_r + 1, mask=m_r, other=0)
    b_num_chunks = tl.where(m_r, (b_end - b_begin + BT - 1) // BT, 0)
    b_last = tl.cumsum(b_num_chunks, axis=0)           # request_chunks[r + 1]
    b_first = b_last - b_num_chunks                    # request_chunks[r]
    tl.store(request_chunks_ptr + o_r + 1, b_last, mask=m_r)
    tl.store(request_chunks_ptr + o_r, b_first, mask=o_r == 0)
    for c_start in range(0, max_chunks, BLOCK_C):
        o_c = c_start + tl.arange(0, BLOCK_C)
        # The request of chunk slot c: how many requests end at or before it.
        b_ended = (b_last[None, :] <= o_c[:, None]) & m_r[None, :]
        b_request = tl.sum(b_ended.to(tl.int32), axis=1)
        b_pick = (o_r[None, :] == b_request[:, None]) & m_r[None, :]
        b_first_c = tl.sum(tl.where(b_pick, b_first[None, :], 0), axis=1)
        b_begin_c = tl.sum(tl.where(b_pick, b_begin[None, :], 0), axis=1)
        b_end_c = tl.sum(tl.where(b_pick, b_end[None, :], 0), axis=1)
        b_start = b_begin_c + (o_c - b_first_c) * BT
        b_valid = b_request < num_requests
        m_c = o_c < max_chunks
        tl.store(chunk_start_ptr + o_c, tl.where(b_valid, b_start, 0), mask=m_c)
        tl.store(chunk_len_ptr + o_c, tl.where(b_valid, tl.minimum(b_end_c - b_start, BT), 0),
                 mask=m_c)
        tl.store(chunk_snapshot_ptr + o_c, tl.full([BLOCK_C], -1, tl.int32), mask=m_c)


def plan_chunks_on_device(cu_seqlens: torch.Tensor, num_tokens: int,
                          chunk_size: int) -> dict[str, torch.Tensor]:
    """cu_seqlens int32 [N+1] (on the GPU) -> {"chunk_start", "chunk_len", "chunk_snapshot":
    int32 [T // chunk_size + N], "request_chunks": int32 [N+1]}, the columns of the host
    planner's table (kda_prefill.plan_chunks without snapshot cuts) plus empty slots."""
    num_requests = cu_seqlens.shape[0] - 1
    max_chunks = num_tokens // chunk_size + num_requests
    flat = torch.empty(3 * max_chunks + num_requests + 1, dtype=torch.int32,
                       device=cu_seqlens.device)
    table = dict(zip(("chunk_start", "chunk_len", "chunk_snapshot", "request_chunks"),
                     flat.split([max_chunks] * 3 + [num_requests + 1])))
    kda_prefill_plan_kernel[(1,)](
        cu_seqlens.to(torch.int32), table["chunk_start"], table["chunk_len"],
        table["chunk_snapshot"], table["request_chunks"], num_requests, max_chunks,
        BT=chunk_size, BLOCK_N=triton.next_power_of_2(max(num_requests, 1)),
        BLOCK_C=max(16, min(1024, 8192 // triton.next_power_of_2(max(num_requests, 1)))),
    )
    return table
