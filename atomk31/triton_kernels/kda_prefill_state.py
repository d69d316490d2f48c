"""KDA chunked prefill, stage 2: the state carried from chunk to chunk (MODEL_SPEC §4.4, chunked
form).

One program per (request, head, block of BLOCK_V value channels) walks the request's chunks
in order with its ``[K, BLOCK_V]`` slice of the state in registers. Per chunk, from stage 1's
``w, u, qg, kd, aqk, decay``:

    V' = u - w S,   S <- decay ⊙_rows S + kd^T V'

and, when the chunk table says so, the state after the chunk goes to a snapshot row (prefix
caching). The output ``O = qg S + aqk V'`` is either computed here (``FUSE_OUTPUT``: the
states never go through memory, but the sequential walk does twice the products), or left to
the chunk-parallel stage 3 (``kda_prefill_output.py``), for which this stage then writes the
state before each chunk and V'.

With ``FOLD_W_U`` (``KdaPrefillTuning.fold_w_u``) stage 1 stored no w and u but
kb = β k̂ ⊙ exp(Γ) and the inverse P (w = P kb, u = P (β ⊙ v)), and each chunk forms
``V' = P (β ⊙ v - kb S)``, reading v and β from the inputs: one product more on the
sequential path, and no stage 1b.

Products: fp32 tiles with ``DOT_PRECISION`` (IEEE for fp32 inputs), or, with
``BF16_PRODUCTS`` (BF16 intermediates only), operands in the intermediates' dtype (the
state and V' rounded to it for the product, accumulation in fp32), as flash-linear-attention
does. The state itself always stays fp32.

Provenance: the inter-chunk recurrence is the one of flash-linear-attention's
chunk_gated_delta_rule_fwd_h (fla/ops/common/chunk_delta_h.py); the code is ours.
"""

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning
from atomk31.triton_kernels.runtime import dot_precision, runs_on_interpreter


@triton.jit
def _product(b_a, b_b, b_acc, BF16_PRODUCTS: tl.constexpr, DOT_PRECISION: tl.constexpr,
             intermediate_ptr):
    """b_acc + b_a @ b_b with fp32 accumulation; operands rounded to the intermediates' dtype
    (that of intermediate_ptr) when BF16_PRODUCTS, else fp32 operands at DOT_PRECISION."""
    if BF16_PRODUCTS:
        product_ty = intermediate_ptr.dtype.element_ty
        return tl.dot(b_a.to(product_ty), b_b.to(product_ty), b_acc)
    return tl.dot(b_a.to(tl.float32), b_b.to(tl.float32), b_acc, input_precision=DOT_PRECISION)


@triton.jit
def _folded_new_v(b_kb, b_state, inverse_ptr, v_ptr, beta_ptr, base, i_h, i_c, o_t, o_v, m_v,
                  chunk_start_ptr, chunk_len_ptr, stride_v, H: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BLOCK_V: tl.constexpr, BF16_PRODUCTS: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, intermediate_ptr):
    """V' = P (β ⊙ v - kb S) [BT, BLOCK_V]: stage 1b's w = P kb and u = P (β ⊙ v) never
    stored. Rows past the chunk's end: v and β load as 0 (kb is 0 there)."""
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    m_t = o_t < tl.load(chunk_len_ptr + i_c)
    b_v = tl.load(v_ptr + (t0 + o_t)[:, None] * stride_v + i_h * V + o_v[None, :],
                  mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_beta = tl.load(beta_ptr + (t0 + o_t) * H + i_h, mask=m_t, other=0.0)
    b_p = tl.load(inverse_ptr + (base * BT + o_t)[:, None] * BT + o_t[None, :],
                  mask=o_t[:, None] >= o_t[None, :], other=0.0)     # lower: above is unwritten
    b_rhs = b_beta[:, None] * b_v.to(tl.float32) - _product(
        b_kb, b_state, tl.zeros([BT, BLOCK_V], tl.float32), BF16_PRODUCTS, DOT_PRECISION,
        intermediate_ptr)
    return _product(b_p, b_rhs, tl.zeros([BT, BLOCK_V], tl.float32), BF16_PRODUCTS,
                    DOT_PRECISION, intermediate_ptr)


@triton.jit
def kda_prefill_state_kernel(
    # pointers: stage-1 outputs [C, H, BT, *], decay [C, H, K]
    w_ptr, u_ptr, qg_ptr, kd_ptr, aqk_ptr, decay_ptr,
    # pointers: states [N, H, K, V] / [M, H, K, V] fp32, output o [T, H, V]
    initial_state_ptr, final_state_ptr, snapshots_ptr, o_ptr,
    # pointers (not FUSE_OUTPUT): state before each chunk [C, H, K, V], V' [C, H, BT, V]
    h_ptr, new_v_ptr,
    # pointers (FOLD_W_U): the inverse P [C, H, BT, BT], the inputs v [T, H, V], beta [T, H]
    inverse_ptr, v_ptr, beta_ptr,
    # pointers: the chunk table
    chunk_start_ptr, chunk_len_ptr, chunk_snapshot_ptr, request_chunks_ptr,
    # strides
    stride_o, stride_v,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr, BF16_PRODUCTS: tl.constexpr, FOLD_W_U: tl.constexpr,
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
        b_kd = tl.load(kd_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
        b_decay = tl.load(decay_ptr + base * K + o_k, mask=m_k, other=0.0)
        if FOLD_W_U:
            # w_ptr holds kb = β k̂ ⊙ exp(Γ): V' = u - w S = P (β v - kb S).
            b_new_v = _folded_new_v(b_w, b_state, inverse_ptr, v_ptr, beta_ptr, base, i_h, i_c,
                                    o_t, o_v, m_v, chunk_start_ptr, chunk_len_ptr, stride_v, H,
                                    V, BT, BLOCK_V, BF16_PRODUCTS, DOT_PRECISION, w_ptr)
        else:
            b_u = tl.load(u_ptr + p_rows * V + o_v[None, :], mask=m_v[None, :], other=0.0)
            b_new_v = b_u.to(tl.float32) - _product(b_w, b_state,
                                                    tl.zeros([BT, BLOCK_V], tl.float32),
                                                    BF16_PRODUCTS, DOT_PRECISION, w_ptr)
        if FUSE_OUTPUT:
            b_qg = tl.load(qg_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
            b_aqk = tl.load(aqk_ptr + p_rows * BT + o_t[None, :],
                            mask=o_t[:, None] >= o_t[None, :], other=0.0)
            b_o = _product(b_qg, b_state, tl.zeros([BT, BLOCK_V], tl.float32), BF16_PRODUCTS,
                           DOT_PRECISION, w_ptr)
            b_o = _product(b_aqk, b_new_v, b_o, BF16_PRODUCTS, DOT_PRECISION, w_ptr)
            t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
            length = tl.load(chunk_len_ptr + i_c)
            tl.store(o_ptr + (t0 + o_t)[:, None] * stride_o + i_h * V + o_v[None, :],
                     b_o.to(o_ptr.dtype.element_ty),
                     mask=(o_t < length)[:, None] & m_v[None, :])
        else:
            tl.store(h_ptr + base * K * V + o_kv, b_state.to(h_ptr.dtype.element_ty), mask=m_kv)
            tl.store(new_v_ptr + p_rows * V + o_v[None, :],
                     b_new_v.to(new_v_ptr.dtype.element_ty), mask=m_v[None, :])
        b_state = _product(tl.trans(b_kd), b_new_v, b_state * b_decay[:, None], BF16_PRODUCTS,
                           DOT_PRECISION, w_ptr)
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
    tuning: KdaPrefillTuning,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """Stage 2. intra: stage 1's buffers (with ``fold_w_u``: "kb", "inverse" and the inputs
    "v", "beta" in place of "w", "u"; kda_prefill.run_intra); initial_state fp32
    [N, H, K, V]; o [T, H, V] (written when the output is fused); snapshots fp32
    [M, H, K, V] (rows named by chunk_snapshot written); chunk_snapshot int32 [C]
    (-1 = none); request_chunks int32 [N+1] -> (final_state fp32 [N, H, K, V],
    {"h": [C, H, K, V], "new_v": [C, H, BT, V]} in the intermediates' dtype for stage 3, or
    None when the output is fused)."""
    num_requests, num_heads, head_dim, value_dim = initial_state.shape
    final_state = torch.empty_like(initial_state)
    fold_w_u = "kb" in intra
    w = intra["kb"] if fold_w_u else intra["w"]
    num_chunks, _, chunk_size, _ = w.shape
    device = initial_state.device
    dtype = w.dtype
    if tuning.split_output:
        stage3 = {"h": torch.empty(num_chunks, num_heads, head_dim, value_dim, dtype=dtype,
                                   device=device),
                  "new_v": torch.empty(num_chunks, num_heads, chunk_size, value_dim,
                                       dtype=dtype, device=device)}
    else:
        stage3 = None
    if num_requests == 0:
        return final_state, stage3
    is_wide = w.element_size() == 4
    block_v = tuning.block_v
    if block_v is None:
        # 64: the fastest at 1 and 4 requests x 96 heads (benchmarks/NOTES.md, KDA prefill).
        block_v = 64
    num_stages = tuning.num_stages
    if num_stages is None:
        # Two fp32 stages of w, qg and kd would not fit in shared memory; the folded path's
        # two stages take 272 VGPRs on gfx950 (one stage: 212, within two waves per SIMD).
        on_hip = not runs_on_interpreter(kda_prefill_state_kernel) \
            and driver.active.get_current_target().backend == "hip"
        num_stages = 1 if is_wide or (fold_w_u and on_hip) else 2
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    # The interpreter's BF16 dot is wrong: fp32 products there.
    # FP16 intermediates keep fp32 products: the state could overflow FP16's range.
    bf16_products = (tuning.bf16_products and dtype == torch.bfloat16
                     and not runs_on_interpreter(kda_prefill_state_kernel))
    scratch = stage3 or {"h": final_state, "new_v": final_state}   # unused when fused
    grid = (num_requests, num_heads, triton.cdiv(value_dim, block_v))
    # Unused pointers (u, or the folded path's inputs) get any tensor.
    folded = (intra["inverse"], intra["v"], intra["beta"]) if fold_w_u else (w, w, w)
    kda_prefill_state_kernel[grid](
        w, intra.get("u", w), intra["qg"], intra["kd"], intra["aqk"], intra["decay"],
        initial_state, final_state, snapshots, o, scratch["h"], scratch["new_v"], *folded,
        chunk_start, chunk_len, chunk_snapshot, request_chunks,
        o.stride(0), folded[1].stride(0),
        H=num_heads, K=head_dim, V=value_dim, BT=chunk_size,
        BLOCK_K=triton.next_power_of_2(head_dim), BLOCK_V=block_v,
        DOT_PRECISION=dot_precision(kda_prefill_state_kernel, dtype),
        FUSE_OUTPUT=not tuning.split_output, BF16_PRODUCTS=bf16_products, FOLD_W_U=fold_w_u,
        num_warps=tuning.num_warps, num_stages=num_stages,
    )
    return final_state, stage3
