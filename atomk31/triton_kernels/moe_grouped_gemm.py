"""Routed experts from MXFP4 weights in Triton: two grouped GEMMs with the weights decoded byte
by byte (MODEL_SPEC §4.7, §3.3, §4.8), the portable implementation of ``moe_experts_mxfp4``
for more than a GEMV's tokens (ops/moe.py's "small_groups" and "large_groups"; on NVIDIA with
BF16 activations the large groups take moe_grouped_words.py).

Contract: ``moe_experts_mxfp4`` of ``atomk31/ops/moe.py``, which checks the arguments. The
(token, slot) pairs are first grouped by expert (``moe_routing.sort_pairs_by_expert``); a
program owns BLOCK_M rows of one expert and BLOCK_N output columns:

1. ``moe_gate_up_kernel``: ``h = situ_glu(z W1_e^T, z W3_e^T)`` with both halves of the
   fused ``w13`` (gate rows 0..F-1, up rows F..2F-1) accumulated side by side, so SiTU-GLU
   runs in the epilogue; h is rounded to z's dtype (§4.8) and stored in expert order.
2. ``moe_down_kernel``: ``h W2_e^T`` times the pair's routing weight, added (fp32 atomics)
   into ``u [T, Dl]``: the weighted combine over the k experts of a token.

MXFP4 weights are dequantized in the kernel, 32 inputs per E8M0 scale: a nibble's E2M1 value
times ``2^(scale - 127)`` is exact in BF16, so the BF16 tensor-core product sees exactly the
checkpoint's weights.

Tiles (``grouped_tiles``): rows per program about the expected pairs per expert (16 or 32 for
small groups), 128 once an expert averages more than 32 pairs; 128 x 64 weight tiles at 128
rows, else 64 x 128; 8 warps past 32 rows (the measurements: benchmarks/NOTES.md, "MoE").
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.moe_mxfp4_decode import e2m1_times_2_pow_minus_14, e8m0_factor
from atomk31.triton_kernels.moe_routing import sort_pairs_by_expert
from atomk31.triton_kernels.runtime import runs_on_interpreter

MXFP4_BLOCK = 32
# Mean pairs per expert up to which a block holds 16 / 32 rows ("small groups"), and the rows of
# a block past that ("large groups").
SMALL_GROUP_ROWS = (16, 32)
LARGE_GROUP_ROWS = 128


@dataclass(frozen=True)
class GroupedConfig:
    """Tiles of the grouped GEMMs: ``block_m`` pairs (rows) of one expert per program,
    ``block_n`` weight rows x ``block_k`` inputs per K step, ``num_warps``, ``num_stages``."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 3


def pick_block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per program: about the mean number of pairs per expert, 128 past 32."""
    per_expert = num_pairs / max(num_experts, 1)
    for block_m in SMALL_GROUP_ROWS:
        if per_expert <= block_m:
            return block_m
    return LARGE_GROUP_ROWS


def grouped_tiles(num_pairs: int, num_experts: int, words: bool) -> GroupedConfig:
    """The tiles of ``num_pairs`` pairs over ``num_experts`` experts (module docstring), for the
    byte decode here or the word decode of moe_grouped_words.py (``words``: 128 x 128 weight
    tiles on 8 warps, two warpgroups of 64 rows, at 128 rows; else 64 x 128 on 4)."""
    block_m = pick_block_m(num_pairs, num_experts)
    if words:
        return GroupedConfig(block_m, *((128, 128, 8) if block_m == 128 else (64, 128, 4)))
    num_warps = 4 if block_m <= 32 else 8
    return GroupedConfig(block_m, *((128, 64) if block_m == 128 else (64, 128)), num_warps)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _dequantize_mxfp4(b_packed, b_scales, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K/2] uint8 codes (even input in the low nibble) and [BLOCK_N, BLOCK_K/32]
    E8M0 bytes -> [BLOCK_N, BLOCK_K] fp32 weights (E2M1 through FP16 bits)."""
    b_packed = b_packed.to(tl.int32)
    b_values = tl.join(e2m1_times_2_pow_minus_14(b_packed & 0xF),
                       e2m1_times_2_pow_minus_14(b_packed >> 4))
    b_factor = e8m0_factor(b_scales)
    b_values = tl.reshape(b_values, (BLOCK_N, BLOCK_K // 32, 32)) * b_factor[:, :, None]
    return tl.reshape(b_values, (BLOCK_N, BLOCK_K))


@triton.jit
def _mxfp4_tile_product(
    b_a, p_packed, p_scales, k0, m_n, acc, stride_packed, stride_scales,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """acc + b_a [BLOCK_M, BLOCK_K] @ W[rows, k0:k0+BLOCK_K]^T for the expert rows at p_packed."""
    o_n = tl.arange(0, BLOCK_N)
    o_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    o_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    b_packed = tl.load(p_packed + o_n[:, None] * stride_packed + o_kp[None, :],
                       mask=m_n[:, None], other=0)
    b_scales = tl.load(p_scales + o_n[:, None] * stride_scales + o_ks[None, :],
                       mask=m_n[:, None], other=0)
    b_w = _dequantize_mxfp4(b_packed, b_scales, BLOCK_N, BLOCK_K)
    if DOT_FP32:
        # The interpreter computes BF16 products wrongly: stay in fp32 there.
        acc = tl.dot(b_a.to(tl.float32), tl.trans(b_w), acc, input_precision="ieee")
    else:
        acc = tl.dot(b_a, tl.trans(b_w.to(b_a.dtype)), acc)
    return acc


@triton.jit
def moe_gate_up_kernel(
    # pointers: z [T, Dl], the expert blocks, w13 packed/scales [E, 2F, *], h [rows, F]
    z_ptr, pair_ids_ptr, block_expert_ptr, packed_ptr, scales_ptr, h_ptr,
    # sizes and strides
    num_pairs, stride_z,
    # activation
    beta, linear_beta,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    HAS_LINEAR_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    o_m = i_b * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + o_m)
    m_m = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < F
    stride_packed, stride_scales = DL // 2, DL // 32
    p_gate_packed = packed_ptr + (expert.to(tl.int64) * 2 * F + i_n * BLOCK_N) * stride_packed
    p_gate_scales = scales_ptr + (expert.to(tl.int64) * 2 * F + i_n * BLOCK_N) * stride_scales
    p_up_packed = p_gate_packed + F * stride_packed
    p_up_scales = p_gate_scales + F * stride_scales
    b_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, DL, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_a = tl.load(z_ptr + tokens[:, None] * stride_z + o_k[None, :], mask=m_m[:, None],
                      other=0.0)
        b_gate = _mxfp4_tile_product(b_a, p_gate_packed, p_gate_scales, k0, m_n, b_gate,
                                     stride_packed, stride_scales, BLOCK_N, BLOCK_K, DOT_FP32)
        b_up = _mxfp4_tile_product(b_a, p_up_packed, p_up_scales, k0, m_n, b_up,
                                   stride_packed, stride_scales, BLOCK_N, BLOCK_K, DOT_FP32)
    # SiTU-GLU (§4.8): SiLU with the gate soft-capped at ±beta, up capped at ±linear_beta.
    b_h = beta * _tanh(b_gate / beta) * tl.sigmoid(b_gate)
    if HAS_LINEAR_CAP:
        b_up = linear_beta * _tanh(b_up / linear_beta)
    b_h = b_h * b_up
    tl.store(h_ptr + o_m.to(tl.int64)[:, None] * F + o_n[None, :],
             b_h.to(h_ptr.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def moe_down_kernel(
    # pointers: h [rows, F], expert blocks, w2 packed/scales [E, Dl, *], weights [T*k],
    # u [T, Dl]
    h_ptr, pair_ids_ptr, block_expert_ptr, packed_ptr, scales_ptr, topk_weights_ptr, u_ptr,
    # sizes
    num_pairs,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + i_b)
    if expert >= E:
        return
    o_m = i_b * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + o_m)
    m_m = pairs < num_pairs
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < DL
    stride_packed, stride_scales = F // 2, F // 32
    p_packed = packed_ptr + (expert.to(tl.int64) * DL + i_n * BLOCK_N) * stride_packed
    p_scales = scales_ptr + (expert.to(tl.int64) * DL + i_n * BLOCK_N) * stride_scales
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_a = tl.load(h_ptr + o_m.to(tl.int64)[:, None] * F + o_k[None, :], mask=m_m[:, None],
                      other=0.0)
        b_acc = _mxfp4_tile_product(b_a, p_packed, p_scales, k0, m_n, b_acc, stride_packed,
                                    stride_scales, BLOCK_N, BLOCK_K, DOT_FP32)
    b_weight = tl.load(topk_weights_ptr + pairs, mask=m_m, other=0.0)
    tokens = (pairs // TOP_K).to(tl.int64)
    tl.atomic_add(u_ptr + tokens[:, None] * DL + o_n[None, :], b_acc * b_weight[:, None],
                  mask=m_m[:, None] & m_n[None, :], sem="relaxed")


def moe_experts_mxfp4_grouped_triton(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
    one_factor_exact: bool = False,
    config: GroupedConfig | None = None,
) -> torch.Tensor:
    """``moe_experts_mxfp4`` (contract and argument check: ops/moe.py) -> u fp32 [T, Dl].
    ``one_factor_exact`` does not apply (the byte decode multiplies by the exact factor);
    ``config``: the tiles (None: ``grouped_tiles``)."""
    check_kernel_operands(w13_packed, w13_scales, w2_packed, w2_scales)
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_tokens, top_k = topk_ids.shape
    num_pairs = num_tokens * top_k
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if num_pairs == 0:
        return u
    config = config or grouped_tiles(num_pairs, num_experts, words=False)
    blocks = sort_pairs_by_expert(topk_ids, num_experts, config.block_m)
    if z.stride(1) != 1:
        z = z.contiguous()
    hidden = torch.empty((blocks.num_blocks_max * config.block_m, intermediate_size),
                         device=z.device, dtype=z.dtype)
    on_interpreter = runs_on_interpreter(moe_gate_up_kernel)
    meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=top_k,
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                # fp32 activations: exact fp32 products (no TF32), as on the interpreter.
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                num_warps=config.num_warps, num_stages=config.num_stages)
    moe_gate_up_kernel[(blocks.num_blocks_max, triton.cdiv(intermediate_size, config.block_n))](
        z, blocks.pair_ids, blocks.block_expert, w13_packed, w13_scales, hidden, num_pairs,
        z.stride(0), beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_kernel[(blocks.num_blocks_max, triton.cdiv(latent_size, config.block_n))](
        hidden, blocks.pair_ids, blocks.block_expert, w2_packed, w2_scales,
        topk_weights.float().contiguous(), u, num_pairs, **meta,
    )
    return u


def check_kernel_operands(*weights: torch.Tensor) -> None:
    """What the grouped kernels need beyond the op's contract: contiguous weights (their
    offsets are computed from the shapes) and Dl, F multiples of 128 (the K tiles)."""
    w13_packed = weights[0]
    latent_size, intermediate_size = 2 * w13_packed.shape[2], w13_packed.shape[1] // 2
    if not all(w.is_contiguous() for w in weights):
        raise ValueError("moe_experts_mxfp4 (triton): the packed weights and scales must be "
                         "contiguous; pass tensor.contiguous()")
    if latent_size % 128 or intermediate_size % 128:
        raise ValueError(f"moe_experts_mxfp4 (triton): Dl and F must be multiples of 128 (the "
                         f"K tile), got Dl={latent_size}, F={intermediate_size}; use the torch "
                         "backend")
