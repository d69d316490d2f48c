"""KDA chunked prefill, stage 1b of the split intra-chunk path: the gated rows and w, u.

One program per (chunk, head), after stage 1a (``kda_prefill_scores_wide.py``) has written the
inverse ``P = (I + L)^-1`` and the inverse norms. Walking the head dimension in BLOCK-wide
slices (Γ is per channel, so slices are independent), it writes

* ``qg = q̂ ⊙ exp(Γ)``, ``kd = k̂ ⊙ exp(Γ_last - Γ)`` and ``decay = exp(Γ_last) [K]``,
* ``w = P (β ⊙ exp(Γ) ⊙ k̂)`` and, over the value channels, ``u = P (β ⊙ v)``,

each product one [BT, BT] x [BT, BLOCK] tensor-core matmul. Products: IEEE fp32 for fp32
inputs; with BF16 intermediates, P and the right-hand sides rounded to BF16 with fp32
accumulation (as flash-linear-attention's recompute_w_u does); fp32 under the interpreter.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.kda_prefill_intra import CHUNK_SIZE, empty_intermediates
from atomk31.triton_kernels.runtime import dot_precision, runs_on_interpreter


@triton.jit
def _apply(b_p, b_x, BF16_PRODUCTS: tl.constexpr, DOT_PRECISION: tl.constexpr, out_dtype):
    if BF16_PRODUCTS:
        return tl.dot(b_p.to(out_dtype), b_x.to(out_dtype))
    return tl.dot(b_p.to(tl.float32), b_x, input_precision=DOT_PRECISION)


@triton.jit
def gated_outputs(
    q_ptr, k_ptr, v_ptr, g_ptr, t0, length, i_h, base, b_p, b_norm_q, b_norm_k, b_beta,
    qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr, stride_q, stride_k, stride_v,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BLOCK: tl.constexpr, BF16_PRODUCTS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """qg, kd, decay, w and u of one (chunk, head) from the inverse P [BT, BT] (lower, zeros
    above), the inverse norms and β [BT] (0 past the chunk's end)."""
    o_t = tl.arange(0, BT)
    m_t = o_t < length
    rows = (t0 + o_t)[:, None]
    p_out_rows = (base * BT + o_t)[:, None]
    out_dtype = w_ptr.dtype.element_ty
    for k_start in range(0, K, BLOCK):
        o_k = k_start + tl.arange(0, BLOCK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_g = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_gamma = tl.cumsum(b_g, axis=0)
        b_gamma_last = tl.sum(b_g, axis=0)
        b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32) * b_norm_k[:, None]
        b_q = tl.load(q_ptr + i_h * K + rows * stride_q + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32) * b_norm_q[:, None]
        b_growth = tl.exp(b_gamma)
        p_out = p_out_rows * K + o_k[None, :]
        tl.store(qg_ptr + p_out, (b_q * b_growth).to(out_dtype), mask=m_k[None, :])
        tl.store(kd_ptr + p_out, (b_k * tl.exp(b_gamma_last[None, :] - b_gamma)).to(out_dtype),
                 mask=m_k[None, :])
        tl.store(decay_ptr + base * K + o_k, tl.exp(b_gamma_last), mask=m_k)
        b_w = _apply(b_p, b_beta[:, None] * b_growth * b_k, BF16_PRODUCTS, DOT_PRECISION,
                     out_dtype)
        tl.store(w_ptr + p_out, b_w.to(out_dtype), mask=m_k[None, :])

    for v_start in range(0, V, BLOCK):
        o_v = v_start + tl.arange(0, BLOCK)
        m_v = o_v < V
        b_v = tl.load(v_ptr + i_h * V + rows * stride_v + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        b_u = _apply(b_p, b_beta[:, None] * b_v, BF16_PRODUCTS, DOT_PRECISION, out_dtype)
        tl.store(u_ptr + p_out_rows * V + o_v[None, :], b_u.to(out_dtype), mask=m_v[None, :])


@triton.jit
def kda_prefill_gated_kernel(
    # pointers: inputs (token-major [T, H, *]), the chunk table, stage 1a's outputs
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    inverse_ptr, inv_norm_q_ptr, inv_norm_k_ptr,
    # pointers: outputs [C, H, BT, *] and decay [C, H, K]
    qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr,
    # strides (elements between consecutive tokens)
    stride_q, stride_k, stride_v,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BLOCK: tl.constexpr, BF16_PRODUCTS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)
    o_t = tl.arange(0, BT)
    b_p = tl.load(inverse_ptr + (base * BT + o_t)[:, None] * BT + o_t[None, :],
                  mask=o_t[:, None] >= o_t[None, :], other=0.0)
    b_norm_q = tl.load(inv_norm_q_ptr + base * BT + o_t)
    b_norm_k = tl.load(inv_norm_k_ptr + base * BT + o_t)
    b_beta = tl.load(beta_ptr + (t0 + o_t) * H + i_h, mask=o_t < length, other=0.0)
    gated_outputs(q_ptr, k_ptr, v_ptr, g_ptr, t0, length, i_h, base, b_p, b_norm_q, b_norm_k,
                  b_beta, qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr, stride_q, stride_k,
                  stride_v, H, K, V, BT, BLOCK, BF16_PRODUCTS, DOT_PRECISION)


def kda_prefill_gated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scores: dict[str, torch.Tensor],
    intermediate_dtype: torch.dtype,
    block: int = 64,
    num_warps: int = 4,
    bf16_products: bool = True,
) -> dict[str, torch.Tensor]:
    """Stage 1b over C chunks, after ``kda_prefill_scores_wide`` gave ``scores``. Together they
    keep the contract of ``kda_prefill_intra.kda_prefill_intra``: q, k [T, H, K] (token stride
    free, head and channel dense); v [T, H, V]; g fp32 [T, H, K]; beta fp32 [T, H];
    chunk_start, chunk_len int32 [C] -> {"w": [C, H, BT, K], "u": [C, H, BT, V],
    "qg", "kd": [C, H, BT, K] in intermediate_dtype; "aqk": [C, H, BT, BT] (scores'),
    "decay": fp32 [C, H, K]}. ``bf16_products``: the products in the intermediate dtype when
    it is 16-bit (not under the interpreter, whose BF16 dot is wrong)."""
    num_tokens, num_heads, head_dim = q.shape
    value_dim = v.shape[-1]
    num_chunks = chunk_start.shape[0]
    device = q.device
    out = empty_intermediates(num_chunks, num_heads, head_dim, value_dim, intermediate_dtype,
                              device, aqk=scores["aqk"])
    if num_chunks == 0:
        return out
    use_bf16 = bf16_products and intermediate_dtype in (torch.bfloat16, torch.float16) \
        and not runs_on_interpreter(kda_prefill_gated_kernel)
    kda_prefill_gated_kernel[(num_chunks, num_heads)](
        q, k, v, g, beta, chunk_start, chunk_len,
        scores["inverse"], scores["inv_norm_q"], scores["inv_norm_k"],
        out["qg"], out["kd"], out["w"], out["u"], out["decay"],
        q.stride(0), k.stride(0), v.stride(0),
        H=num_heads, K=head_dim, V=value_dim, BT=CHUNK_SIZE,
        BLOCK=min(block, triton.next_power_of_2(max(head_dim, value_dim))),
        BF16_PRODUCTS=use_bf16, DOT_PRECISION=dot_precision(kda_prefill_gated_kernel, q.dtype),
        num_warps=num_warps,
    )
    return out
