"""Grouped MoE GEMMs (large batches) with the GEMVs' word decode: the two kernels of
``moe_grouped_gemm.py`` with the weights as the tensor-core product's first operand, decoded
8 nibbles per int32 word straight into its registers (moe_gemv_tiles "dot_t_words"), and the
sorted (token, slot) pairs of ``moe_routing.sort_pairs_by_expert`` as its N side.

Why: at 4096 tokens the byte-decode grouped GEMMs (``moe_grouped_gemm.py``) decode every
weight once per 128-pair block with ~10 ops per weight and store it to shared memory as the
B operand: 18.3 ms, 34% of the BF16 matrix rate (H200, session 4), the decode about as long
as the MMA per tile. The word decode is ~2.6 ops per weight (21 per word of 8) and needs no
shared-memory round trip of the weights; what stays is the activations' tile in shared memory
(the B operand), as in the GEMVs' gathered rows.

A program owns BLOCK_M sorted pairs of one expert (grid axis 0: the expert blocks) and
BLOCK_N weight rows (axis 1); the row loops are the GEMV kernels' (moe_gemv_kernels
``gate_up_rows`` / ``down_product`` / ``add_rows``) with the pairs' tokens as the rows:
1. ``moe_gate_up_words_kernel``: h rows (in the blocks' pair order) = SiTU-GLU of the gate and
   up products, rounded to z's dtype, columns in word order (the down kernel's K order).
2. ``moe_down_words_kernel``: h W2_e^T times the pair's routing weight, fp32 atomics into u.
z arrives in word order (``moe_gemv.to_words_order``), so BLOCK_K divides Dl and F.

SCALES_AHEAD (``scales_ahead``, the grouped launcher's default): with 128-input K tiles a
row has 4 scale bytes per step, 2 per thread at 8 warps: too small for cp.async, so Triton
leaves that load in the loop as a plain LDG.U16 ~40 instructions before its first use, and
every K step waits on it (the 13.6 / 12.7 ms at 4096 tokens against a predicted 8.5).
With it the K loops (``_gate_up_scales_ahead`` / ``_down_scales_ahead``) load the
next step's bytes at the top of each step and carry them in registers (the last step reloads
its own tile: in bounds, unused). Triton 3.6, sm_90, 128 x 128 x 128 on 8 warps: gate/up
255 registers, 0 stack (as before), loop 513 SASS instructions (500); the two LDGs are
first waited on ~220 and ~450 instructions later (before: ~37 and ~76); down 188 registers
(186), 0 stack, the LDG waited on at the loop's end (before: 15 instructions later).
The decode is moe_gemv_tiles' (``load_words_tile`` + ``decode_words_tile``, the two halves
of ``_words_tile_weights``), with the scale bytes loaded a step earlier: the same values.
H200 (4096 tokens, proxy shapes, eager): 11.80 ms = 50% of the BF16 rate with the scales
ahead (the default), 12.97 ms without (torch._grouped_mm on BF16 weights: 7.63 ms).
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.moe_gemv import pick_word_decode, to_words_order
from atomk31.triton_kernels.moe_gemv_kernels import (add_rows, down_product, gate_up_rows,
                                                     store_gate_up)
from atomk31.triton_kernels.moe_gemv_tiles import (decode_words_tile, load_words_tile,
                                                   tile_accumulator, undo_one_factor)
from atomk31.triton_kernels.moe_routing import ExpertBlocks

WORDS_MODE = tl.constexpr("dot_t_words")
WORD_INPUTS = tl.constexpr(8)                       # E2M1 nibbles per int32 word


@triton.jit
def _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M: tl.constexpr):
    """The pairs of expert block i_b: (their ids, which rows hold one)."""
    o_m = i_b * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + o_m)
    return pairs, pairs < num_pairs


@triton.jit
def _scales_tile(p_scales, k0, STRIDE_SCALES: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """The E8M0 bytes of rows p_scales[0 .. BLOCK_N-1] for inputs k0 .. k0 + BLOCK_K, int32
    [BLOCK_N, BLOCK_K / 32]."""
    GROUPS: tl.constexpr = BLOCK_K // 32
    o_n = tl.arange(0, BLOCK_N)
    o_g = k0 // 32 + tl.arange(0, GROUPS)     # k0: 0 or a multiple_of(BLOCK_K) from _next_k
    return tl.load(p_scales + o_n[:, None] * STRIDE_SCALES + o_g[None, :]).to(tl.int32)


@triton.jit
def _ahead_product(acc, b_a, p_words, b_scales, k0, STRIDE_WORDS: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
                   WORD_DECODE: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += W tile (scales given) times the activations' tile^T."""
    b_w = decode_words_tile(load_words_tile(p_words, k0, STRIDE_WORDS, BLOCK_N, BLOCK_K),
                            b_scales, BLOCK_N, BLOCK_K, WORD_DECODE)
    if DOT_FP32:
        acc = tl.dot(b_w, tl.trans(b_a.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(b_w.to(b_a.dtype), tl.trans(b_a), acc)       # exact for BF16
    return acc


@triton.jit
def _next_k(k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The K tile after k0; the last tile again at the end (an in-bounds load nobody uses)."""
    return tl.multiple_of(tl.minimum(k0 + BLOCK_K, K - BLOCK_K), BLOCK_K)


@triton.jit
def _gate_up_scales_ahead(z_ptr, stride_z, tokens, m_m, h_row0, i_e, i_n, words_ptr,
                          scales_ptr, h_ptr, beta, linear_beta, F: tl.constexpr,
                          DL: tl.constexpr, HAS_LINEAR_CAP: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr):
    """moe_gemv_kernels.gate_up_rows ("dot_t_words") with each K step's scale bytes loaded
    in the step before, carried in registers."""
    o_k = tl.arange(0, BLOCK_K)
    p_rows = z_ptr + tokens.to(tl.int64)[:, None] * stride_z + o_k[None, :]
    STRIDE_WORDS: tl.constexpr = DL // WORD_INPUTS
    STRIDE_SCALES: tl.constexpr = DL // 32
    row0 = i_e.to(tl.int64) * 2 * F + i_n * BLOCK_N
    p_gate_words = words_ptr + row0 * STRIDE_WORDS
    p_gate_scales = scales_ptr + row0 * STRIDE_SCALES
    p_up_words = p_gate_words + F * STRIDE_WORDS
    p_up_scales = p_gate_scales + F * STRIDE_SCALES
    b_gate = tile_accumulator(BLOCK_M, BLOCK_N, WORDS_MODE)
    b_up = tile_accumulator(BLOCK_M, BLOCK_N, WORDS_MODE)
    b_gate_scales = _scales_tile(p_gate_scales, 0, STRIDE_SCALES, BLOCK_N, BLOCK_K)
    b_up_scales = _scales_tile(p_up_scales, 0, STRIDE_SCALES, BLOCK_N, BLOCK_K)
    for k0 in range(0, DL, BLOCK_K):
        k_next = _next_k(k0, DL, BLOCK_K)
        b_gate_next = _scales_tile(p_gate_scales, k_next, STRIDE_SCALES, BLOCK_N, BLOCK_K)
        b_up_next = _scales_tile(p_up_scales, k_next, STRIDE_SCALES, BLOCK_N, BLOCK_K)
        b_a = tl.load(p_rows + tl.multiple_of(k0, BLOCK_K), mask=m_m[:, None], other=0.0)
        b_gate = _ahead_product(b_gate, b_a, p_gate_words, b_gate_scales, k0, STRIDE_WORDS,
                                BLOCK_N, BLOCK_K, DOT_FP32, WORD_DECODE)
        b_up = _ahead_product(b_up, b_a, p_up_words, b_up_scales, k0, STRIDE_WORDS, BLOCK_N,
                              BLOCK_K, DOT_FP32, WORD_DECODE)
        b_gate_scales = b_gate_next
        b_up_scales = b_up_next
    store_gate_up(b_gate, b_up, h_ptr, h_row0, m_m, i_n, beta, linear_beta, F, HAS_LINEAR_CAP,
                  BLOCK_M, BLOCK_N, BLOCK_K, WORDS_MODE, WORD_DECODE)


@triton.jit
def _down_scales_ahead(h_ptr, h_row0, m_m, i_e, i_n, words_ptr, scales_ptr, F: tl.constexpr,
                       DL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
                       WORD_DECODE: tl.constexpr):
    """moe_gemv_kernels.down_product ("dot_t_words") with the scale bytes a K step ahead."""
    o_m, o_k = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_K)
    p_rows = h_ptr + (h_row0 + o_m)[:, None] * F + o_k[None, :]
    STRIDE_WORDS: tl.constexpr = F // WORD_INPUTS
    STRIDE_SCALES: tl.constexpr = F // 32
    row0 = i_e.to(tl.int64) * DL + i_n * BLOCK_N
    p_words = words_ptr + row0 * STRIDE_WORDS
    p_scales = scales_ptr + row0 * STRIDE_SCALES
    b_acc = tile_accumulator(BLOCK_M, BLOCK_N, WORDS_MODE)
    b_scales = _scales_tile(p_scales, 0, STRIDE_SCALES, BLOCK_N, BLOCK_K)
    for k0 in range(0, F, BLOCK_K):
        b_next = _scales_tile(p_scales, _next_k(k0, F, BLOCK_K), STRIDE_SCALES, BLOCK_N,
                              BLOCK_K)
        b_a = tl.load(p_rows + tl.multiple_of(k0, BLOCK_K), mask=m_m[:, None], other=0.0)
        b_acc = _ahead_product(b_acc, b_a, p_words, b_scales, k0, STRIDE_WORDS, BLOCK_N,
                               BLOCK_K, DOT_FP32, WORD_DECODE)
        b_scales = b_next
    return undo_one_factor(tl.trans(b_acc), WORD_DECODE)


@triton.jit
def moe_gate_up_words_kernel(
    # pointers: z [T, Dl] in word order, the expert blocks, w13 words/scales [E, 2F, *],
    # h [rows, F]
    z_ptr, pair_ids_ptr, block_expert_ptr, words_ptr, scales_ptr, h_ptr,
    # sizes and strides
    num_pairs, stride_z,
    # activation
    beta, linear_beta,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    HAS_LINEAR_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr,
    SCALES_AHEAD: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    h_row0 = (i_b * BLOCK_M).to(tl.int64)
    if SCALES_AHEAD:
        _gate_up_scales_ahead(z_ptr, stride_z, pairs // TOP_K, m_m, h_row0, expert, i_n,
                              words_ptr, scales_ptr, h_ptr, beta, linear_beta, F, DL,
                              HAS_LINEAR_CAP, BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, WORD_DECODE)
    else:
        gate_up_rows(z_ptr, stride_z, pairs // TOP_K, m_m, h_row0, expert, i_n, words_ptr,
                     scales_ptr, h_ptr, beta, linear_beta, F, DL, HAS_LINEAR_CAP, BLOCK_M,
                     BLOCK_N, BLOCK_K, WORD_INPUTS, WORDS_MODE, DOT_FP32, 0, WORD_DECODE)


@triton.jit
def moe_down_words_kernel(
    # pointers: h [rows, F] (word order), the expert blocks, w2 words/scales [E, Dl, *],
    # routing weights [T*k], u [T, Dl]
    h_ptr, pair_ids_ptr, block_expert_ptr, words_ptr, scales_ptr, topk_weights_ptr, u_ptr,
    # sizes
    num_pairs,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr, SCALES_AHEAD: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    _pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    if SCALES_AHEAD:
        b_acc = _down_scales_ahead(h_ptr, (i_b * BLOCK_M).to(tl.int64), m_m, expert, i_n,
                                   words_ptr, scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K,
                                   DOT_FP32, WORD_DECODE)
    else:
        b_acc = down_product(h_ptr, (i_b * BLOCK_M).to(tl.int64), m_m, expert, i_n, words_ptr,
                             scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K, WORD_INPUTS,
                             WORDS_MODE, DOT_FP32, 0, WORD_DECODE)
    # The pairs again after the K loop: nothing of them stays live through it.
    pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    b_weight = tl.load(topk_weights_ptr + pairs, mask=m_m, other=0.0)
    add_rows(u_ptr, pairs // TOP_K, m_m, b_weight, b_acc, i_n, DL, BLOCK_N)


def moe_experts_mxfp4_grouped_words(
    z: torch.Tensor, topk_weights: torch.Tensor, blocks: ExpertBlocks,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None, u: torch.Tensor,
    block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
    backend: str | None, on_interpreter: bool, one_factor_exact: bool,
    scales_ahead: bool = False,
) -> torch.Tensor:
    """Adds the routed experts of the pairs in `blocks` (built with block_m) into u fp32
    [T, Dl]; shapes checked by moe_grouped_gemm's launcher. block_n (weight rows per program,
    the product's M: 64 per 4 warps) and block_k must divide Dl and F. scales_ahead: each
    K step's scale bytes loaded in the step before (see the module docstring)."""
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_pairs = topk_weights.numel()
    for size in (latent_size, intermediate_size):
        if size % block_n or size % block_k:
            raise ValueError(f"moe_experts_mxfp4 (grouped words): Dl={latent_size} and "
                             f"F={intermediate_size} must be multiples of block_n={block_n} "
                             f"and block_k={block_k}")
    hidden = torch.empty((blocks.num_blocks_max * block_m, intermediate_size), dtype=z.dtype,
                         device=z.device)
    meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=topk_weights.shape[1],
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                # fp32 activations: exact fp32 products (no TF32), as on the interpreter.
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                WORD_DECODE=pick_word_decode("dot_t_words", z.dtype, backend, one_factor_exact),
                SCALES_AHEAD=scales_ahead,
                num_warps=num_warps, num_stages=num_stages)
    z_words = to_words_order(z, block_k)
    moe_gate_up_words_kernel[(blocks.num_blocks_max, intermediate_size // block_n)](
        z_words, blocks.pair_ids, blocks.block_expert, w13_packed.view(torch.int32), w13_scales,
        hidden, num_pairs, z_words.stride(0), beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_words_kernel[(blocks.num_blocks_max, latent_size // block_n)](
        hidden, blocks.pair_ids, blocks.block_expert, w2_packed.view(torch.int32), w2_scales,
        topk_weights.float().contiguous(), u, num_pairs, **meta,
    )
    return u
