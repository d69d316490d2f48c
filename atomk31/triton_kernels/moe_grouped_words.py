"""Grouped MoE GEMMs with the GEMVs' word decode, the NVIDIA BF16 implementation of
``moe_experts_mxfp4`` for large groups (ops/moe.py's "large_groups": 128-pair blocks): the two
kernels of ``moe_grouped_gemm.py`` with the weights as the tensor-core product's first operand,
decoded 8 nibbles per int32 word straight into its registers (moe_gemv_tiles "dot_t_words"),
and the sorted (token, slot) pairs of ``moe_routing.sort_pairs_by_expert`` as its N side.

Why: the byte-decode grouped GEMMs decode every weight once per 128-pair block with ~10 ops per
weight and store it to shared memory as the B operand, the decode about as long as the MMA per
tile. The word decode is ~2.6 ops per weight (21 per word of 8, inline PTX with BF16x2
multiplies) and needs no shared-memory round trip of the weights; what stays is the
activations' tile in shared memory (the B operand), as in the GEMVs' gathered rows.

A program owns BLOCK_M sorted pairs of one expert (grid axis 0: the expert blocks) and
BLOCK_N weight rows (axis 1):
1. ``moe_gate_up_words_kernel``: h rows (in the blocks' pair order) = SiTU-GLU of the gate and
   up products, rounded to z's dtype, columns in word order (the down kernel's K order).
2. ``moe_down_words_kernel``: h W2_e^T times the pair's routing weight, fp32 atomics into u.
z arrives in word order (``moe_gemv.to_words_order``), so BLOCK_K divides Dl and F.

Scales a step ahead: with 128-input K tiles a row has 4 scale bytes per step, 2 per thread at 8
warps: too small for cp.async, so Triton would leave that load in the loop as a plain LDG a few
dozen instructions before its first use, and every K step would wait on it. So the K loops
(``_gate_up_scales_ahead`` / ``_down_scales_ahead``) load the next step's bytes at the top of
each step and carry them in registers (the last step reloads its own tile: in bounds, unused).
The decode is moe_gemv_tiles' (``load_words_tile`` + ``decode_words_tile``, the two halves of
``_words_tile_weights``), with the scale bytes loaded a step earlier: the same values.
"""

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from atomk31.triton_kernels.moe_gemv import pick_word_decode, to_words_order
from atomk31.triton_kernels.moe_gemv_kernels import add_rows, store_gate_up
from atomk31.triton_kernels.moe_gemv_tiles import (decode_words_tile, load_words_tile,
                                                   tile_accumulator, undo_one_factor)
from atomk31.triton_kernels.moe_grouped_gemm import (GroupedConfig, check_kernel_operands,
                                                     grouped_tiles)
from atomk31.triton_kernels.moe_routing import sort_pairs_by_expert
from atomk31.triton_kernels.runtime import runs_on_interpreter

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
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    h_row0 = (i_b * BLOCK_M).to(tl.int64)
    _gate_up_scales_ahead(z_ptr, stride_z, pairs // TOP_K, m_m, h_row0, expert, i_n, words_ptr,
                          scales_ptr, h_ptr, beta, linear_beta, F, DL, HAS_LINEAR_CAP, BLOCK_M,
                          BLOCK_N, BLOCK_K, DOT_FP32, WORD_DECODE)


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
    DOT_FP32: tl.constexpr, WORD_DECODE: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    _pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    b_acc = _down_scales_ahead(h_ptr, (i_b * BLOCK_M).to(tl.int64), m_m, expert, i_n,
                               words_ptr, scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K,
                               DOT_FP32, WORD_DECODE)
    # The pairs again after the K loop: nothing of them stays live through it.
    pairs, m_m = _block_pairs(pair_ids_ptr, i_b, num_pairs, BLOCK_M)
    b_weight = tl.load(topk_weights_ptr + pairs, mask=m_m, other=0.0)
    add_rows(u_ptr, pairs // TOP_K, m_m, b_weight, b_acc, i_n, DL, BLOCK_N)


def moe_experts_mxfp4_grouped_words_triton(
    z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
    one_factor_exact: bool = False, config: GroupedConfig | None = None,
) -> torch.Tensor:
    """``moe_experts_mxfp4`` (contract and argument check: ops/moe.py) -> u fp32 [T, Dl].
    ``config``: the tiles (None: ``grouped_tiles``); block_n (weight rows per program, the
    product's M: 64 per 4 warps) and block_k must divide Dl and F."""
    check_kernel_operands(w13_packed, w13_scales, w2_packed, w2_scales)
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_tokens, top_k = topk_ids.shape
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if topk_ids.numel() == 0:
        return u
    config = config or grouped_tiles(topk_ids.numel(), num_experts, words=True)
    for size in (latent_size, intermediate_size):
        if size % config.block_n or size % config.block_k:
            raise ValueError(f"moe_experts_mxfp4 (grouped words): Dl={latent_size} and "
                             f"F={intermediate_size} must be multiples of block_n="
                             f"{config.block_n} and block_k={config.block_k}")
    blocks = sort_pairs_by_expert(topk_ids, num_experts, config.block_m)
    on_interpreter = runs_on_interpreter(moe_gate_up_words_kernel)
    backend = None if on_interpreter else driver.active.get_current_target().backend
    hidden = torch.empty((blocks.num_blocks_max * config.block_m, intermediate_size),
                         dtype=z.dtype, device=z.device)
    meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=top_k,
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                # fp32 activations: exact fp32 products (no TF32), as on the interpreter.
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                WORD_DECODE=pick_word_decode(z.dtype, backend, one_factor_exact),
                num_warps=config.num_warps, num_stages=config.num_stages)
    z_words = to_words_order(z, config.block_k)
    moe_gate_up_words_kernel[(blocks.num_blocks_max, intermediate_size // config.block_n)](
        z_words, blocks.pair_ids, blocks.block_expert, w13_packed.view(torch.int32), w13_scales,
        hidden, topk_ids.numel(), z_words.stride(0), beta,
        1.0 if linear_beta is None else linear_beta, HAS_LINEAR_CAP=linear_beta is not None,
        **meta,
    )
    moe_down_words_kernel[(blocks.num_blocks_max, latent_size // config.block_n)](
        hidden, blocks.pair_ids, blocks.block_expert, w2_packed.view(torch.int32), w2_scales,
        topk_weights.float().contiguous(), u, topk_ids.numel(), **meta,
    )
    return u
