"""KDA chunked prefill, stage 1a of the split intra-chunk path: scores and their solve.

One program per (chunk, head). With ``Γ_i = Σ_{j<=i} g_j`` from the chunk start and the
l2-normalised ``q̂ = q / |q| · scale``, ``k̂ = k / |k|``, it writes

* ``aqk [BT, BT]``: ``A[i,j] = Σ_d q̂_i k̂_j exp(Γ_i - Γ_j)`` for j <= i (the tiles above the
  diagonal are not written: readers mask them),
* ``inverse [BT, BT] = (I + L)^-1`` with ``L[i,j] = β_i Σ_d k̂_i k̂_j exp(Γ_i - Γ_j)``, j < i
  (lower tiles only, unit diagonal),
* ``inv_norm_q``, ``inv_norm_k [BT]``: ``scale / |q_i|`` and ``1 / |k_i|`` for stage 1b
  (``kda_prefill_gated.py``), which applies the inverse to the right-hand sides.

Why this shape (compared with the single-kernel ``kda_prefill_intra.py``): the head dimension
is walked in BK-wide slices, so every slice issues all twelve of its [16, BK] loads at once and
the twenty [16, 16] score accumulators stay in registers across slices; the norms are applied
after the loop (the scores are bilinear in q and k, so ``A = diag(1/|q|) A_raw diag(1/|k|)``);
L never goes through memory before the solve. The matrix products that need the right-hand
sides (w, u) are [64, 64] x [64, BK] in stage 1b, sized for the tensor cores.

Numerics (§4.4): ``exp(Γ_i - Γ_j) = exp(Γ_i - Γ_r) · exp(Γ_r - Γ_j)`` with ``r`` the last row
of j's 16-token sub-chunk, each factor inside fp32's range while each per-token decay is at
least -5.8 (see kda_prefill_intra.py). The solve is the same blockwise IEEE fp32 one.

Provenance: the K-sliced accumulation of the sub-chunk score tiles and the split of the solve
from the w/u products follow flash-linear-attention's chunk_kda
(fla/ops/kda/chunk_intra.py, wy_fast.py); code is ours.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.kda_prefill_intra import (
    CHUNK_SIZE, L2_NORM_EPS, SUB_CHUNK_SIZE, _ieee_dot, _unit_lower_inverse,
)
from atomk31.triton_kernels.runtime import dot_precision


@triton.jit
def _sub_chunk_slice(
    q_ptr, k_ptr, g_ptr, t0, length, i_h, i_s: tl.constexpr, b_carry, o_k, m_k,
    stride_q, stride_k, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
):
    """Sub-chunk i_s, channels o_k (b_carry = Γ at its start) -> raw q, raw k, Γ, the
    right-hand tile k exp(Γ_ref - Γ) and Γ_ref = Γ at its last row. Rows past the chunk's end
    load as zeros (their g too, so Γ stays flat there)."""
    o_s = i_s * BC + tl.arange(0, BC)
    m_rows = (o_s < length)[:, None] & m_k[None, :]
    rows = (t0 + o_s)[:, None]
    b_q = tl.load(q_ptr + i_h * K + rows * stride_q + o_k[None, :], mask=m_rows,
                  other=0.0).to(tl.float32)
    b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_rows,
                  other=0.0).to(tl.float32)
    b_g = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_rows, other=0.0)
    b_gamma = b_carry[None, :] + tl.cumsum(b_g, axis=0)
    b_ref = b_carry + tl.sum(b_g, axis=0)
    return b_q, b_k, b_gamma, b_k * tl.exp(b_ref[None, :] - b_gamma), b_ref


@triton.jit
def _accumulate_pair(b_aqk, b_akk, b_q_i, b_k_i, b_gamma_i, b_right_j, b_ref_j,
                     DOT_PRECISION: tl.constexpr):
    """Adds one slice's contribution to score tiles (i, j): the left factor exp(Γ_i - Γ_ref_j)
    is <= 1 off the diagonal and <= exp(15 x 5.8) on it."""
    b_left = tl.exp(b_gamma_i - b_ref_j[None, :])
    b_right_t = tl.trans(b_right_j)
    b_aqk = tl.dot(b_q_i * b_left, b_right_t, b_aqk, input_precision=DOT_PRECISION)
    b_akk = tl.dot(b_k_i * b_left, b_right_t, b_akk, input_precision=DOT_PRECISION)
    return b_aqk, b_akk


@triton.jit
def _finish_pair(
    aqk_ptr, base, i_i: tl.constexpr, i_j: tl.constexpr, b_aqk, b_akk, b_norm_q_i, b_norm_k_i,
    b_norm_k_j, b_beta_i, BT: tl.constexpr, BC: tl.constexpr,
):
    """Normalises tiles (i, j), stores the A tile and returns the L tile (β-weighted; strictly
    lower on the diagonal)."""
    o_c = tl.arange(0, BC)
    b_aqk = b_aqk * b_norm_q_i[:, None] * b_norm_k_j[None, :]
    b_akk = b_akk * (b_beta_i * b_norm_k_i)[:, None] * b_norm_k_j[None, :]
    if i_i == i_j:
        b_aqk = tl.where(o_c[:, None] >= o_c[None, :], b_aqk, 0.0)
        b_akk = tl.where(o_c[:, None] > o_c[None, :], b_akk, 0.0)
    p_tile = (base * BT + i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :]
    tl.store(aqk_ptr + p_tile, b_aqk.to(aqk_ptr.dtype.element_ty))
    return b_akk


@triton.jit
def _store_inverse_tile(inverse_ptr, base, i_i: tl.constexpr, i_j: tl.constexpr, b_p,
                        BT: tl.constexpr, BC: tl.constexpr):
    o_c = tl.arange(0, BC)
    p_tile = (base * BT + i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :]
    tl.store(inverse_ptr + p_tile, b_p.to(inverse_ptr.dtype.element_ty))


@triton.jit
def kda_prefill_scores_kernel(
    # pointers: inputs (token-major [T, H, *]) and the chunk table
    q_ptr, k_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    # pointers: outputs, aqk and inverse [C, H, BT, BT], the norms [C, H, BT]
    aqk_ptr, inverse_ptr, inv_norm_q_ptr, inv_norm_k_ptr,
    # strides (elements between consecutive tokens) and the q scale
    stride_q, stride_k, scale,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)

    zero = tl.zeros([BC, BC], dtype=tl.float32)
    aqk00, aqk10, aqk11, aqk20, aqk21, aqk22 = zero, zero, zero, zero, zero, zero
    aqk30, aqk31, aqk32, aqk33 = zero, zero, zero, zero
    akk00, akk10, akk11, akk20, akk21, akk22 = zero, zero, zero, zero, zero, zero
    akk30, akk31, akk32, akk33 = zero, zero, zero, zero
    squares = tl.zeros([BC], dtype=tl.float32)
    sq_q0, sq_q1, sq_q2, sq_q3 = squares, squares, squares, squares
    sq_k0, sq_k1, sq_k2, sq_k3 = squares, squares, squares, squares

    for k_start in range(0, K, BK):
        o_k = k_start + tl.arange(0, BK)
        m_k = o_k < K
        # Each row sub-chunk's tiles are used as soon as they load, so that only the four
        # right-hand tiles and one row sub-chunk stay live (fewer registers, no spills).
        b_carry = tl.zeros([BK], dtype=tl.float32)
        q0, k0, gm0, r0, ref0 = _sub_chunk_slice(q_ptr, k_ptr, g_ptr, t0, length, i_h, 0,
                                                 b_carry, o_k, m_k, stride_q, stride_k, H, K, BC)
        sq_q0 += tl.sum(q0 * q0, axis=1)
        sq_k0 += tl.sum(k0 * k0, axis=1)
        aqk00, akk00 = _accumulate_pair(aqk00, akk00, q0, k0, gm0, r0, ref0, DOT_PRECISION)
        q1, k1, gm1, r1, ref1 = _sub_chunk_slice(q_ptr, k_ptr, g_ptr, t0, length, i_h, 1, ref0,
                                                 o_k, m_k, stride_q, stride_k, H, K, BC)
        sq_q1 += tl.sum(q1 * q1, axis=1)
        sq_k1 += tl.sum(k1 * k1, axis=1)
        aqk10, akk10 = _accumulate_pair(aqk10, akk10, q1, k1, gm1, r0, ref0, DOT_PRECISION)
        aqk11, akk11 = _accumulate_pair(aqk11, akk11, q1, k1, gm1, r1, ref1, DOT_PRECISION)
        q2, k2, gm2, r2, ref2 = _sub_chunk_slice(q_ptr, k_ptr, g_ptr, t0, length, i_h, 2, ref1,
                                                 o_k, m_k, stride_q, stride_k, H, K, BC)
        sq_q2 += tl.sum(q2 * q2, axis=1)
        sq_k2 += tl.sum(k2 * k2, axis=1)
        aqk20, akk20 = _accumulate_pair(aqk20, akk20, q2, k2, gm2, r0, ref0, DOT_PRECISION)
        aqk21, akk21 = _accumulate_pair(aqk21, akk21, q2, k2, gm2, r1, ref1, DOT_PRECISION)
        aqk22, akk22 = _accumulate_pair(aqk22, akk22, q2, k2, gm2, r2, ref2, DOT_PRECISION)
        q3, k3, gm3, r3, ref3 = _sub_chunk_slice(q_ptr, k_ptr, g_ptr, t0, length, i_h, 3, ref2,
                                                 o_k, m_k, stride_q, stride_k, H, K, BC)
        sq_q3 += tl.sum(q3 * q3, axis=1)
        sq_k3 += tl.sum(k3 * k3, axis=1)
        aqk30, akk30 = _accumulate_pair(aqk30, akk30, q3, k3, gm3, r0, ref0, DOT_PRECISION)
        aqk31, akk31 = _accumulate_pair(aqk31, akk31, q3, k3, gm3, r1, ref1, DOT_PRECISION)
        aqk32, akk32 = _accumulate_pair(aqk32, akk32, q3, k3, gm3, r2, ref2, DOT_PRECISION)
        aqk33, akk33 = _accumulate_pair(aqk33, akk33, q3, k3, gm3, r3, ref3, DOT_PRECISION)

    # Norms (§9 #3: eps 1e-6 inside the root), kept for stage 1b.
    o_c = tl.arange(0, BC)
    nq0 = tl.rsqrt(sq_q0 + L2_NORM_EPS) * scale
    nq1 = tl.rsqrt(sq_q1 + L2_NORM_EPS) * scale
    nq2 = tl.rsqrt(sq_q2 + L2_NORM_EPS) * scale
    nq3 = tl.rsqrt(sq_q3 + L2_NORM_EPS) * scale
    nk0 = tl.rsqrt(sq_k0 + L2_NORM_EPS)
    nk1 = tl.rsqrt(sq_k1 + L2_NORM_EPS)
    nk2 = tl.rsqrt(sq_k2 + L2_NORM_EPS)
    nk3 = tl.rsqrt(sq_k3 + L2_NORM_EPS)
    p_norm = base * BT + o_c
    tl.store(inv_norm_q_ptr + p_norm, nq0)
    tl.store(inv_norm_q_ptr + p_norm + BC, nq1)
    tl.store(inv_norm_q_ptr + p_norm + 2 * BC, nq2)
    tl.store(inv_norm_q_ptr + p_norm + 3 * BC, nq3)
    tl.store(inv_norm_k_ptr + p_norm, nk0)
    tl.store(inv_norm_k_ptr + p_norm + BC, nk1)
    tl.store(inv_norm_k_ptr + p_norm + 2 * BC, nk2)
    tl.store(inv_norm_k_ptr + p_norm + 3 * BC, nk3)
    rows = t0 + o_c
    beta0 = tl.load(beta_ptr + rows * H + i_h, mask=o_c < length, other=0.0)
    beta1 = tl.load(beta_ptr + (rows + BC) * H + i_h, mask=o_c + BC < length, other=0.0)
    beta2 = tl.load(beta_ptr + (rows + 2 * BC) * H + i_h, mask=o_c + 2 * BC < length, other=0.0)
    beta3 = tl.load(beta_ptr + (rows + 3 * BC) * H + i_h, mask=o_c + 3 * BC < length, other=0.0)

    a00 = _finish_pair(aqk_ptr, base, 0, 0, aqk00, akk00, nq0, nk0, nk0, beta0, BT, BC)
    a10 = _finish_pair(aqk_ptr, base, 1, 0, aqk10, akk10, nq1, nk1, nk0, beta1, BT, BC)
    a11 = _finish_pair(aqk_ptr, base, 1, 1, aqk11, akk11, nq1, nk1, nk1, beta1, BT, BC)
    a20 = _finish_pair(aqk_ptr, base, 2, 0, aqk20, akk20, nq2, nk2, nk0, beta2, BT, BC)
    a21 = _finish_pair(aqk_ptr, base, 2, 1, aqk21, akk21, nq2, nk2, nk1, beta2, BT, BC)
    a22 = _finish_pair(aqk_ptr, base, 2, 2, aqk22, akk22, nq2, nk2, nk2, beta2, BT, BC)
    a30 = _finish_pair(aqk_ptr, base, 3, 0, aqk30, akk30, nq3, nk3, nk0, beta3, BT, BC)
    a31 = _finish_pair(aqk_ptr, base, 3, 1, aqk31, akk31, nq3, nk3, nk1, beta3, BT, BC)
    a32 = _finish_pair(aqk_ptr, base, 3, 2, aqk32, akk32, nq3, nk3, nk2, beta3, BT, BC)
    a33 = _finish_pair(aqk_ptr, base, 3, 3, aqk33, akk33, nq3, nk3, nk3, beta3, BT, BC)

    # (I + L)^-1: 16x16 diagonal inverses, then block forward substitution
    # P_ij = -P_ii Σ_{j<=m<i} L_im P_mj, all IEEE fp32.
    p00 = _unit_lower_inverse(a00, BC)
    p11 = _unit_lower_inverse(a11, BC)
    p22 = _unit_lower_inverse(a22, BC)
    p33 = _unit_lower_inverse(a33, BC)
    p10 = -_ieee_dot(p11, _ieee_dot(a10, p00))
    p21 = -_ieee_dot(p22, _ieee_dot(a21, p11))
    p20 = -_ieee_dot(p22, _ieee_dot(a20, p00) + _ieee_dot(a21, p10))
    p32 = -_ieee_dot(p33, _ieee_dot(a32, p22))
    p31 = -_ieee_dot(p33, _ieee_dot(a31, p11) + _ieee_dot(a32, p21))
    p30 = -_ieee_dot(p33, _ieee_dot(a30, p00) + _ieee_dot(a31, p10) + _ieee_dot(a32, p20))
    _store_inverse_tile(inverse_ptr, base, 0, 0, p00, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 1, 0, p10, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 1, 1, p11, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 2, 0, p20, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 2, 1, p21, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 2, 2, p22, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 3, 0, p30, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 3, 1, p31, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 3, 2, p32, BT, BC)
    _store_inverse_tile(inverse_ptr, base, 3, 3, p33, BT, BC)


def kda_prefill_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scale: float,
    block_k: int = 32,
    num_warps: int = 2,
) -> dict[str, torch.Tensor]:
    """Stage 1a over C chunks. q, k: [T, H, K] (token stride free, head and channel dense);
    g fp32 [T, H, K]; beta fp32 [T, H]; chunk_start, chunk_len int32 [C] -> {"aqk",
    "inverse": fp32 [C, H, BT, BT] (lower tiles written), "inv_norm_q", "inv_norm_k": fp32
    [C, H, BT]}. ``block_k`` (channels per slice) and ``num_warps`` are tuning knobs."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_chunks = chunk_start.shape[0]
    rows = (max(num_chunks, 1), num_heads, CHUNK_SIZE)
    out = {name: torch.empty(*rows, CHUNK_SIZE, dtype=torch.float32, device=q.device)
           for name in ("aqk", "inverse")}
    out.update({name: torch.empty(rows, dtype=torch.float32, device=q.device)
                for name in ("inv_norm_q", "inv_norm_k")})
    if num_chunks == 0:
        return out
    kda_prefill_scores_kernel[(num_chunks, num_heads)](
        q, k, g, beta, chunk_start, chunk_len,
        out["aqk"], out["inverse"], out["inv_norm_q"], out["inv_norm_k"],
        q.stride(0), k.stride(0), scale,
        H=num_heads, K=head_dim, BT=CHUNK_SIZE, BC=SUB_CHUNK_SIZE,
        BK=min(block_k, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(kda_prefill_scores_kernel, q.dtype),
        num_warps=num_warps,
    )
    return out
