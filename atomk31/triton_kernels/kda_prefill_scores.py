"""KDA chunked prefill, stage 1a of the split intra-chunk path: scores and their solve.

Two programs per (chunk, head): one computes L and its inverse, the other the scores A. With
``Γ_i = Σ_{j<=i} g_j`` from the chunk start and the l2-normalised ``q̂ = q / |q| · scale``,
``k̂ = k / |k|``, they write

* ``aqk [BT, BT]``: ``A[i,j] = Σ_d q̂_i k̂_j exp(Γ_i - Γ_j)`` for j <= i (the tiles above the
  diagonal are not written: readers mask them),
* ``inverse [BT, BT] = (I + L)^-1`` with ``L[i,j] = β_i Σ_d k̂_i k̂_j exp(Γ_i - Γ_j)``, j < i
  (lower tiles only, unit diagonal),
* ``inv_norm_q``, ``inv_norm_k [BT]``: ``scale / |q_i|`` and ``1 / |k_i|`` for stage 1b
  (``kda_prefill_gated.py``), which applies the inverse to the right-hand sides.

Why this shape (compared with the single-kernel ``kda_prefill_intra.py``): the head dimension
is walked in BK-wide slices, so every slice issues its [16, BK] loads together and the ten
[16, 16] score accumulators of a program stay in registers across slices (twenty, A and L in
one program, spill on the H200); the norms are applied after the loop (the scores are
bilinear, ``A = diag(scale/|q|) A_raw diag(1/|k|)``); L never goes through memory before the
solve. The products with the right-hand sides (w, u) are [64, 64] x [64, BLOCK] in stage 1b,
sized for the tensor cores.

Numerics (§4.4): ``exp(Γ_i - Γ_j) = exp(Γ_i - Γ_r) · exp(Γ_r - Γ_j)`` with ``r`` the last row
of j's 16-token sub-chunk, each factor inside fp32's range while each per-token decay is at
least -5.8 (see kda_prefill_intra.py). The solve is the same blockwise one, in IEEE fp32 or
(an option for 16-bit inputs, as fla's solve_tril) TF32: IEEE fp32 products of [16, 16] tiles
run on the FMA units with their operands spread over many registers.

Provenance: the K-sliced accumulation of the sub-chunk score tiles and the split of the solve
from the w/u products follow flash-linear-attention's chunk_kda
(fla/ops/kda/chunk_intra.py, wy_fast.py); code is ours.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.kda_prefill_intra import CHUNK_SIZE, L2_NORM_EPS, SUB_CHUNK_SIZE
from atomk31.triton_kernels.runtime import dot_precision


@triton.jit
def _unit_lower_inverse(b_a, BC: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BC, BC] tile with BC = 16: A^16 = 0, so
    (I - A)(I + A^2)(I + A^4)(I + A^8) is the exact inverse."""
    o_c = tl.arange(0, BC)
    b_p = (o_c[:, None] == o_c[None, :]).to(tl.float32) - b_a
    b_power = tl.dot(b_a, b_a, input_precision=PRECISION)
    b_p = b_p + tl.dot(b_p, b_power, input_precision=PRECISION)
    b_power = tl.dot(b_power, b_power, input_precision=PRECISION)
    b_p = b_p + tl.dot(b_p, b_power, input_precision=PRECISION)
    b_power = tl.dot(b_power, b_power, input_precision=PRECISION)
    return b_p + tl.dot(b_p, b_power, input_precision=PRECISION)


@triton.jit
def _dot(b_a, b_b, PRECISION: tl.constexpr):
    return tl.dot(b_a, b_b, input_precision=PRECISION)


@triton.jit
def _sub_chunk_slice(
    x_ptr, k_ptr, g_ptr, t0, length, i_h, i_s: tl.constexpr, b_carry, o_k, m_k,
    stride_x, stride_k, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
    ROWS_ARE_KEYS: tl.constexpr,
):
    """Sub-chunk i_s, channels o_k (b_carry = Γ at its start) -> raw rows x (q, or k itself),
    raw k, Γ, the right-hand tile k exp(Γ_ref - Γ) and Γ_ref = Γ at its last row. Rows past
    the chunk's end load as zeros (their g too, so Γ stays flat there)."""
    o_s = i_s * BC + tl.arange(0, BC)
    m_rows = (o_s < length)[:, None] & m_k[None, :]
    rows = (t0 + o_s)[:, None]
    b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_rows,
                  other=0.0).to(tl.float32)
    if ROWS_ARE_KEYS:
        b_x = b_k
    else:
        b_x = tl.load(x_ptr + i_h * K + rows * stride_x + o_k[None, :], mask=m_rows,
                      other=0.0).to(tl.float32)
    b_g = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_rows, other=0.0)
    b_gamma = b_carry[None, :] + tl.cumsum(b_g, axis=0)
    b_ref = b_carry + tl.sum(b_g, axis=0)
    return b_x, b_k, b_gamma, b_k * tl.exp(b_ref[None, :] - b_gamma), b_ref


@triton.jit
def _accumulate_pair(b_acc, b_x_i, b_gamma_i, b_right_j, b_ref_j, DOT_PRECISION: tl.constexpr):
    """Adds one slice's contribution to score tile (i, j): the left factor exp(Γ_i - Γ_ref_j)
    is <= 1 off the diagonal and <= exp(15 x 5.8) on it."""
    b_left = tl.exp(b_gamma_i - b_ref_j[None, :])
    return tl.dot(b_x_i * b_left, tl.trans(b_right_j), b_acc, input_precision=DOT_PRECISION)


@triton.jit
def _sliced_scores(
    x_ptr, k_ptr, g_ptr, t0, length, i_h, stride_x, stride_k, H: tl.constexpr,
    K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, ROWS_ARE_KEYS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The ten raw tiles (i, j <= i) of Σ_d x_i k_j exp(Γ_i - Γ_j) over the chunk's four
    sub-chunks, then the rows' sums of squares of x and of k (for the norms)."""
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33 = \
        zero, zero, zero, zero, zero, zero, zero, zero, zero, zero
    squares = tl.zeros([BC], dtype=tl.float32)
    sx0, sx1, sx2, sx3 = squares, squares, squares, squares
    sk0, sk1, sk2, sk3 = squares, squares, squares, squares
    for k_start in range(0, K, BK):
        o_k = k_start + tl.arange(0, BK)
        m_k = o_k < K
        # Each row sub-chunk's tiles are used as soon as they load, so that only the four
        # right-hand tiles and one row sub-chunk stay live.
        x0, k0, gm0, r0, ref0 = _sub_chunk_slice(
            x_ptr, k_ptr, g_ptr, t0, length, i_h, 0, tl.zeros([BK], dtype=tl.float32), o_k,
            m_k, stride_x, stride_k, H, K, BC, ROWS_ARE_KEYS)
        sx0 += tl.sum(x0 * x0, axis=1)
        sk0 += tl.sum(k0 * k0, axis=1)
        a00 = _accumulate_pair(a00, x0, gm0, r0, ref0, DOT_PRECISION)
        x1, k1, gm1, r1, ref1 = _sub_chunk_slice(
            x_ptr, k_ptr, g_ptr, t0, length, i_h, 1, ref0, o_k, m_k, stride_x, stride_k, H, K,
            BC, ROWS_ARE_KEYS)
        sx1 += tl.sum(x1 * x1, axis=1)
        sk1 += tl.sum(k1 * k1, axis=1)
        a10 = _accumulate_pair(a10, x1, gm1, r0, ref0, DOT_PRECISION)
        a11 = _accumulate_pair(a11, x1, gm1, r1, ref1, DOT_PRECISION)
        x2, k2, gm2, r2, ref2 = _sub_chunk_slice(
            x_ptr, k_ptr, g_ptr, t0, length, i_h, 2, ref1, o_k, m_k, stride_x, stride_k, H, K,
            BC, ROWS_ARE_KEYS)
        sx2 += tl.sum(x2 * x2, axis=1)
        sk2 += tl.sum(k2 * k2, axis=1)
        a20 = _accumulate_pair(a20, x2, gm2, r0, ref0, DOT_PRECISION)
        a21 = _accumulate_pair(a21, x2, gm2, r1, ref1, DOT_PRECISION)
        a22 = _accumulate_pair(a22, x2, gm2, r2, ref2, DOT_PRECISION)
        x3, k3, gm3, r3, ref3 = _sub_chunk_slice(
            x_ptr, k_ptr, g_ptr, t0, length, i_h, 3, ref2, o_k, m_k, stride_x, stride_k, H, K,
            BC, ROWS_ARE_KEYS)
        sx3 += tl.sum(x3 * x3, axis=1)
        sk3 += tl.sum(k3 * k3, axis=1)
        a30 = _accumulate_pair(a30, x3, gm3, r0, ref0, DOT_PRECISION)
        a31 = _accumulate_pair(a31, x3, gm3, r1, ref1, DOT_PRECISION)
        a32 = _accumulate_pair(a32, x3, gm3, r2, ref2, DOT_PRECISION)
        a33 = _accumulate_pair(a33, x3, gm3, r3, ref3, DOT_PRECISION)
    return a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, sx0, sx1, sx2, sx3, sk0, sk1, \
        sk2, sk3


@triton.jit
def _normalised_tile(b_a, i_i: tl.constexpr, i_j: tl.constexpr, b_row_scale, b_norm_k_j,
                     STRICT: tl.constexpr, BC: tl.constexpr):
    """Tile (i, j) scaled by rows and columns, masked on the diagonal (strictly or not)."""
    o_c = tl.arange(0, BC)
    b_a = b_a * b_row_scale[:, None] * b_norm_k_j[None, :]
    if i_i == i_j:
        if STRICT:
            b_a = tl.where(o_c[:, None] > o_c[None, :], b_a, 0.0)
        else:
            b_a = tl.where(o_c[:, None] >= o_c[None, :], b_a, 0.0)
    return b_a


@triton.jit
def _store_tile(out_ptr, base, i_i: tl.constexpr, i_j: tl.constexpr, b_tile, BT: tl.constexpr,
                BC: tl.constexpr):
    o_c = tl.arange(0, BC)
    p_tile = (base * BT + i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :]
    tl.store(out_ptr + p_tile, b_tile.to(out_ptr.dtype.element_ty))


@triton.jit
def _store_scores(aqk_ptr, base, a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, nq0, nq1,
                  nq2, nq3, nk0, nk1, nk2, nk3, BT: tl.constexpr, BC: tl.constexpr):
    """A = diag(scale / |q|) A_raw diag(1 / |k|), lower with its diagonal."""
    _store_tile(aqk_ptr, base, 0, 0, _normalised_tile(a00, 0, 0, nq0, nk0, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 1, 0, _normalised_tile(a10, 1, 0, nq1, nk0, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 1, 1, _normalised_tile(a11, 1, 1, nq1, nk1, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 2, 0, _normalised_tile(a20, 2, 0, nq2, nk0, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 2, 1, _normalised_tile(a21, 2, 1, nq2, nk1, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 2, 2, _normalised_tile(a22, 2, 2, nq2, nk2, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 3, 0, _normalised_tile(a30, 3, 0, nq3, nk0, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 3, 1, _normalised_tile(a31, 3, 1, nq3, nk1, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 3, 2, _normalised_tile(a32, 3, 2, nq3, nk2, False, BC), BT, BC)
    _store_tile(aqk_ptr, base, 3, 3, _normalised_tile(a33, 3, 3, nq3, nk3, False, BC), BT, BC)


@triton.jit
def _solve_and_store(inverse_ptr, base, a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                     BT: tl.constexpr, BC: tl.constexpr, pr: tl.constexpr):
    """(I + L)^-1: 16x16 diagonal inverses, then block forward substitution
    P_ij = -P_ii Σ_{j<=m<i} L_im P_mj, products in precision pr."""
    p00 = _unit_lower_inverse(a00, BC, pr)
    p11 = _unit_lower_inverse(a11, BC, pr)
    p22 = _unit_lower_inverse(a22, BC, pr)
    p33 = _unit_lower_inverse(a33, BC, pr)
    p10 = -_dot(p11, _dot(a10, p00, pr), pr)
    p21 = -_dot(p22, _dot(a21, p11, pr), pr)
    p20 = -_dot(p22, _dot(a20, p00, pr) + _dot(a21, p10, pr), pr)
    p32 = -_dot(p33, _dot(a32, p22, pr), pr)
    p31 = -_dot(p33, _dot(a31, p11, pr) + _dot(a32, p21, pr), pr)
    p30 = -_dot(p33, _dot(a30, p00, pr) + _dot(a31, p10, pr) + _dot(a32, p20, pr), pr)
    _store_tile(inverse_ptr, base, 0, 0, p00, BT, BC)
    _store_tile(inverse_ptr, base, 1, 0, p10, BT, BC)
    _store_tile(inverse_ptr, base, 1, 1, p11, BT, BC)
    _store_tile(inverse_ptr, base, 2, 0, p20, BT, BC)
    _store_tile(inverse_ptr, base, 2, 1, p21, BT, BC)
    _store_tile(inverse_ptr, base, 2, 2, p22, BT, BC)
    _store_tile(inverse_ptr, base, 3, 0, p30, BT, BC)
    _store_tile(inverse_ptr, base, 3, 1, p31, BT, BC)
    _store_tile(inverse_ptr, base, 3, 2, p32, BT, BC)
    _store_tile(inverse_ptr, base, 3, 3, p33, BT, BC)


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
    DOT_PRECISION: tl.constexpr, SOLVE_PRECISION: tl.constexpr,
):
    # Program (c, h, 0) computes L and its inverse, (c, h, 1) the scores A: ten [16, 16]
    # accumulators each rather than twenty in one program, which would spill.
    i_c, i_h, i_which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)
    o_c = tl.arange(0, BC)
    p_norm = base * BT + o_c
    if i_which == 0:
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, sk0, sk1, sk2, sk3, _, _, _, _ = \
            _sliced_scores(k_ptr, k_ptr, g_ptr, t0, length, i_h, stride_k, stride_k, H, K, BC,
                           BK, True, DOT_PRECISION)
        # Norms (§9 #3: eps 1e-6 inside the root), kept for stage 1b.
        nk0 = tl.rsqrt(sk0 + L2_NORM_EPS)
        nk1 = tl.rsqrt(sk1 + L2_NORM_EPS)
        nk2 = tl.rsqrt(sk2 + L2_NORM_EPS)
        nk3 = tl.rsqrt(sk3 + L2_NORM_EPS)
        tl.store(inv_norm_k_ptr + p_norm, nk0)
        tl.store(inv_norm_k_ptr + p_norm + BC, nk1)
        tl.store(inv_norm_k_ptr + p_norm + 2 * BC, nk2)
        tl.store(inv_norm_k_ptr + p_norm + 3 * BC, nk3)
        # L rows carry β / |k_i|; rows past the chunk's end have β = 0.
        p_beta = beta_ptr + (t0 + o_c) * H + i_h
        nb0 = nk0 * tl.load(p_beta, mask=o_c < length, other=0.0)
        nb1 = nk1 * tl.load(p_beta + BC * H, mask=o_c + BC < length, other=0.0)
        nb2 = nk2 * tl.load(p_beta + 2 * BC * H, mask=o_c + 2 * BC < length, other=0.0)
        nb3 = nk3 * tl.load(p_beta + 3 * BC * H, mask=o_c + 3 * BC < length, other=0.0)
        _solve_and_store(
            inverse_ptr, base,
            _normalised_tile(a00, 0, 0, nb0, nk0, True, BC),
            _normalised_tile(a10, 1, 0, nb1, nk0, True, BC),
            _normalised_tile(a11, 1, 1, nb1, nk1, True, BC),
            _normalised_tile(a20, 2, 0, nb2, nk0, True, BC),
            _normalised_tile(a21, 2, 1, nb2, nk1, True, BC),
            _normalised_tile(a22, 2, 2, nb2, nk2, True, BC),
            _normalised_tile(a30, 3, 0, nb3, nk0, True, BC),
            _normalised_tile(a31, 3, 1, nb3, nk1, True, BC),
            _normalised_tile(a32, 3, 2, nb3, nk2, True, BC),
            _normalised_tile(a33, 3, 3, nb3, nk3, True, BC),
            BT, BC, SOLVE_PRECISION)
    else:
        a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, sq0, sq1, sq2, sq3, sk0, sk1, sk2, \
            sk3 = _sliced_scores(q_ptr, k_ptr, g_ptr, t0, length, i_h, stride_q, stride_k, H, K,
                                 BC, BK, False, DOT_PRECISION)
        nq0 = tl.rsqrt(sq0 + L2_NORM_EPS) * scale
        nq1 = tl.rsqrt(sq1 + L2_NORM_EPS) * scale
        nq2 = tl.rsqrt(sq2 + L2_NORM_EPS) * scale
        nq3 = tl.rsqrt(sq3 + L2_NORM_EPS) * scale
        tl.store(inv_norm_q_ptr + p_norm, nq0)
        tl.store(inv_norm_q_ptr + p_norm + BC, nq1)
        tl.store(inv_norm_q_ptr + p_norm + 2 * BC, nq2)
        tl.store(inv_norm_q_ptr + p_norm + 3 * BC, nq3)
        _store_scores(aqk_ptr, base, a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                      nq0, nq1, nq2, nq3, tl.rsqrt(sk0 + L2_NORM_EPS),
                      tl.rsqrt(sk1 + L2_NORM_EPS), tl.rsqrt(sk2 + L2_NORM_EPS),
                      tl.rsqrt(sk3 + L2_NORM_EPS), BT, BC)


def kda_prefill_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scale: float,
    block_k: int = 32,
    num_warps: int = 4,
    tf32_solve: bool = False,
) -> dict[str, torch.Tensor]:
    """Stage 1a over C chunks. q, k: [T, H, K] (token stride free, head and channel dense);
    g fp32 [T, H, K]; beta fp32 [T, H]; chunk_start, chunk_len int32 [C] -> {"aqk",
    "inverse": fp32 [C, H, BT, BT] (lower tiles written), "inv_norm_q", "inv_norm_k": fp32
    [C, H, BT]}. ``block_k`` (channels per slice) and ``num_warps`` are tuning knobs;
    ``tf32_solve``: the solve's products in TF32 where the scores use it (BF16/FP16 inputs on
    hardware with TF32, as fla's solve_tril), else IEEE fp32."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_chunks = chunk_start.shape[0]
    rows = (max(num_chunks, 1), num_heads, CHUNK_SIZE)
    out = {name: torch.empty(*rows, CHUNK_SIZE, dtype=torch.float32, device=q.device)
           for name in ("aqk", "inverse")}
    out.update({name: torch.empty(rows, dtype=torch.float32, device=q.device)
                for name in ("inv_norm_q", "inv_norm_k")})
    if num_chunks == 0:
        return out
    kda_prefill_scores_kernel[(num_chunks, num_heads, 2)](
        q, k, g, beta, chunk_start, chunk_len,
        out["aqk"], out["inverse"], out["inv_norm_q"], out["inv_norm_k"],
        q.stride(0), k.stride(0), scale,
        H=num_heads, K=head_dim, BT=CHUNK_SIZE, BC=SUB_CHUNK_SIZE,
        BK=min(block_k, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(kda_prefill_scores_kernel, q.dtype),
        SOLVE_PRECISION=dot_precision(kda_prefill_scores_kernel, q.dtype) if tf32_solve
        else "ieee",
        num_warps=num_warps,
    )
    return out
