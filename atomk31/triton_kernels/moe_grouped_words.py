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
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.moe_gemv import pick_word_decode, to_words_order
from atomk31.triton_kernels.moe_gemv_kernels import add_rows, down_product, gate_up_rows
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
    gate_up_rows(z_ptr, stride_z, pairs // TOP_K, m_m, (i_b * BLOCK_M).to(tl.int64), expert,
                 i_n, words_ptr, scales_ptr, h_ptr, beta, linear_beta, F, DL, HAS_LINEAR_CAP,
                 BLOCK_M, BLOCK_N, BLOCK_K, WORD_INPUTS, WORDS_MODE, DOT_FP32, 0, WORD_DECODE)


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
    b_acc = down_product(h_ptr, (i_b * BLOCK_M).to(tl.int64), m_m, expert, i_n, words_ptr,
                         scales_ptr, F, DL, BLOCK_M, BLOCK_N, BLOCK_K, WORD_INPUTS, WORDS_MODE,
                         DOT_FP32, 0, WORD_DECODE)
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
) -> torch.Tensor:
    """Adds the routed experts of the pairs in `blocks` (built with block_m) into u fp32
    [T, Dl]; shapes checked by moe_grouped_gemm's launcher. block_n (weight rows per program,
    the product's M: 64 per 4 warps) and block_k must divide Dl and F."""
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
