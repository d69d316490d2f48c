"""KDA chunked prefill, stage 1a as one program per (chunk, head) with 64-row products.

Same contract as ``kda_prefill_scores.py`` (the scores ``aqk``, the inverse ``(I + L)^-1`` and
the inverse norms, read by ``kda_prefill_gated.py``); a different shape of the work. There,
two programs per (chunk, head) each accumulate ten [16, 16] tiles over the head dimension
with [16, 16] products; here one program accumulates A and L together as four column blocks
each, ``[BT, BC]`` = [64, 16], every product a [64, BK] x [BK, 16] tensor-core matmul
(Hopper's wgmma wants 64 rows), and q, k, g are read once per (chunk, head) instead of k and
g twice.

Column block j (the keys of sub-chunk j, rows ``16j .. 16j + 15``) uses the reference
``Γ_r``, Γ at the block's last row: ``exp(Γ_i - Γ_j) = exp(Γ_i - Γ_r) · exp(Γ_r - Γ_j)``.
The right factor is <= 1; the left one is <= 1 for rows past the block and at most
``exp(15 x 5.8)`` inside it (the -5.8 floor of kda_prefill_intra.py); rows before the block
(above the diagonal) are zeroed through an exponent of -inf, never computed.

The solve: L (scaled, strictly lower) goes to the inverse buffer, the program reads its ten
[16, 16] tiles back (a barrier between: other threads wrote them) and runs the blockwise
solve of ``kda_prefill_scores.py`` over them, in IEEE fp32 unless asked for TF32.

Products: fp32 operands at DOT_PRECISION (IEEE for fp32 inputs, TF32 for 16-bit ones on
NVIDIA), or with BF16_SCORES (16-bit inputs only, not under the interpreter) BF16 operands
with fp32 accumulation.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.kda_prefill_gated import gated_outputs
from atomk31.triton_kernels.kda_prefill_intra import (
    CHUNK_SIZE, L2_NORM_EPS, SUB_CHUNK_SIZE, empty_intermediates,
)
from atomk31.triton_kernels.kda_prefill_scores import _solve_and_store
from atomk31.triton_kernels.runtime import dot_precision, runs_on_interpreter


@triton.jit
def score_product(b_left, b_right_t, b_acc, BF16_SCORES: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    if BF16_SCORES:
        return tl.dot(b_left.to(tl.bfloat16), b_right_t.to(tl.bfloat16), b_acc)
    return tl.dot(b_left, b_right_t, b_acc, input_precision=DOT_PRECISION)


@triton.jit
def _column_block(
    k_ptr, g_ptr, t0, length, i_h, j: tl.constexpr, b_q, b_k, b_carry, b_gamma, o_k, m_k,
    b_acc_a, b_acc_l, b_sum_k, stride_k, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BC: tl.constexpr, BF16_SCORES: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One channel slice's contribution to column block j of A and of L (raw: no norms, no
    β), and to the sums of squares of sub-chunk j's keys (for the column norms); b_carry is
    Γ before sub-chunk j, and Γ at its end is returned as the next block's."""
    o_t = tl.arange(0, BT)
    o_s = j * BC + tl.arange(0, BC)
    m_rows = (o_s < length)[:, None] & m_k[None, :]
    rows = (t0 + o_s)[:, None]
    b_k_j = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_rows,
                    other=0.0).to(tl.float32)
    b_g_j = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_rows, other=0.0)
    b_ref = b_carry + tl.sum(b_g_j, axis=0)
    b_gamma_j = b_carry[None, :] + tl.cumsum(b_g_j, axis=0)
    b_right_t = tl.trans(b_k_j * tl.exp(b_ref[None, :] - b_gamma_j))        # [BK, BC]
    b_exponent = tl.where((o_t >= j * BC)[:, None], b_gamma - b_ref[None, :], float("-inf"))
    b_left = tl.exp(b_exponent)                                            # [BT, BK]
    b_acc_a = score_product(b_q * b_left, b_right_t, b_acc_a, BF16_SCORES, DOT_PRECISION)
    b_acc_l = score_product(b_k * b_left, b_right_t, b_acc_l, BF16_SCORES, DOT_PRECISION)
    return b_acc_a, b_acc_l, b_sum_k + tl.sum(b_k_j * b_k_j, axis=1), b_ref


@triton.jit
def _store_column_block(
    out_ptr, base, j: tl.constexpr, b_acc, b_row_scale, b_sum_k_j, STRICT: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
):
    """Column block j scaled by rows and by 1/|k| of its columns, masked at and above the
    diagonal (strictly or not), written whole (zeros above the diagonal)."""
    o_t = tl.arange(0, BT)
    o_col = j * BC + tl.arange(0, BC)
    b_col_scale = tl.rsqrt(b_sum_k_j + L2_NORM_EPS)
    b_block = b_acc * b_row_scale[:, None] * b_col_scale[None, :]
    if STRICT:
        b_block = tl.where(o_t[:, None] > o_col[None, :], b_block, 0.0)
    else:
        b_block = tl.where(o_t[:, None] >= o_col[None, :], b_block, 0.0)
    tl.store(out_ptr + (base * BT + o_t)[:, None] * BT + o_col[None, :],
             b_block.to(out_ptr.dtype.element_ty))


@triton.jit
def _tile(p_matrix, i_i: tl.constexpr, i_j: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    o_c = tl.arange(0, BC)
    return tl.load(p_matrix + (i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :])


@triton.jit
def solve_stored_l(l_ptr, inverse_ptr, base, BT: tl.constexpr, BC: tl.constexpr,
                   SOLVE_PRECISION: tl.constexpr):
    """L's [16, 16] tiles back from l_ptr (written by other threads of this program), then
    solved into inverse_ptr: every tile is read before the second barrier, so the inverse may
    overwrite L in place."""
    tl.debug_barrier()
    p_l = l_ptr + base * BT * BT
    t00, t10, t11 = _tile(p_l, 0, 0, BT, BC), _tile(p_l, 1, 0, BT, BC), _tile(p_l, 1, 1, BT, BC)
    t20, t21, t22 = _tile(p_l, 2, 0, BT, BC), _tile(p_l, 2, 1, BT, BC), _tile(p_l, 2, 2, BT, BC)
    t30, t31 = _tile(p_l, 3, 0, BT, BC), _tile(p_l, 3, 1, BT, BC)
    t32, t33 = _tile(p_l, 3, 2, BT, BC), _tile(p_l, 3, 3, BT, BC)
    tl.debug_barrier()
    _solve_and_store(inverse_ptr, base, t00, t10, t11, t20, t21, t22, t30, t31, t32, t33,
                     BT, BC, SOLVE_PRECISION)


@triton.jit
def kda_prefill_scores_columns_kernel(
    # pointers: inputs (token-major [T, H, *]) and the chunk table
    q_ptr, k_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    # pointers: outputs, aqk and inverse [C, H, BT, BT], the norms [C, H, BT]; fp32 scratch
    # for L [C, H, BT, BT] (the inverse buffer itself when that is fp32)
    aqk_ptr, inverse_ptr, inv_norm_q_ptr, inv_norm_k_ptr, l_ptr,
    # FUSE_GATED only: v [T, H, V] and stage 1b's outputs (kda_prefill_gated.py)
    v_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr,
    # strides (elements between consecutive tokens) and the q scale
    stride_q, stride_k, stride_v, scale,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BK: tl.constexpr, DOT_PRECISION: tl.constexpr, SOLVE_PRECISION: tl.constexpr,
    BF16_SCORES: tl.constexpr, FUSE_GATED: tl.constexpr, GATED_BLOCK: tl.constexpr,
    BF16_PRODUCTS: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    base = (i_c * H + i_h).to(tl.int64)                     # this (chunk, head)
    o_t = tl.arange(0, BT)
    m_t = o_t < length
    rows = (t0 + o_t)[:, None]
    zero = tl.zeros([BT, BC], dtype=tl.float32)
    a0, a1, a2, a3, l0, l1, l2, l3 = zero, zero, zero, zero, zero, zero, zero, zero
    b_sum_q = tl.zeros([BT], dtype=tl.float32)
    b_sum_k = tl.zeros([BT], dtype=tl.float32)
    s0 = tl.zeros([BC], dtype=tl.float32)
    s1, s2, s3 = s0, s0, s0
    for k_start in range(0, K, BK):
        o_k = k_start + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        # Rows past the chunk's end load as zeros (their g too, so Γ stays flat there).
        b_q = tl.load(q_ptr + i_h * K + rows * stride_q + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + i_h * K + rows * stride_k + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + i_h * K + rows * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_gamma = tl.cumsum(b_g, axis=0)
        b_sum_q += tl.sum(b_q * b_q, axis=1)
        b_sum_k += tl.sum(b_k * b_k, axis=1)
        # Γ at each sub-chunk's end chains from block to block (no reduction over the tile).
        b_carry = tl.zeros([BK], dtype=tl.float32)
        a0, l0, s0, b_carry = _column_block(k_ptr, g_ptr, t0, length, i_h, 0, b_q, b_k, b_carry,
                                            b_gamma, o_k, m_k, a0, l0, s0, stride_k, H, K, BT,
                                            BC, BF16_SCORES, DOT_PRECISION)
        a1, l1, s1, b_carry = _column_block(k_ptr, g_ptr, t0, length, i_h, 1, b_q, b_k, b_carry,
                                            b_gamma, o_k, m_k, a1, l1, s1, stride_k, H, K, BT,
                                            BC, BF16_SCORES, DOT_PRECISION)
        a2, l2, s2, b_carry = _column_block(k_ptr, g_ptr, t0, length, i_h, 2, b_q, b_k, b_carry,
                                            b_gamma, o_k, m_k, a2, l2, s2, stride_k, H, K, BT,
                                            BC, BF16_SCORES, DOT_PRECISION)
        a3, l3, s3, b_carry = _column_block(k_ptr, g_ptr, t0, length, i_h, 3, b_q, b_k, b_carry,
                                            b_gamma, o_k, m_k, a3, l3, s3, stride_k, H, K, BT,
                                            BC, BF16_SCORES, DOT_PRECISION)
    # Norms (§9 #3: eps 1e-6 inside the root): A = diag(scale/|q|) A_raw diag(1/|k|),
    # L = diag(β/|k|) L_raw diag(1/|k|); rows past the chunk's end have β = 0.
    b_norm_q = tl.rsqrt(b_sum_q + L2_NORM_EPS) * scale
    b_norm_k = tl.rsqrt(b_sum_k + L2_NORM_EPS)
    tl.store(inv_norm_q_ptr + base * BT + o_t, b_norm_q)
    tl.store(inv_norm_k_ptr + base * BT + o_t, b_norm_k)
    b_beta = tl.load(beta_ptr + (t0 + o_t) * H + i_h, mask=m_t, other=0.0)
    b_beta_norm = b_norm_k * b_beta
    _store_column_block(aqk_ptr, base, 0, a0, b_norm_q, s0, False, BT, BC)
    _store_column_block(aqk_ptr, base, 1, a1, b_norm_q, s1, False, BT, BC)
    _store_column_block(aqk_ptr, base, 2, a2, b_norm_q, s2, False, BT, BC)
    _store_column_block(aqk_ptr, base, 3, a3, b_norm_q, s3, False, BT, BC)
    _store_column_block(l_ptr, base, 0, l0, b_beta_norm, s0, True, BT, BC)
    _store_column_block(l_ptr, base, 1, l1, b_beta_norm, s1, True, BT, BC)
    _store_column_block(l_ptr, base, 2, l2, b_beta_norm, s2, True, BT, BC)
    _store_column_block(l_ptr, base, 3, l3, b_beta_norm, s3, True, BT, BC)
    solve_stored_l(l_ptr, inverse_ptr, base, BT, BC, SOLVE_PRECISION)
    if FUSE_GATED:
        # Stage 1b in the same program: the inverse back whole (its tiles were written by
        # other threads), and q, k, g read again while they are likely still in L2.
        tl.debug_barrier()
        b_p = tl.load(inverse_ptr + (base * BT + o_t)[:, None] * BT + o_t[None, :],
                      mask=o_t[:, None] >= o_t[None, :], other=0.0)
        gated_outputs(q_ptr, k_ptr, v_ptr, g_ptr, t0, length, i_h, base, b_p, b_norm_q,
                      b_norm_k, b_beta, qg_ptr, kd_ptr, w_ptr, u_ptr, decay_ptr, stride_q,
                      stride_k, stride_v, H, K, V, BT, GATED_BLOCK, BF16_PRODUCTS,
                      DOT_PRECISION)


def kda_prefill_scores_columns(
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
    bf16_scores: bool = False,
    scores_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Stage 1a over C chunks, the contract of ``kda_prefill_scores.kda_prefill_scores``:
    q, k [T, H, K] (token stride free, head and channel dense); g fp32 [T, H, K]; beta fp32
    [T, H]; chunk_start, chunk_len int32 [C] -> {"aqk", "inverse": [C, H, BT, BT] in
    ``scores_dtype`` (written whole; BF16 halves their traffic where the later products round
    them to BF16 anyway), "inv_norm_q", "inv_norm_k": fp32 [C, H, BT]}. ``block_k`` and
    ``num_warps`` are tuning knobs; ``tf32_solve`` as in kda_prefill_scores; ``bf16_scores``:
    the score products with BF16 operands (16-bit inputs only; ignored for fp32 inputs and
    under the interpreter, whose BF16 dot is wrong)."""
    scores = empty_scores(q, chunk_start.shape[0], scores_dtype)
    _launch(q, k, None, g, beta, chunk_start, chunk_len, scale, scores, None, block_k,
            num_warps, tf32_solve, bf16_scores, 64, False)
    return scores


def kda_prefill_intra_columns(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    scale: float,
    intermediate_dtype: torch.dtype,
    block_k: int = 32,
    num_warps: int = 4,
    tf32_solve: bool = False,
    bf16_scores: bool = False,
    compact_scores: bool = False,
    gated_block: int = 64,
    bf16_products: bool = True,
) -> dict[str, torch.Tensor]:
    """The whole stage 1 in one kernel (stage 1a as above, then stage 1b's gated rows and w,
    u in the same program), with the contract of ``kda_prefill_intra.kda_prefill_intra``;
    ``compact_scores``: aqk (and the inverse, a scratch here) in the intermediates' dtype when
    it is 16-bit; ``gated_block``, ``bf16_products`` as in kda_prefill_gated."""
    compact = compact_scores and intermediate_dtype in (torch.bfloat16, torch.float16)
    scores = empty_scores(q, chunk_start.shape[0],
                           intermediate_dtype if compact else torch.float32)
    out = empty_intermediates(chunk_start.shape[0], q.shape[1], q.shape[2], v.shape[2],
                              intermediate_dtype, q.device, aqk=scores["aqk"])
    use_bf16 = bf16_products and intermediate_dtype in (torch.bfloat16, torch.float16)
    _launch(q, k, v, g, beta, chunk_start, chunk_len, scale, scores, out, block_k, num_warps,
            tf32_solve, bf16_scores, gated_block, use_bf16)
    return out


def empty_scores(q: torch.Tensor, num_chunks: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Stage 1a's outputs for ``num_chunks`` chunks of q's heads: aqk and inverse in ``dtype``,
    the norms in fp32 (one chunk's worth when there are none, so the pointers are valid)."""
    rows = (max(num_chunks, 1), q.shape[1], CHUNK_SIZE)
    out = {name: torch.empty(*rows, CHUNK_SIZE, dtype=dtype, device=q.device)
           for name in ("aqk", "inverse")}
    out.update({name: torch.empty(rows, dtype=torch.float32, device=q.device)
                for name in ("inv_norm_q", "inv_norm_k")})
    return out


def _launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, g: torch.Tensor,
    beta: torch.Tensor, chunk_start: torch.Tensor, chunk_len: torch.Tensor, scale: float,
    scores: dict[str, torch.Tensor], gated: dict[str, torch.Tensor] | None, block_k: int,
    num_warps: int, tf32_solve: bool, bf16_scores: bool, gated_block: int,
    bf16_products: bool,
) -> None:
    """One launch over (chunk, head); stage 1b fused in when ``gated`` holds its outputs."""
    num_chunks, num_heads, head_dim = chunk_start.shape[0], q.shape[1], q.shape[2]
    if num_chunks == 0:
        return
    kernel = kda_prefill_scores_columns_kernel
    on_interpreter = runs_on_interpreter(kernel)
    precision = dot_precision(kernel, q.dtype)
    is_16bit = q.dtype in (torch.bfloat16, torch.float16)
    l_scratch = scores["inverse"] if scores["inverse"].dtype == torch.float32 else \
        torch.empty(scores["inverse"].shape, dtype=torch.float32, device=q.device)
    fused = gated is not None
    value_dim = v.shape[2] if fused else head_dim
    unused = scores["inv_norm_q"]                       # pointers the kernel never touches
    outputs = [gated[name] for name in ("qg", "kd", "w", "u", "decay")] if fused \
        else [unused] * 5
    kernel[(num_chunks, num_heads)](
        q, k, g, beta, chunk_start, chunk_len,
        scores["aqk"], scores["inverse"], scores["inv_norm_q"], scores["inv_norm_k"], l_scratch,
        v if fused else unused, *outputs,
        q.stride(0), k.stride(0), v.stride(0) if fused else 0, scale,
        H=num_heads, K=head_dim, V=value_dim, BT=CHUNK_SIZE, BC=SUB_CHUNK_SIZE,
        BK=min(block_k, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=precision, SOLVE_PRECISION=precision if tf32_solve else "ieee",
        BF16_SCORES=bf16_scores and is_16bit and not on_interpreter,
        FUSE_GATED=fused,
        GATED_BLOCK=min(gated_block, triton.next_power_of_2(max(head_dim, value_dim))),
        BF16_PRODUCTS=bf16_products and not on_interpreter,
        num_warps=num_warps,
    )
