"""KDA chunked prefill, stage 1a as one program per (chunk, head) with [64, 64] accumulators.

Writes, per chunk and head, the scores ``aqk``: ``A[i,j] = Σ_d q̂_i k̂_j exp(Γ_i - Γ_j)`` for
j <= i, the inverse ``(I + L)^-1`` with ``L[i,j] = β_i Σ_d k̂_i k̂_j exp(Γ_i - Γ_j)``, j < i,
and the inverse norms (``scale / |q_i|``, ``1 / |k_i|``), read by ``kda_prefill_gated.py``
or, with the gated rows, by stage 2. Why this shape: [16, 16] score tiles cost ~1340
instructions and 36 barriers per channel slice (layout conversions of twenty small operands)
and [64, 16] column blocks reload and re-scan each key block per slice; here each slice is
loaded and scanned once, and every product is a full [64, BK] x [BK, 64] tensor-core matmul
into one [64, 64] accumulator for A and one for L:

    A += Σ_j (q ⊙ exp(Γ - Γ_r(j))) (k ⊙ exp(Γ_r(j) - Γ) ⊙ [row in block j])^T

with ``Γ_r(j)`` Γ at the last row of 16-token block j. The key operand of block j is zero
outside block j's rows, so each product fills only block j's columns, and the sum over j is
A itself; the matrix work is 4x what the sub-blocks need, cheap next to the exponentials
(the tensor cores run at a few percent of their rate in this stage). Each product costs a
round trip of its operands through shared memory and barriers (~34 per slice at 32 channels);
``JOINED`` makes the block index part of the contraction instead, one [64, 4 BK] x [4 BK, 64]
product per slice for A and one for L (12 barriers per 16-channel slice on sm_90).

Numerics (§4.4): ``exp(Γ_i - Γ_j) = exp(Γ_i - Γ_r) · exp(Γ_r - Γ_j)``. The key factor ``exp(Γ_r(j) - Γ_t)`` is <= 1
for t in block j; the query factor ``exp(Γ_i - Γ_r(j))`` is <= 1 below block j and at most
``exp(15 x 5.8)`` inside it (the -5.8 floor of kda_prefill_intra.py); rows above block j get
an exponent of -inf (0), never an overflow.

The solve: L (scaled, strictly lower) goes to an fp32 scratch, the program reads its ten
[16, 16] tiles back (a barrier between: other threads wrote them) and runs the blockwise solve
of ``kda_prefill_solve.py``, IEEE fp32 unless asked for TF32.

With ``GATED_ROWS`` (``KdaPrefillTuning.fold_w_u``) the same program also writes, slice by
slice, what stage 1b would have (kda_prefill_gated.py) less its products: qg, kd, decay and
kb = β k̂ ⊙ exp(Γ), for stage 2 to form w S and u as P (β v - kb S). Those rows are
normalised, so the norms come first, from a pass over q and k (cache hits for the main
loop); sm_90: 254 registers, no stack (247 without), ~13% more instructions.

Products: fp32 operands at DOT_PRECISION (IEEE for fp32 inputs, TF32 for 16-bit ones on
NVIDIA), or with BF16_SCORES (16-bit inputs only, not under the interpreter) BF16 operands
with fp32 accumulation.
"""

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from atomk31.triton_kernels.kda_prefill_intra import CHUNK_SIZE, L2_NORM_EPS, SUB_CHUNK_SIZE
from atomk31.triton_kernels.kda_prefill_solve import empty_scores, score_product, solve_stored_l
from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning
from atomk31.triton_kernels.runtime import dot_precision, runs_on_interpreter

# Γ is kept in base 2 (Γ₂ = Γ log2 e, as fla's cumsum stores it): every exponential is then a
# bare exp2, without tl.exp's multiply (sm_90: 3984 -> 3736 instructions, 4512 -> 4064 with
# the gated rows). Exponent limits in base 2: 15 x 5.8 x log2 e = 125.5 < 128.
LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def _block_reference(b_gamma, o_t, j: tl.constexpr, BC: tl.constexpr):
    """Γ at the last row of block j, [BK] (the row picked by a masked column sum)."""
    return tl.sum(tl.where((o_t == j * BC + BC - 1)[:, None], b_gamma, 0.0), axis=0)


@triton.jit
def _add_block(b_acc_a, b_acc_l, b_q, b_k, b_gamma, b_right, b_ref, o_t, j: tl.constexpr,
               BC: tl.constexpr, BF16_SCORES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Block j's columns of A and L (raw: no norms, no β) from one channel slice."""
    b_exponent = tl.where((o_t >= j * BC)[:, None], b_gamma - b_ref[None, :], float("-inf"))
    b_left = tl.exp2(b_exponent)                                             # [BT, BK]
    b_right_t = tl.trans(tl.where((o_t // BC == j)[:, None], b_right, 0.0))  # [BK, BT]
    b_acc_a = score_product(b_q * b_left, b_right_t, b_acc_a, BF16_SCORES, DOT_PRECISION)
    b_acc_l = score_product(b_k * b_left, b_right_t, b_acc_l, BF16_SCORES, DOT_PRECISION)
    return b_acc_a, b_acc_l


@triton.jit
def _add_slice_by_blocks(b_acc_a, b_acc_l, b_q, b_k, b_gamma, o_t, BC: tl.constexpr,
                         BF16_SCORES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One channel slice's four blocks, one product each for A and for L."""
    ref0 = _block_reference(b_gamma, o_t, 0, BC)
    ref1 = _block_reference(b_gamma, o_t, 1, BC)
    ref2 = _block_reference(b_gamma, o_t, 2, BC)
    ref3 = _block_reference(b_gamma, o_t, 3, BC)
    # Each key row against its own block's reference: exponents <= 0, one exp per element.
    b_block = o_t // BC
    b_ref_rows = tl.where((b_block == 0)[:, None], ref0[None, :],
                          tl.where((b_block == 1)[:, None], ref1[None, :],
                                   tl.where((b_block == 2)[:, None], ref2[None, :],
                                            ref3[None, :])))
    b_right = b_k * tl.exp2(b_ref_rows - b_gamma)
    b_acc_a, b_acc_l = _add_block(b_acc_a, b_acc_l, b_q, b_k, b_gamma, b_right, ref0, o_t, 0,
                                  BC, BF16_SCORES, DOT_PRECISION)
    b_acc_a, b_acc_l = _add_block(b_acc_a, b_acc_l, b_q, b_k, b_gamma, b_right, ref1, o_t, 1,
                                  BC, BF16_SCORES, DOT_PRECISION)
    b_acc_a, b_acc_l = _add_block(b_acc_a, b_acc_l, b_q, b_k, b_gamma, b_right, ref2, o_t, 2,
                                  BC, BF16_SCORES, DOT_PRECISION)
    return _add_block(b_acc_a, b_acc_l, b_q, b_k, b_gamma, b_right, ref3, o_t, 3, BC,
                      BF16_SCORES, DOT_PRECISION)


@triton.jit
def _add_slice_joined(b_acc_a, b_acc_l, b_q, b_k, b_gamma, o_t, BT: tl.constexpr,
                      BC: tl.constexpr, BK: tl.constexpr, BF16_SCORES: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """One channel slice's four blocks as ONE product each for A and for L: the block index
    joins the channel index in the contraction ([BT, BK * 4] x [BK * 4, BT])."""
    NB: tl.constexpr = BT // BC
    o_b = tl.arange(0, NB)
    o_c = tl.arange(0, BC)
    b_gamma3 = tl.reshape(b_gamma, [NB, BC, BK])
    b_refs = tl.sum(tl.where((o_c == BC - 1)[None, :, None], b_gamma3, 0.0), axis=1)
    b_ref_rows = tl.reshape(tl.broadcast_to(b_refs[:, None, :], [NB, BC, BK]), [BT, BK])
    b_right = b_k * tl.exp2(b_ref_rows - b_gamma)
    b_right3 = tl.where((o_t // BC)[:, None, None] == o_b[None, None, :], b_right[:, :, None],
                        0.0)                                                  # [BT, BK, NB]
    b_right_t = tl.trans(tl.reshape(b_right3, [BT, BK * NB]))
    b_exponent = tl.where((o_t[:, None, None] >= o_b[None, None, :] * BC),
                          b_gamma[:, :, None] - tl.trans(b_refs)[None, :, :], float("-inf"))
    b_left = tl.exp2(b_exponent)                                               # [BT, BK, NB]
    b_acc_a = score_product(tl.reshape(b_q[:, :, None] * b_left, [BT, BK * NB]), b_right_t,
                             b_acc_a, BF16_SCORES, DOT_PRECISION)
    b_acc_l = score_product(tl.reshape(b_k[:, :, None] * b_left, [BT, BK * NB]), b_right_t,
                             b_acc_l, BF16_SCORES, DOT_PRECISION)
    return b_acc_a, b_acc_l


@triton.jit
def _inverse_norms(q_ptr, k_ptr, rows, m_t, i_h, stride_q, stride_k, scale, K: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr):
    """scale / |q| and 1 / |k| per row [BT] (§9 #3: eps 1e-6 inside the root)."""
    b_sum_q = tl.zeros([BT], dtype=tl.float32)
    b_sum_k = tl.zeros([BT], dtype=tl.float32)
    for k_start in range(0, K, BK):
        o_k = k_start + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        b_q = tl.load(q_ptr + i_h * K + rows * stride_q + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_sum_q += tl.sum(b_q * b_q, axis=1)
        b_sum_k += tl.sum(b_k * b_k, axis=1)
    return tl.rsqrt(b_sum_q + L2_NORM_EPS) * scale, tl.rsqrt(b_sum_k + L2_NORM_EPS)


@triton.jit
def _store_gated_rows(qg_ptr, kd_ptr, kb_ptr, decay_ptr, base, b_q, b_k, b_gamma, b_norm_q,
                      b_norm_k, b_beta, o_t, o_k, K: tl.constexpr, BT: tl.constexpr,
                      BC: tl.constexpr):
    """One channel slice of qg = q̂ ⊙ exp(Γ), kd = k̂ ⊙ exp(Γ_last - Γ), kb = β k̂ ⊙ exp(Γ)
    (w = P kb, formed in stage 2) and decay = exp(Γ_last), as kda_prefill_gated.py writes
    them. Rows past the chunk's end load g = 0, so Γ_last is the last row's Γ: the last
    block's reference, the same expression as _add_slice_by_blocks' (one reduction after CSE)."""
    m_k = o_k < K
    b_growth = tl.exp2(b_gamma)
    b_gamma_last = _block_reference(b_gamma, o_t, BT // BC - 1, BC)
    b_k_hat = b_k * b_norm_k[:, None]
    p_out = (base * BT + o_t)[:, None] * K + o_k[None, :]
    out_dtype = qg_ptr.dtype.element_ty
    tl.store(qg_ptr + p_out, (b_q * b_norm_q[:, None] * b_growth).to(out_dtype),
             mask=m_k[None, :])
    tl.store(kd_ptr + p_out, (b_k_hat * tl.exp2(b_gamma_last[None, :] - b_gamma)).to(out_dtype),
             mask=m_k[None, :])
    tl.store(kb_ptr + p_out, (b_k_hat * b_beta[:, None] * b_growth).to(out_dtype),
             mask=m_k[None, :])
    tl.store(decay_ptr + base * K + o_k, tl.exp2(b_gamma_last), mask=m_k)


@triton.jit
def kda_prefill_scores_wide_kernel(
    # pointers: inputs (token-major [T, H, *]) and the chunk table
    q_ptr, k_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    # pointers: outputs, aqk and inverse [C, H, BT, BT], the norms [C, H, BT]; fp32 scratch
    # for L [C, H, BT, BT] (the inverse buffer itself when that is fp32)
    aqk_ptr, inverse_ptr, inv_norm_q_ptr, inv_norm_k_ptr, l_ptr,
    # GATED_ROWS only: the gated rows qg, kd, kb [C, H, BT, K] and decay [C, H, K]
    qg_ptr, kd_ptr, kb_ptr, decay_ptr,
    # strides (elements between consecutive tokens) and the q scale
    stride_q, stride_k, scale,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SOLVE_PRECISION: tl.constexpr, BF16_SCORES: tl.constexpr,
    JOINED: tl.constexpr, GATED_ROWS: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)
    o_t = tl.arange(0, BT)
    m_t = o_t < length
    rows = (t0 + o_t)[:, None]
    b_acc_a = tl.zeros([BT, BT], dtype=tl.float32)
    b_acc_l = tl.zeros([BT, BT], dtype=tl.float32)
    b_sum_q = tl.zeros([BT], dtype=tl.float32)
    b_sum_k = tl.zeros([BT], dtype=tl.float32)
    if GATED_ROWS:
        # The gated rows are stored slice by slice, normalised: the norms first (a pass over
        # q and k that the main loop's loads then find in the cache).
        b_norm_q, b_norm_k = _inverse_norms(q_ptr, k_ptr, rows, m_t, i_h, stride_q, stride_k,
                                            scale, K, BT, BK)
        b_beta = tl.load(beta_ptr + (t0 + o_t) * H + i_h, mask=m_t, other=0.0)
    for k_start in range(0, K, BK):
        o_k = k_start + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        # Rows past the chunk's end load as zeros (their g too, so Γ stays flat there).
        b_q = tl.load(q_ptr + i_h * K + rows * stride_q + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_gamma = tl.cumsum(b_g * LOG2_E, axis=0)                      # Γ₂, base 2
        if GATED_ROWS:
            _store_gated_rows(qg_ptr, kd_ptr, kb_ptr, decay_ptr, base, b_q, b_k, b_gamma,
                              b_norm_q, b_norm_k, b_beta, o_t, o_k, K, BT, BC)
        else:
            b_sum_q += tl.sum(b_q * b_q, axis=1)
            b_sum_k += tl.sum(b_k * b_k, axis=1)
        if JOINED:
            b_acc_a, b_acc_l = _add_slice_joined(b_acc_a, b_acc_l, b_q, b_k, b_gamma, o_t, BT,
                                                  BC, BK, BF16_SCORES, DOT_PRECISION)
        else:
            b_acc_a, b_acc_l = _add_slice_by_blocks(b_acc_a, b_acc_l, b_q, b_k, b_gamma, o_t,
                                                    BC, BF16_SCORES, DOT_PRECISION)
    # Norms (§9 #3: eps 1e-6 inside the root): A = diag(scale/|q|) A_raw diag(1/|k|),
    # L = diag(β/|k|) L_raw diag(1/|k|); rows past the chunk's end have β = 0.
    if not GATED_ROWS:
        b_norm_q = tl.rsqrt(b_sum_q + L2_NORM_EPS) * scale
        b_norm_k = tl.rsqrt(b_sum_k + L2_NORM_EPS)
        b_beta = tl.load(beta_ptr + (t0 + o_t) * H + i_h, mask=m_t, other=0.0)
    tl.store(inv_norm_q_ptr + base * BT + o_t, b_norm_q)
    tl.store(inv_norm_k_ptr + base * BT + o_t, b_norm_k)
    p_square = (base * BT + o_t)[:, None] * BT + o_t[None, :]
    b_a = b_acc_a * b_norm_q[:, None] * b_norm_k[None, :]
    tl.store(aqk_ptr + p_square,
             tl.where(o_t[:, None] >= o_t[None, :], b_a, 0.0).to(aqk_ptr.dtype.element_ty))
    b_l = b_acc_l * (b_norm_k * b_beta)[:, None] * b_norm_k[None, :]
    tl.store(l_ptr + p_square, tl.where(o_t[:, None] > o_t[None, :], b_l, 0.0))
    solve_stored_l(l_ptr, inverse_ptr, base, BT, BC, SOLVE_PRECISION)


def kda_prefill_scores_wide(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scale: float,
    tuning: KdaPrefillTuning,
    scores_dtype: torch.dtype = torch.float32,
    gated_rows: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Stage 1a over C chunks (module docstring):
    q, k [T, H, K] (token stride free, head and channel dense); g fp32 [T, H, K]; beta fp32
    [T, H]; chunk_start, chunk_len int32 [C] -> {"aqk", "inverse": [C, H, BT, BT] in
    ``scores_dtype`` (written whole), "inv_norm_q", "inv_norm_k": fp32 [C, H, BT]}.
    From ``tuning``: scores_block_k (channels per slice), scores_num_warps, scores_tf32_solve,
    scores_bf16 (BF16 score products, 16-bit inputs only); scores_joined (each slice's four blocks as one product of
    contraction 4 x block_k: fewer, larger products and barriers); scores_max_registers (a
    cap per thread on CUDA, maxnreg; ignored elsewhere). ``gated_rows``: buffers {"qg", "kd",
    "kb": [C, H, BT, K], "decay": fp32 [C, H, K]} that the same program fills with the gated
    rows (``KdaPrefillTuning.fold_w_u``: stage 1b's products then happen in stage 2)."""
    num_chunks, num_heads, head_dim = chunk_start.shape[0], q.shape[1], q.shape[2]
    out = empty_scores(q, num_chunks, scores_dtype)
    if num_chunks == 0:
        return out
    kernel = kda_prefill_scores_wide_kernel
    precision = dot_precision(kernel, q.dtype)
    is_16bit = q.dtype in (torch.bfloat16, torch.float16)
    on_interpreter = runs_on_interpreter(kernel)
    is_cuda = not on_interpreter and driver.active.get_current_target().backend == "cuda"
    register_cap = {"maxnreg": tuning.scores_max_registers} \
        if tuning.scores_max_registers and is_cuda else {}
    l_scratch = out["inverse"] if scores_dtype == torch.float32 else \
        torch.empty(out["inverse"].shape, dtype=torch.float32, device=q.device)
    kernel[(num_chunks, num_heads)](
        q, k, g, beta, chunk_start, chunk_len,
        out["aqk"], out["inverse"], out["inv_norm_q"], out["inv_norm_k"], l_scratch,
        *(gated_rows[name] if gated_rows else l_scratch for name in ("qg", "kd", "kb", "decay")),
        q.stride(0), k.stride(0), scale,
        H=num_heads, K=head_dim, BT=CHUNK_SIZE, BC=SUB_CHUNK_SIZE,
        BK=min(tuning.scores_block_k, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=precision,
        SOLVE_PRECISION=precision if tuning.scores_tf32_solve else "ieee",
        BF16_SCORES=tuning.scores_bf16 and is_16bit and not on_interpreter,
        JOINED=tuning.scores_joined, GATED_ROWS=gated_rows is not None,
        num_warps=tuning.scores_num_warps, **register_cap,
    )
    return out
