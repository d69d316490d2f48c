"""The two kernels of the small-batch MoE GEMVs (launcher and design: moe_gemv.py).

A program owns BLOCK_N output rows of one expert's weights (grid axis 1) and streams them once
over the K loop for a set of BLOCK_M activation rows:
* token rows (GATHER False): row t is token t, masked unless t routes to the expert, so
  BLOCK_M >= T and every program multiplies all T rows;
* gathered rows (GATHER True): row r is the r-th token routed to the expert
  (``_gathered_rows``), in chunks of BLOCK_M rows, one program per chunk (grid axis 0 holds
  CHUNKS = cdiv(T, BLOCK_M) programs per expert; those past the expert's tokens exit at
  once), so the tensor cores see about the expert's own tokens instead of all T.
h rows: token rows at ``e * BLOCK_M + t``; gathered rows in expert order, the T * k pairs
(expert e's from the number of pairs routed to lower ids).
"""

import triton
import triton.language as tl

from atomk31.triton_kernels.moe_gemv_tiles import (load_activations, tile_accumulator,
                                                   tile_product, undo_one_factor, words_order)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _expert_tokens(ids_ptr, weights_ptr, expert, num_tokens,
                   TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_TOP_K: tl.constexpr):
    """For token rows 0..BLOCK_M-1: does the token route to `expert`, and with what weight."""
    o_m, o_j = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_TOP_K)
    m_ids = (o_m[:, None] < num_tokens) & (o_j[None, :] < TOP_K)
    b_ids = tl.load(ids_ptr + o_m[:, None] * TOP_K + o_j[None, :], mask=m_ids, other=-1)
    b_match = b_ids == expert
    b_weights = tl.load(weights_ptr + o_m[:, None] * TOP_K + o_j[None, :], mask=b_match,
                        other=0.0)
    return tl.max(b_match.to(tl.int32), axis=1) > 0, tl.sum(b_weights, axis=1)


@triton.jit
def _gathered_rows(ids_ptr, weights_ptr, expert, num_tokens, m0, TOP_K: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_TOP_K: tl.constexpr):
    """GATHER: row r of chunk m0 is the (m0 + r)-th token, in token order, that routes to
    `expert`. Returns (its token index, whether the row holds one, its routing weight, how many
    tokens route to `expert`, how many (token, slot) pairs route to a lower expert id): each
    token's rank among the routed ones is a prefix sum, and row r picks the token of rank
    m0 + r out of a [BLOCK_M, BLOCK_T] comparison. The last figure is where the expert's h
    rows start when h holds the T * k pairs in expert order."""
    o_t, o_j = tl.arange(0, BLOCK_T), tl.arange(0, BLOCK_TOP_K)
    m_ids = (o_t[:, None] < num_tokens) & (o_j[None, :] < TOP_K)
    b_ids = tl.load(ids_ptr + o_t[:, None] * TOP_K + o_j[None, :], mask=m_ids, other=-1)
    b_match = b_ids == expert
    b_weights = tl.sum(tl.load(weights_ptr + o_t[:, None] * TOP_K + o_j[None, :], mask=b_match,
                               other=0.0), axis=1)
    b_routed = tl.max(b_match.to(tl.int32), axis=1)
    b_rank = tl.cumsum(b_routed, axis=0) - b_routed
    o_r = m0 + tl.arange(0, BLOCK_M)
    b_pick = (b_routed[None, :] > 0) & (b_rank[None, :] == o_r[:, None])    # [BLOCK_M, BLOCK_T]
    tokens = tl.sum(tl.where(b_pick, o_t[None, :], 0), axis=1)
    m_m = tl.max(b_pick.to(tl.int32), axis=1) > 0
    weights = tl.sum(tl.where(b_pick, b_weights[None, :], 0.0), axis=1)
    lower = tl.sum(((b_ids < expert) & (b_ids >= 0)).to(tl.int32), axis=1)
    return tokens, m_m, weights, tl.sum(b_routed, axis=0), tl.sum(lower, axis=0)


@triton.jit
def _program_expert(ids_ptr, i_p, BY_SLOT: tl.constexpr, BLOCK_SLOTS: tl.constexpr):
    """(expert of program i_p, whether the program owns it). BY_SLOT: program i_p is slot i_p
    of the flat topk_ids and owns its expert when no earlier slot routes to the same one."""
    if BY_SLOT:
        expert = tl.load(ids_ptr + i_p)
        o_s = tl.arange(0, BLOCK_SLOTS)
        b_earlier = tl.load(ids_ptr + o_s, mask=o_s < i_p, other=-1)
        owner = tl.max((b_earlier == expert).to(tl.int32), axis=0) == 0
    else:
        expert = i_p
        owner = i_p >= 0
    return expert, owner


@triton.jit
def _gate_up_step(b_gate, b_up, p_rows, m_m, p_gate_packed, p_gate_scales, p_up_packed,
                  p_up_scales, k0, STRIDE_PACKED: tl.constexpr, STRIDE_SCALES: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  MODE: tl.constexpr, DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr):
    b_even, b_odd, b_a = load_activations(p_rows, m_m, k0, BLOCK_K, MODE)
    b_gate = tile_product(b_even, b_odd, b_a, p_gate_packed, p_gate_scales, k0,
                          b_gate, STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N, BLOCK_K,
                          MODE, DOT_FP32, WORD_DECODE)
    b_up = tile_product(b_even, b_odd, b_a, p_up_packed, p_up_scales, k0, b_up,
                        STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N, BLOCK_K, MODE,
                        DOT_FP32, WORD_DECODE)
    return b_gate, b_up


@triton.jit
def gate_up_rows(z_ptr, stride_z, tokens, m_m, h_row0, i_e, i_n, packed_ptr, scales_ptr,
                  h_ptr, beta, linear_beta, F: tl.constexpr, DL: tl.constexpr,
                  HAS_LINEAR_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PACKED_INPUTS: tl.constexpr, MODE: tl.constexpr,
                  DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr):
    """h rows h_row0 .. h_row0 + BLOCK_M - 1, columns of program i_n: SiTU-GLU of the gate and
    up products of expert i_e with the activation rows `tokens` (masked by m_m)."""
    p_rows = z_ptr + tokens.to(tl.int64) * stride_z
    STRIDE_PACKED: tl.constexpr = DL // PACKED_INPUTS
    STRIDE_SCALES: tl.constexpr = DL // 32
    row0 = i_e.to(tl.int64) * 2 * F + i_n * BLOCK_N
    p_gate_packed = packed_ptr + row0 * STRIDE_PACKED
    p_gate_scales = scales_ptr + row0 * STRIDE_SCALES
    p_up_packed = p_gate_packed + F * STRIDE_PACKED
    p_up_scales = p_gate_scales + F * STRIDE_SCALES
    b_gate = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    b_up = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    for k0 in range(0, DL, BLOCK_K):
        b_gate, b_up = _gate_up_step(b_gate, b_up, p_rows, m_m, p_gate_packed, p_gate_scales,
                                     p_up_packed, p_up_scales, k0, STRIDE_PACKED, STRIDE_SCALES,
                                     BLOCK_M, BLOCK_N, BLOCK_K, MODE, DOT_FP32, WORD_DECODE)
    store_gate_up(b_gate, b_up, h_ptr, h_row0, m_m, i_n, beta, linear_beta, F, HAS_LINEAR_CAP,
                  BLOCK_M, BLOCK_N, BLOCK_K, MODE, WORD_DECODE)


@triton.jit
def store_gate_up(b_gate, b_up, h_ptr, h_row0, m_m, i_n, beta, linear_beta, F: tl.constexpr,
                  HAS_LINEAR_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, MODE: tl.constexpr, WORD_DECODE: tl.constexpr):
    """h rows h_row0 .. h_row0 + BLOCK_M - 1 (masked by m_m), columns of program i_n: SiTU-GLU
    of the K loop's gate and up accumulators (in MODE's layout)."""
    o_m = tl.arange(0, BLOCK_M)
    if MODE != "fma":
        b_gate = tl.trans(b_gate)
        b_up = tl.trans(b_up)
    b_gate = undo_one_factor(b_gate, WORD_DECODE)
    b_up = undo_one_factor(b_up, WORD_DECODE)
    # SiTU-GLU (§4.8): SiLU with the gate soft-capped at ±beta, up capped at ±linear_beta.
    b_h = beta * _tanh(b_gate / beta) * tl.sigmoid(b_gate)
    if HAS_LINEAR_CAP:
        b_up = linear_beta * _tanh(b_up / linear_beta)
    b_h = b_h * b_up
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if MODE == "dot_t_words":
        o_n = words_order(o_n, BLOCK_K)       # h is the down GEMV's input: in its word order
    p_h = h_ptr + (h_row0 + o_m[:, None]) * F + o_n[None, :]
    tl.store(p_h, b_h.to(h_ptr.dtype.element_ty), mask=m_m[:, None])


@triton.jit
def moe_gate_up_gemv_kernel(
    # pointers: z [T, Dl], topk ids/weights [T, k], w13 packed/scales [E, 2F, *],
    # h [rows, F]
    z_ptr, ids_ptr, weights_ptr, packed_ptr, scales_ptr, h_ptr,
    # sizes and strides
    num_tokens, stride_z,
    # activation
    beta, linear_beta,
    # meta-parameters
    F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr, HAS_LINEAR_CAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_TOP_K: tl.constexpr, PACKED_INPUTS: tl.constexpr, MODE: tl.constexpr,
    DOT_FP32: tl.constexpr, BY_SLOT: tl.constexpr, BLOCK_SLOTS: tl.constexpr,
    WORD_DECODE: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_T: tl.constexpr, CHUNKS: tl.constexpr,
):
    i_p, i_n = tl.program_id(0), tl.program_id(1)
    if GATHER:
        # Chunks of one expert side by side in the grid: they read the same weights at about
        # the same time (the second read from L2). A loop over the chunks inside the program
        # cost ~40 registers (triton 3.6) around the pipelined K loop.
        i_c = i_p % CHUNKS
        i_p = i_p // CHUNKS
    i_e, owner = _program_expert(ids_ptr, i_p, BY_SLOT, BLOCK_SLOTS)
    if GATHER:
        m0 = i_c * BLOCK_M
        tokens, _picked, _weights, count, h_row0 = _gathered_rows(
            ids_ptr, weights_ptr, i_e, num_tokens, m0, TOP_K, BLOCK_T, BLOCK_M, BLOCK_TOP_K)
        if (count <= m0) | (owner == 0):
            return
        # Rows past the expert's count are masked; a mask from the count, not from the
        # comparison, keeps fewer values live through the K loop.
        gate_up_rows(z_ptr, stride_z, tokens, tl.arange(0, BLOCK_M) < count - m0,
                      (h_row0 + m0).to(tl.int64), i_e, i_n, packed_ptr, scales_ptr, h_ptr, beta,
                      linear_beta, F, DL, HAS_LINEAR_CAP, BLOCK_M, BLOCK_N, BLOCK_K,
                      PACKED_INPUTS, MODE, DOT_FP32, WORD_DECODE)
    else:
        m_m, _ = _expert_tokens(ids_ptr, weights_ptr, i_e, num_tokens, TOP_K, BLOCK_M,
                                BLOCK_TOP_K)
        if (tl.max(m_m.to(tl.int32), axis=0) == 0) | (owner == 0):
            return
        gate_up_rows(z_ptr, stride_z, tl.arange(0, BLOCK_M), m_m, i_e.to(tl.int64) * BLOCK_M,
                      i_e, i_n, packed_ptr, scales_ptr, h_ptr, beta, linear_beta, F, DL,
                      HAS_LINEAR_CAP, BLOCK_M, BLOCK_N, BLOCK_K, PACKED_INPUTS, MODE, DOT_FP32,
                      WORD_DECODE)


@triton.jit
def down_product(h_ptr, h_row0, m_m, i_e, i_n, packed_ptr, scales_ptr, F: tl.constexpr,
                  DL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PACKED_INPUTS: tl.constexpr, MODE: tl.constexpr,
                  DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr):
    """(h rows h_row0 .. h_row0 + BLOCK_M - 1, masked by m_m) W2_{i_e}^T for the output
    columns of program i_n, fp32 [BLOCK_M, BLOCK_N]."""
    o_m = tl.arange(0, BLOCK_M)
    p_rows = h_ptr + (h_row0 + o_m) * F
    STRIDE_PACKED: tl.constexpr = F // PACKED_INPUTS
    STRIDE_SCALES: tl.constexpr = F // 32
    row0 = i_e.to(tl.int64) * DL + i_n * BLOCK_N
    p_packed = packed_ptr + row0 * STRIDE_PACKED
    p_scales = scales_ptr + row0 * STRIDE_SCALES
    b_acc = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    for k0 in range(0, F, BLOCK_K):
        b_even, b_odd, b_a = load_activations(p_rows, m_m, k0, BLOCK_K, MODE)
        b_acc = tile_product(b_even, b_odd, b_a, p_packed, p_scales, k0, b_acc, STRIDE_PACKED,
                             STRIDE_SCALES, BLOCK_M, BLOCK_N, BLOCK_K, MODE, DOT_FP32,
                             WORD_DECODE)
    if MODE != "fma":
        b_acc = tl.trans(b_acc)
    b_acc = undo_one_factor(b_acc, WORD_DECODE)
    return b_acc


@triton.jit
def add_rows(u_ptr, tokens, m_m, b_weight, b_acc, i_n, DL: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """u[tokens] += b_weight * b_acc over the output columns of program i_n (fp32 atomics:
    the k experts of a token add up)."""
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.atomic_add(u_ptr + tokens.to(tl.int64)[:, None] * DL + o_n[None, :],
                  b_acc * b_weight[:, None], mask=m_m[:, None], sem="relaxed")


@triton.jit
def moe_down_gemv_kernel(
    # pointers: h [rows, F], topk ids/weights [T, k], w2 packed/scales [E, Dl, *],
    # u [T, Dl]
    h_ptr, ids_ptr, weights_ptr, packed_ptr, scales_ptr, u_ptr,
    # sizes
    num_tokens,
    # meta-parameters
    F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_TOP_K: tl.constexpr, PACKED_INPUTS: tl.constexpr, MODE: tl.constexpr,
    DOT_FP32: tl.constexpr, BY_SLOT: tl.constexpr, BLOCK_SLOTS: tl.constexpr,
    WORD_DECODE: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_T: tl.constexpr, CHUNKS: tl.constexpr,
):
    i_p, i_n = tl.program_id(0), tl.program_id(1)
    if GATHER:
        i_c = i_p % CHUNKS                           # as moe_gate_up_gemv_kernel
        i_p = i_p // CHUNKS
    i_e, owner = _program_expert(ids_ptr, i_p, BY_SLOT, BLOCK_SLOTS)
    if GATHER:
        m0 = i_c * BLOCK_M
        _tokens, _picked, _weights, count, h_row0 = _gathered_rows(
            ids_ptr, weights_ptr, i_e, num_tokens, m0, TOP_K, BLOCK_T, BLOCK_M, BLOCK_TOP_K)
        if (count <= m0) | (owner == 0):
            return
        b_acc = down_product(h_ptr, (h_row0 + m0).to(tl.int64),
                              tl.arange(0, BLOCK_M) < count - m0, i_e, i_n, packed_ptr,
                              scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K, PACKED_INPUTS, MODE,
                              DOT_FP32, WORD_DECODE)
        # The chunk's tokens and weights after the K loop: nothing of them stays live
        # through it.
        tokens, m_m, b_weight, _count, _first = _gathered_rows(
            ids_ptr, weights_ptr, i_e, num_tokens, m0, TOP_K, BLOCK_T, BLOCK_M, BLOCK_TOP_K)
        add_rows(u_ptr, tokens, m_m, b_weight, b_acc, i_n, DL, BLOCK_N)
    else:
        m_m, b_weight = _expert_tokens(ids_ptr, weights_ptr, i_e, num_tokens, TOP_K, BLOCK_M,
                                       BLOCK_TOP_K)
        if (tl.max(m_m.to(tl.int32), axis=0) == 0) | (owner == 0):
            return
        b_acc = down_product(h_ptr, i_e.to(tl.int64) * BLOCK_M, m_m, i_e, i_n, packed_ptr,
                              scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K, PACKED_INPUTS, MODE,
                              DOT_FP32, WORD_DECODE)
        add_rows(u_ptr, tl.arange(0, BLOCK_M), m_m, b_weight, b_acc, i_n, DL, BLOCK_N)
