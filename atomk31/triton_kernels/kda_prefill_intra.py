"""KDA chunked prefill, stage 1 of 2: everything inside one chunk (MODEL_SPEC §4.4, chunked form).

One program per (chunk, head). With ``Γ_i = Σ_{j<=i} g_j`` from the chunk start, scaled and
normalised ``q̂``, ``k̂``, it writes what the sequential stage (``kda_prefill_state.py``) needs:

* ``aqk [BT, BT]``: ``A[i,j] = Σ_d q̂_i k̂_j exp(Γ_i - Γ_j)`` for j <= i (0 above),
* ``w [BT, K] = (I + L)^-1 (β ⊙ exp(Γ) ⊙ k̂)`` and ``u [BT, V] = (I + L)^-1 (β ⊙ v)`` with
  ``L[i,j] = β_i Σ_d k̂_i k̂_j exp(Γ_i - Γ_j)`` (j < i),
* ``qg = q̂ ⊙ exp(Γ)``, ``kd = k̂ ⊙ exp(Γ_last - Γ)`` and ``decay = exp(Γ_last) [K]``.

Numerics (§4.4): ``exp(Γ_i - Γ_j)`` is factorised as ``exp(Γ_i - Γ_r) · exp(Γ_r - Γ_j)`` with
``r`` the last row of j's 16-token sub-chunk, so every factor stays inside fp32's range while
each per-token decay is at least -5.8 (K3.1's floor is -5; the null-bound gate, whose g is
unbounded, must use the torch op). The unit lower-triangular solve is blockwise over the
4 sub-chunks: 16x16 diagonal inverses from the exact product (I - A)(I + A²)(I + A⁴)(I + A⁸)
and block forward substitution, all in IEEE fp32. Rows past a short chunk's end load as
zeros, which makes their rows of every output zero (and their rows of the inverse identity).

Provenance: the 16-token sub-chunking with a per-sub-chunk reference point follows
flash-linear-attention's chunk_kda (fla/ops/kda/chunk_intra.py, ``safe_gate``); code is ours.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import dot_precision

# §9 #3: the KDA l2 norms of q and k use 1e-6.
L2_NORM_EPS = tl.constexpr(1e-6)
CHUNK_SIZE = 64
SUB_CHUNK_SIZE = 16


@triton.jit
def _unit_lower_inverse(b_a, BC: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BC, BC] tile with BC = 16: A^16 = 0, so
    (I - A)(I + A^2)(I + A^4)(I + A^8) is the exact inverse."""
    o_c = tl.arange(0, BC)
    b_p = (o_c[:, None] == o_c[None, :]).to(tl.float32) - b_a
    b_power = tl.dot(b_a, b_a, input_precision="ieee")
    b_p = b_p + tl.dot(b_p, b_power, input_precision="ieee")
    b_power = tl.dot(b_power, b_power, input_precision="ieee")
    b_p = b_p + tl.dot(b_p, b_power, input_precision="ieee")
    b_power = tl.dot(b_power, b_power, input_precision="ieee")
    return b_p + tl.dot(b_p, b_power, input_precision="ieee")


@triton.jit
def _ieee_dot(b_a, b_b):
    return tl.dot(b_a, b_b, input_precision="ieee")


@triton.jit
def _load_tile(p_a, i_i: tl.constexpr, i_j: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Sub-block (i_i, i_j) of a [BT, BT] matrix; a diagonal block keeps its strict lower part."""
    o_c = tl.arange(0, BC)
    p_tile = p_a + (i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :]
    if i_i == i_j:
        return tl.load(p_tile, mask=o_c[:, None] > o_c[None, :], other=0.0)
    return tl.load(p_tile)


@triton.jit
def _load_rows(p_base, rows, stride, o_d, m_rows, m_d):
    """[BC, BLOCK_D] fp32 rows of a token-major tensor (zeros past the chunk's end)."""
    return tl.load(p_base + rows[:, None] * stride + o_d[None, :],
                   mask=m_rows[:, None] & m_d[None, :], other=0.0).to(tl.float32)


@triton.jit
def _l2_normalize(b_x):
    return b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) + L2_NORM_EPS)[:, None]


@triton.jit
def _gated_key(
    k_ptr, g_ptr, beta_ptr, t0, length, i_h, i_j: tl.constexpr, b_carry, stride_k,
    H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Right-hand side of w for sub-chunk i_j: (β ⊙ exp(Γ) ⊙ k̂, Γ at its last row)."""
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < K
    o_j = i_j * BC + tl.arange(0, BC)
    m_j = o_j < length
    rows = (t0 + o_j).to(tl.int64)
    b_k = _l2_normalize(_load_rows(k_ptr + i_h * K, rows, stride_k, o_k, m_j, m_k))
    b_g = _load_rows(g_ptr + i_h * K, rows, H * K, o_k, m_j, m_k)
    b_beta = tl.load(beta_ptr + rows * H + i_h, mask=m_j, other=0.0).to(tl.float32)
    b_gamma = b_carry[None, :] + tl.cumsum(b_g, axis=0)
    return b_beta[:, None] * tl.exp(b_gamma) * b_k, b_carry + tl.sum(b_g, axis=0)


@triton.jit
def _weighted_value(
    v_ptr, beta_ptr, t0, length, i_h, i_j: tl.constexpr, stride_v, H: tl.constexpr,
    V: tl.constexpr, BC: tl.constexpr, o_v, m_v,
):
    """Right-hand side of u for sub-chunk i_j: β ⊙ v."""
    o_j = i_j * BC + tl.arange(0, BC)
    m_j = o_j < length
    rows = (t0 + o_j).to(tl.int64)
    b_v = _load_rows(v_ptr + i_h * V, rows, stride_v, o_v, m_j, m_v)
    b_beta = tl.load(beta_ptr + rows * H + i_h, mask=m_j, other=0.0).to(tl.float32)
    return b_beta[:, None] * b_v


@triton.jit
def _apply_inverse(
    b_p00, b_p10, b_p11, b_p20, b_p21, b_p22, b_p30, b_p31, b_p32, b_p33,
    b_x0, b_x1, b_x2, b_x3, out_ptr, base, BT: tl.constexpr, BC: tl.constexpr,
    D: tl.constexpr, o_d, m_d, DOT_PRECISION: tl.constexpr,
):
    """out [BT, D] rows of this (chunk, head) = P x, with P block lower-triangular in
    16-row sub-chunks and x given as its four [BC, BLOCK_D] sub-chunks."""
    b_out = tl.dot(b_p00, b_x0, input_precision=DOT_PRECISION)
    _store_sub_chunk(out_ptr, base, 0, BT, BC, D, o_d, m_d, b_out)
    b_out = tl.dot(b_p10, b_x0, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p11, b_x1, b_out, input_precision=DOT_PRECISION)
    _store_sub_chunk(out_ptr, base, 1, BT, BC, D, o_d, m_d, b_out)
    b_out = tl.dot(b_p20, b_x0, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p21, b_x1, b_out, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p22, b_x2, b_out, input_precision=DOT_PRECISION)
    _store_sub_chunk(out_ptr, base, 2, BT, BC, D, o_d, m_d, b_out)
    b_out = tl.dot(b_p30, b_x0, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p31, b_x1, b_out, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p32, b_x2, b_out, input_precision=DOT_PRECISION)
    b_out = tl.dot(b_p33, b_x3, b_out, input_precision=DOT_PRECISION)
    _store_sub_chunk(out_ptr, base, 3, BT, BC, D, o_d, m_d, b_out)


@triton.jit
def _store_sub_chunk(out_ptr, base, i_i: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                     D: tl.constexpr, o_d, m_d, b_out):
    p_rows = (base * BT + i_i * BC + tl.arange(0, BC))[:, None]
    tl.store(out_ptr + p_rows * D + o_d[None, :], b_out.to(out_ptr.dtype.element_ty),
             mask=m_d[None, :])


@triton.jit
def _row_sub_chunk(
    q_ptr, k_ptr, g_ptr, beta_ptr, qg_ptr, kd_ptr, t0, length, i_h, i_i, b_carry, b_g_total,
    base, stride_q, stride_k, scale, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BC: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Row sub-chunk i_i (b_carry = Γ at its start): stores its qg and kd rows and returns
    (q̂, k̂, β, Γ, Γ at its last row)."""
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < K
    o_i = i_i * BC + tl.arange(0, BC)
    m_i = o_i < length
    rows = t0 + o_i
    b_q = _l2_normalize(_load_rows(q_ptr + i_h * K, rows, stride_q, o_k, m_i, m_k)) * scale
    b_k = _l2_normalize(_load_rows(k_ptr + i_h * K, rows, stride_k, o_k, m_i, m_k))
    b_g = _load_rows(g_ptr + i_h * K, rows, H * K, o_k, m_i, m_k)
    b_beta = tl.load(beta_ptr + rows * H + i_h, mask=m_i, other=0.0).to(tl.float32)
    b_gamma = b_carry[None, :] + tl.cumsum(b_g, axis=0)
    p_rows = (base * BT + o_i)[:, None]
    tl.store(qg_ptr + p_rows * K + o_k[None, :],
             (b_q * tl.exp(b_gamma)).to(qg_ptr.dtype.element_ty), mask=m_k[None, :])
    tl.store(kd_ptr + p_rows * K + o_k[None, :],
             (b_k * tl.exp(b_g_total[None, :] - b_gamma)).to(kd_ptr.dtype.element_ty),
             mask=m_k[None, :])
    return b_q, b_k, b_beta, b_gamma, b_carry + tl.sum(b_g, axis=0)


@triton.jit
def _right_tile(
    k_ptr, g_ptr, t0, length, i_h, i_j, b_carry, stride_k, H: tl.constexpr, K: tl.constexpr,
    BC: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Column sub-chunk i_j (b_carry = Γ at its start) -> (k̂ exp(Γ_ref - Γ), Γ_ref), with
    Γ_ref = Γ at its last row: exponents in [0, 15 x 5.8], inside fp32's range."""
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < K
    o_j = i_j * BC + tl.arange(0, BC)
    rows = t0 + o_j
    b_k = _l2_normalize(_load_rows(k_ptr + i_h * K, rows, stride_k, o_k, o_j < length, m_k))
    b_g = _load_rows(g_ptr + i_h * K, rows, H * K, o_k, o_j < length, m_k)
    b_gamma = b_carry[None, :] + tl.cumsum(b_g, axis=0)
    b_gamma_ref = b_carry + tl.sum(b_g, axis=0)
    return b_k * tl.exp(b_gamma_ref[None, :] - b_gamma), b_gamma_ref


@triton.jit
def _score_tiles(
    akk_ptr, aqk_ptr, base, i_i, i_j, b_q, b_k, b_beta, b_gamma_i, b_right, b_gamma_ref,
    BT: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Tiles (i_i, i_j) of L (β-weighted, strictly lower) and of A (lower, with diagonal)."""
    o_i = i_i * BC + tl.arange(0, BC)
    o_j = i_j * BC + tl.arange(0, BC)
    # exp(Γ_i - Γ_j) = exp(Γ_i - Γ_ref) * exp(Γ_ref - Γ_j), each factor in range.
    b_left = tl.exp(b_gamma_i - b_gamma_ref[None, :])
    b_akk = tl.dot(b_k * b_left, tl.trans(b_right), input_precision=DOT_PRECISION)
    b_aqk = tl.dot(b_q * b_left, tl.trans(b_right), input_precision=DOT_PRECISION)
    is_below = i_j < i_i
    b_akk = tl.where((o_i[:, None] > o_j[None, :]) | is_below, b_akk * b_beta[:, None], 0.0)
    b_aqk = tl.where((o_i[:, None] >= o_j[None, :]) | is_below, b_aqk, 0.0)
    p_tile = (base * BT + o_i)[:, None] * BT + o_j[None, :]
    tl.store(akk_ptr + p_tile, b_akk)
    tl.store(aqk_ptr + p_tile, b_aqk.to(aqk_ptr.dtype.element_ty))


@triton.jit
def kda_prefill_intra_kernel(
    # pointers: inputs (token-major [T, H, *]) and the chunk table
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    # pointers: outputs, [C, H, BT, *]; akk is scratch for the solve
    akk_ptr, aqk_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr,
    # strides (elements between consecutive tokens) and the q scale
    stride_q, stride_k, stride_v, scale,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
    CACHE_RIGHT: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    o_k, o_v, o_t = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V), tl.arange(0, BT)
    m_k, m_v = o_k < K, o_v < V
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)

    # Γ_last: the whole chunk's log-decay per key channel.
    b_g_total = tl.sum(_load_rows(g_ptr + i_h * K, t0 + o_t, H * K, o_k, o_t < length, m_k),
                       axis=0)
    tl.store(decay_ptr + base * K + o_k, tl.exp(b_g_total), mask=m_k)

    # Phase 1, per row sub-chunk i_i: qg, kd and the score tiles A[i_i, 0..i_i].
    if CACHE_RIGHT:
        # The four right-hand tiles k̂_j exp(Γ_ref - Γ_j) computed once and kept in registers.
        b_right0, b_ref0 = _right_tile(k_ptr, g_ptr, t0, length, i_h, 0, tl.zeros([BLOCK_K],
                                       dtype=tl.float32), stride_k, H, K, BC, BLOCK_K)
        b_right1, b_ref1 = _right_tile(k_ptr, g_ptr, t0, length, i_h, 1, b_ref0, stride_k, H, K,
                                       BC, BLOCK_K)
        b_right2, b_ref2 = _right_tile(k_ptr, g_ptr, t0, length, i_h, 2, b_ref1, stride_k, H, K,
                                       BC, BLOCK_K)
        b_right3, b_ref3 = _right_tile(k_ptr, g_ptr, t0, length, i_h, 3, b_ref2, stride_k, H, K,
                                       BC, BLOCK_K)
        b_carry_i = tl.zeros([BLOCK_K], dtype=tl.float32)
        for i_i in tl.static_range(BT // BC):
            b_q, b_k, b_beta, b_gamma_i, b_carry_next = _row_sub_chunk(
                q_ptr, k_ptr, g_ptr, beta_ptr, qg_ptr, kd_ptr, t0, length, i_h, i_i, b_carry_i,
                b_g_total, base, stride_q, stride_k, scale, H, K, BT, BC, BLOCK_K)
            for i_j in tl.static_range(i_i + 1):
                if i_j == 0:
                    b_right, b_gamma_ref = b_right0, b_ref0
                elif i_j == 1:
                    b_right, b_gamma_ref = b_right1, b_ref1
                elif i_j == 2:
                    b_right, b_gamma_ref = b_right2, b_ref2
                else:
                    b_right, b_gamma_ref = b_right3, b_ref3
                _score_tiles(akk_ptr, aqk_ptr, base, i_i, i_j, b_q, b_k, b_beta, b_gamma_i,
                             b_right, b_gamma_ref, BT, BC, DOT_PRECISION)
            b_carry_i = b_carry_next
    else:
        # The right-hand tiles recomputed for every row sub-chunk: fewer live registers.
        b_carry_i = tl.zeros([BLOCK_K], dtype=tl.float32)
        for i_i in range(0, BT // BC):
            b_q, b_k, b_beta, b_gamma_i, b_carry_next = _row_sub_chunk(
                q_ptr, k_ptr, g_ptr, beta_ptr, qg_ptr, kd_ptr, t0, length, i_h, i_i, b_carry_i,
                b_g_total, base, stride_q, stride_k, scale, H, K, BT, BC, BLOCK_K)
            b_carry_j = tl.zeros([BLOCK_K], dtype=tl.float32)
            for i_j in range(0, i_i + 1):
                b_right, b_gamma_ref = _right_tile(k_ptr, g_ptr, t0, length, i_h, i_j, b_carry_j,
                                                   stride_k, H, K, BC, BLOCK_K)
                _score_tiles(akk_ptr, aqk_ptr, base, i_i, i_j, b_q, b_k, b_beta, b_gamma_i,
                             b_right, b_gamma_ref, BT, BC, DOT_PRECISION)
                b_carry_j = b_gamma_ref
            b_carry_i = b_carry_next

    # Phase 2 reads the L tiles this program wrote: make them visible to all its threads.
    tl.debug_barrier()
    p_akk = akk_ptr + base * BT * BT
    b_p00 = _unit_lower_inverse(_load_tile(p_akk, 0, 0, BT, BC), BC)
    b_p11 = _unit_lower_inverse(_load_tile(p_akk, 1, 1, BT, BC), BC)
    b_p22 = _unit_lower_inverse(_load_tile(p_akk, 2, 2, BT, BC), BC)
    b_p33 = _unit_lower_inverse(_load_tile(p_akk, 3, 3, BT, BC), BC)
    b_a10 = _load_tile(p_akk, 1, 0, BT, BC)
    b_a20 = _load_tile(p_akk, 2, 0, BT, BC)
    b_a21 = _load_tile(p_akk, 2, 1, BT, BC)
    b_a30 = _load_tile(p_akk, 3, 0, BT, BC)
    b_a31 = _load_tile(p_akk, 3, 1, BT, BC)
    b_a32 = _load_tile(p_akk, 3, 2, BT, BC)
    # Block forward substitution: P_ij = -P_ii Σ_{j<=m<i} A_im P_mj.
    b_p10 = -_ieee_dot(b_p11, _ieee_dot(b_a10, b_p00))
    b_p21 = -_ieee_dot(b_p22, _ieee_dot(b_a21, b_p11))
    b_p20 = -_ieee_dot(b_p22, _ieee_dot(b_a20, b_p00) + _ieee_dot(b_a21, b_p10))
    b_p32 = -_ieee_dot(b_p33, _ieee_dot(b_a32, b_p22))
    b_p31 = -_ieee_dot(b_p33, _ieee_dot(b_a31, b_p11) + _ieee_dot(b_a32, b_p21))
    b_p30 = -_ieee_dot(b_p33, _ieee_dot(b_a30, b_p00) + _ieee_dot(b_a31, b_p10)
                       + _ieee_dot(b_a32, b_p20))

    # Phase 2b: w = P (β exp(Γ) k̂), then u = P (β v): one right-hand side at a time keeps
    # only four [BC, BLOCK_*] sub-chunks live.
    b_carry = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_x0, b_carry = _gated_key(k_ptr, g_ptr, beta_ptr, t0, length, i_h, 0, b_carry, stride_k,
                               H, K, BC, BLOCK_K)
    b_x1, b_carry = _gated_key(k_ptr, g_ptr, beta_ptr, t0, length, i_h, 1, b_carry, stride_k,
                               H, K, BC, BLOCK_K)
    b_x2, b_carry = _gated_key(k_ptr, g_ptr, beta_ptr, t0, length, i_h, 2, b_carry, stride_k,
                               H, K, BC, BLOCK_K)
    b_x3, b_carry = _gated_key(k_ptr, g_ptr, beta_ptr, t0, length, i_h, 3, b_carry, stride_k,
                               H, K, BC, BLOCK_K)
    _apply_inverse(b_p00, b_p10, b_p11, b_p20, b_p21, b_p22, b_p30, b_p31, b_p32, b_p33,
                   b_x0, b_x1, b_x2, b_x3, w_ptr, base, BT, BC, K, o_k, m_k, DOT_PRECISION)
    b_y0 = _weighted_value(v_ptr, beta_ptr, t0, length, i_h, 0, stride_v, H, V, BC, o_v, m_v)
    b_y1 = _weighted_value(v_ptr, beta_ptr, t0, length, i_h, 1, stride_v, H, V, BC, o_v, m_v)
    b_y2 = _weighted_value(v_ptr, beta_ptr, t0, length, i_h, 2, stride_v, H, V, BC, o_v, m_v)
    b_y3 = _weighted_value(v_ptr, beta_ptr, t0, length, i_h, 3, stride_v, H, V, BC, o_v, m_v)
    _apply_inverse(b_p00, b_p10, b_p11, b_p20, b_p21, b_p22, b_p30, b_p31, b_p32, b_p33,
                   b_y0, b_y1, b_y2, b_y3, u_ptr, base, BT, BC, V, o_v, m_v, DOT_PRECISION)


def empty_intermediates(num_chunks: int, num_heads: int, head_dim: int, value_dim: int,
                        intermediate_dtype: torch.dtype, device: torch.device,
                        aqk: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Stage 1's outputs, allocated ({"w", "u", "qg", "kd", "aqk", "decay"}, shapes as
    kda_prefill_intra returns them), shared by the one- and two-kernel stage 1; `aqk` when
    an earlier kernel already wrote it."""
    rows = (max(num_chunks, 1), num_heads, CHUNK_SIZE)
    if aqk is None:
        aqk = torch.empty(*rows, CHUNK_SIZE, dtype=torch.float32, device=device)
    return {
        "w": torch.empty(*rows, head_dim, dtype=intermediate_dtype, device=device),
        "u": torch.empty(*rows, value_dim, dtype=intermediate_dtype, device=device),
        "qg": torch.empty(*rows, head_dim, dtype=intermediate_dtype, device=device),
        "kd": torch.empty(*rows, head_dim, dtype=intermediate_dtype, device=device),
        "aqk": aqk,
        "decay": torch.empty(rows[0], num_heads, head_dim, dtype=torch.float32, device=device),
    }


def kda_prefill_intra(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scale: float,
    intermediate_dtype: torch.dtype,
    num_warps: int = 4,
    cache_right: bool = False,
) -> dict[str, torch.Tensor]:
    """Stage 1 over C chunks. q, k: [T, H, K] (token stride free, head and channel dense);
    v: [T, H, V]; g fp32 [T, H, K]; beta fp32 [T, H]; chunk_start, chunk_len int32 [C]
    -> {"w": [C, H, BT, K], "u": [C, H, BT, V], "qg", "kd": [C, H, BT, K] in
    intermediate_dtype; "aqk": fp32 [C, H, BT, BT]; "decay": fp32 [C, H, K]}. ``num_warps``
    and ``cache_right`` (the four right-hand score tiles kept in registers rather than
    recomputed per row sub-chunk) are tuning knobs."""
    num_tokens, num_heads, head_dim = q.shape
    value_dim = v.shape[-1]
    num_chunks = chunk_start.shape[0]
    device = q.device
    rows = (max(num_chunks, 1), num_heads, CHUNK_SIZE)
    out = empty_intermediates(num_chunks, num_heads, head_dim, value_dim, intermediate_dtype,
                              device)
    if num_chunks == 0:
        return out
    akk = torch.empty(*rows, CHUNK_SIZE, dtype=torch.float32, device=device)
    kda_prefill_intra_kernel[(num_chunks, num_heads)](
        q, k, v, g, beta, chunk_start, chunk_len,
        akk, out["aqk"], out["qg"], out["kd"], out["w"], out["u"], out["decay"],
        q.stride(0), k.stride(0), v.stride(0), scale,
        H=num_heads, K=head_dim, V=value_dim, BT=CHUNK_SIZE, BC=SUB_CHUNK_SIZE,
        BLOCK_K=triton.next_power_of_2(head_dim), BLOCK_V=triton.next_power_of_2(value_dim),
        DOT_PRECISION=dot_precision(kda_prefill_intra_kernel, q.dtype), CACHE_RIGHT=cache_right,
        num_warps=num_warps,
    )
    return out
