"""KDA chunked prefill, stage 2 of 2: the state carried from chunk to chunk, and the output
(MODEL_SPEC §4.4, chunked form).

One program per (request, head, block of BLOCK_V value channels) walks the request's chunks
in order with its ``[K, BLOCK_V]`` slice of the state in registers. Per chunk, from stage 1's
``w, u, qg, kd, aqk, decay``:

    V' = u - w S,   O = qg S + aqk V',   S <- decay ⊙_rows S + kd^T V'

and, when the chunk table says so, the state after the chunk goes to a snapshot row (prefix
caching). Fusing the output here means the per-chunk states never go through memory.

Provenance: the inter-chunk recurrence is the one of flash-linear-attention's
chunk_gated_delta_rule_fwd_h (fla/ops/common/chunk_delta_h.py); the code is ours.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import dot_precision


@triton.jit
def kda_prefill_state_kernel(
    # pointers: stage-1 outputs [C, H, BT, *], decay [C, H, K]
    w_ptr, u_ptr, qg_ptr, kd_ptr, aqk_ptr, decay_ptr,
    # pointers: states [N, H, K, V] / [M, H, K, V] fp32, output o [T, H, V]
    initial_state_ptr, final_state_ptr, snapshots_ptr, o_ptr,
    # pointers: the chunk table
    chunk_start_ptr, chunk_len_ptr, chunk_snapshot_ptr, request_chunks_ptr,
    # strides
    stride_o,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_k, o_t = tl.arange(0, BLOCK_K), tl.arange(0, BT)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    b_state = tl.load(initial_state_ptr + (i_n * H + i_h).to(tl.int64) * K * V + o_kv,
                      mask=m_kv, other=0.0)
    c_begin = tl.load(request_chunks_ptr + i_n)
    c_end = tl.load(request_chunks_ptr + i_n + 1)
    for i_c in range(c_begin, c_end):
        base = (i_c * H + i_h).to(tl.int64)
        p_rows = (base * BT + o_t)[:, None]
        b_w = tl.load(w_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
        b_u = tl.load(u_ptr + p_rows * V + o_v[None, :], mask=m_v[None, :], other=0.0)
        b_new_v = b_u.to(tl.float32) - tl.dot(b_w.to(tl.float32), b_state,
                                              input_precision=DOT_PRECISION)
        b_qg = tl.load(qg_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
        b_aqk = tl.load(aqk_ptr + p_rows * BT + o_t[None, :],
                        mask=o_t[:, None] >= o_t[None, :], other=0.0)
        b_o = tl.dot(b_qg.to(tl.float32), b_state, input_precision=DOT_PRECISION)
        b_o = tl.dot(b_aqk.to(tl.float32), b_new_v, b_o, input_precision=DOT_PRECISION)
        t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
        length = tl.load(chunk_len_ptr + i_c)
        tl.store(o_ptr + (t0 + o_t)[:, None] * stride_o + i_h * V + o_v[None, :],
                 b_o.to(o_ptr.dtype.element_ty), mask=(o_t < length)[:, None] & m_v[None, :])
        b_kd = tl.load(kd_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
        b_decay = tl.load(decay_ptr + base * K + o_k, mask=m_k, other=0.0)
        b_state = b_state * b_decay[:, None] + tl.dot(tl.trans(b_kd.to(tl.float32)), b_new_v,
                                                      input_precision=DOT_PRECISION)
        snapshot = tl.load(chunk_snapshot_ptr + i_c)
        if snapshot >= 0:
            tl.store(snapshots_ptr + (snapshot * H + i_h).to(tl.int64) * K * V + o_kv, b_state,
                     mask=m_kv)
    tl.store(final_state_ptr + (i_n * H + i_h).to(tl.int64) * K * V + o_kv, b_state, mask=m_kv)


def kda_prefill_state(
    intra: dict[str, torch.Tensor],
    initial_state: torch.Tensor,
    o: torch.Tensor,
    snapshots: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    chunk_snapshot: torch.Tensor,
    request_chunks: torch.Tensor,
    block_v: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Stage 2. intra: stage 1's buffers; initial_state fp32 [N, H, K, V]; o [T, H, V]
    (written); snapshots fp32 [M, H, K, V] (rows named by chunk_snapshot written);
    chunk_snapshot int32 [C] (-1 = none); request_chunks int32 [N+1] -> final_state fp32
    [N, H, K, V]. ``block_v`` / ``num_stages`` are tuning knobs for benchmarks."""
    num_requests, num_heads, head_dim, value_dim = initial_state.shape
    final_state = torch.empty_like(initial_state)
    if num_requests == 0:
        return final_state
    is_wide = intra["w"].element_size() == 4
    if block_v is None:
        # Few long requests leave most SMs idle unless the value channels are split finely.
        block_v = 32 if num_requests * num_heads < 1024 else 64
    if num_stages is None:
        # Two fp32 stages of w, qg and kd would not fit in shared memory.
        num_stages = 1 if is_wide else 2
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    grid = (num_requests, num_heads, triton.cdiv(value_dim, block_v))
    kda_prefill_state_kernel[grid](
        intra["w"], intra["u"], intra["qg"], intra["kd"], intra["aqk"], intra["decay"],
        initial_state, final_state, snapshots, o,
        chunk_start, chunk_len, chunk_snapshot, request_chunks,
        o.stride(0),
        H=num_heads, K=head_dim, V=value_dim, BT=intra["aqk"].shape[-1],
        BLOCK_K=triton.next_power_of_2(head_dim), BLOCK_V=block_v,
        DOT_PRECISION=dot_precision(kda_prefill_state_kernel, intra["w"].dtype),
        num_warps=4, num_stages=num_stages,
    )
    return final_state
