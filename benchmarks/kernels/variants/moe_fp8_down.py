"""A benchmark variant (no default selects it): the routed MXFP4 experts with the SiTU-GLU output
h in MXFP8 for the down projection (MODEL_SPEC §4.7), and optionally every product through
``tl.dot_scaled``. bench_moe.py times it beside the package's kernels (its figures:
benchmarks/NOTES.md, "MoE: MXFP8 down activations": correct, slower on Hopper, which has no
native MX MMA).

``moe_experts_mxfp4_fp8_down_torch`` defines it: the package op's math with h quantized to
MXFP8 (``atomk31/quant/mxfp8.py``: e4m3fn values, one E8M0 scale per 32 along F, the OCP rule
``e = floor(log2 amax) - 8``) straight from its fp32 value, and the down projection multiplying
the dequantized values. The Triton kernels are the package's byte-decode grouped GEMMs
(atomk31/triton_kernels/moe_grouped_gemm.py) with the gate_up epilogue storing MXFP8 (rounded
explicitly, so every backend writes the same bytes) and the down kernel either handing both MX
operands to ``tl.dot_scaled(.., "e4m3", .., "e2m1")`` (``use_dot_scaled``; on gfx950 that is
the scaled MFMA) or dequantizing them (e4m3 x 2^k is exact in BF16) for ``tl.dot``.
``use_dot_scaled`` also sends the gate_up product (BF16 activations x E2M1) to
``tl.dot_scaled``, which gfx950 and Hopper decompose into plain BF16 products.
"""

import torch
import triton
import triton.language as tl

from atomk31.ops.activation import situ_glu_torch
from atomk31.quant import dequantize_mxfp4
from atomk31.quant.mxfp8 import dequantize_mxfp8, quantize_mxfp8
from atomk31.triton_kernels.kv_write import round_to_e4m3
from atomk31.triton_kernels.moe_grouped_gemm import (_dequantize_mxfp4, _tanh,
                                                     check_kernel_operands, grouped_tiles)
from atomk31.triton_kernels.moe_routing import sort_pairs_by_expert
from atomk31.triton_kernels.runtime import runs_on_interpreter


@triton.jit
def _quantize_mxfp8(b_h, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 -> (e4m3fn values as fp32 [BLOCK_M, BLOCK_N], E8M0 bytes as int32
    [BLOCK_M, BLOCK_N/32]): e = floor(log2 amax) - 8 from amax's exponent bits, clamped to
    >= -127; values RNE on the e4m3fn grid, saturating at 448; NaN/inf blocks get 0xFF."""
    b_blocks = tl.reshape(b_h, (BLOCK_M, BLOCK_N // 32, 32))
    b_amax = tl.max(tl.abs(b_blocks), axis=2)
    b_has_nan = tl.max((b_blocks != b_blocks).to(tl.int32), axis=2)
    b_field = (b_amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    b_exponent = tl.maximum(tl.where(b_field == 0, -127, b_field - 127 - 8), -127)
    # 2^-e from its bits (127 - e is in 8..254: always a normal float), so the scaling is exact.
    b_inverse = ((127 - b_exponent) << 23).to(tl.float32, bitcast=True)
    b_values = round_to_e4m3(b_blocks * b_inverse[:, :, None], 448.0)
    b_scales = tl.where((b_field == 255) | (b_has_nan != 0), 255, b_exponent + 127)
    return tl.reshape(b_values, (BLOCK_M, BLOCK_N)), b_scales


@triton.jit
def _dequantize_mxfp8(b_values, b_scales, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] e4m3fn and [BLOCK_M, BLOCK_K/32] E8M0 bytes -> fp32 (exact; byte 0xFF
    is NaN, byte 0 flushes to 0 as the weights' e8m0_factor does)."""
    b_factor = (b_scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    b_factor = tl.where(b_scales.to(tl.int32) == 255, float("nan"), b_factor)
    b_blocks = tl.reshape(b_values.to(tl.float32), (BLOCK_M, BLOCK_K // 32, 32))
    return tl.reshape(b_blocks * b_factor[:, :, None], (BLOCK_M, BLOCK_K))


@triton.jit
def _mxfp4_tile_product(
    b_a, b_a_scales, p_packed, p_scales, k0, m_n, acc,
    stride_packed, stride_scales, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT_SCALED: tl.constexpr, DOT_FP32: tl.constexpr, A_IS_MXFP8: tl.constexpr,
):
    """acc + b_a [BLOCK_M, BLOCK_K] @ W[rows, k0:k0+BLOCK_K]^T for the expert rows at p_packed.
    A_IS_MXFP8: b_a is e4m3fn with E8M0 scales b_a_scales [BLOCK_M, BLOCK_K/32] (else unused)."""
    o_n = tl.arange(0, BLOCK_N)
    o_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    o_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    b_packed = tl.load(p_packed + o_n[:, None] * stride_packed + o_kp[None, :],
                       mask=m_n[:, None], other=0)
    b_scales = tl.load(p_scales + o_n[:, None] * stride_scales + o_ks[None, :],
                       mask=m_n[:, None], other=0)
    # if/else, not early returns: Triton compiles the statements after a `return` under a
    # constexpr `if` too, and the bf16 paths do not type-check for e4m3 activations.
    if USE_DOT_SCALED:
        if A_IS_MXFP8:
            acc = tl.dot_scaled(b_a, b_a_scales, "e4m3", tl.trans(b_packed), b_scales, "e2m1",
                                acc)
        else:
            acc = tl.dot_scaled(b_a, None, "bf16", tl.trans(b_packed), b_scales, "e2m1", acc)
    else:
        if A_IS_MXFP8:
            b_a = _dequantize_mxfp8(b_a, b_a_scales, b_a.shape[0], BLOCK_K)
            if not DOT_FP32:
                b_a = b_a.to(tl.bfloat16)  # exact: 4 significant bits times a power of two
        b_w = _dequantize_mxfp4(b_packed, b_scales, BLOCK_N, BLOCK_K)
        if DOT_FP32:
            # The interpreter computes BF16 products wrongly: stay in fp32 there.
            acc = tl.dot(b_a.to(tl.float32), tl.trans(b_w), acc, input_precision="ieee")
        else:
            acc = tl.dot(b_a, tl.trans(b_w.to(b_a.dtype)), acc)
    return acc


@triton.jit
def moe_gate_up_fp8_down_kernel(
    # pointers: z [T, Dl], the expert blocks, w13 packed/scales [E, 2F, *], h [rows, F],
    # h's E8M0 scales [rows, F/32] (FP8_DOWN only)
    z_ptr, pair_ids_ptr, block_expert_ptr, packed_ptr, scales_ptr, h_ptr, h_scales_ptr,
    # sizes and strides
    num_pairs, stride_z,
    # activation
    beta, linear_beta,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    HAS_LINEAR_CAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, USE_DOT_SCALED: tl.constexpr, DOT_FP32: tl.constexpr,
    FP8_DOWN: tl.constexpr,
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
        b_gate = _mxfp4_tile_product(b_a, None, p_gate_packed, p_gate_scales, k0, m_n, b_gate,
                                     stride_packed, stride_scales, BLOCK_N, BLOCK_K,
                                     USE_DOT_SCALED, DOT_FP32, False)
        b_up = _mxfp4_tile_product(b_a, None, p_up_packed, p_up_scales, k0, m_n, b_up,
                                   stride_packed, stride_scales, BLOCK_N, BLOCK_K,
                                   USE_DOT_SCALED, DOT_FP32, False)
    # SiTU-GLU (§4.8): SiLU with the gate soft-capped at ±beta, up capped at ±linear_beta.
    b_h = beta * _tanh(b_gate / beta) * tl.sigmoid(b_gate)
    if HAS_LINEAR_CAP:
        b_up = linear_beta * _tanh(b_up / linear_beta)
    b_h = b_h * b_up
    if FP8_DOWN:
        # MXFP8 straight from fp32 (no rounding to z's dtype first), as the torch op.
        b_h, b_h_scales = _quantize_mxfp8(b_h, BLOCK_M, BLOCK_N)
        o_s = i_n * (BLOCK_N // 32) + tl.arange(0, BLOCK_N // 32)
        tl.store(h_scales_ptr + o_m.to(tl.int64)[:, None] * (F // 32) + o_s[None, :],
                 b_h_scales.to(tl.uint8), mask=m_m[:, None] & (o_s < F // 32)[None, :])
    tl.store(h_ptr + o_m.to(tl.int64)[:, None] * F + o_n[None, :],
             b_h.to(h_ptr.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def moe_down_fp8_down_kernel(
    # pointers: h [rows, F], h's E8M0 scales [rows, F/32] (FP8_DOWN only), expert blocks,
    # w2 packed/scales [E, Dl, *], weights [T*k], u [T, Dl]
    h_ptr, h_scales_ptr, pair_ids_ptr, block_expert_ptr, packed_ptr, scales_ptr,
    topk_weights_ptr, u_ptr,
    # sizes
    num_pairs,
    # meta-parameters
    E: tl.constexpr, F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT_SCALED: tl.constexpr, DOT_FP32: tl.constexpr, FP8_DOWN: tl.constexpr,
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
        b_a_scales = None
        if FP8_DOWN:
            o_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            b_a_scales = tl.load(h_scales_ptr + o_m.to(tl.int64)[:, None] * (F // 32) +
                                 o_ks[None, :], mask=m_m[:, None], other=0)
        b_acc = _mxfp4_tile_product(b_a, b_a_scales, p_packed, p_scales, k0, m_n, b_acc,
                                    stride_packed, stride_scales, BLOCK_N, BLOCK_K,
                                    USE_DOT_SCALED, DOT_FP32, FP8_DOWN)
    b_weight = tl.load(topk_weights_ptr + pairs, mask=m_m, other=0.0)
    tokens = (pairs // TOP_K).to(tl.int64)
    tl.atomic_add(u_ptr + tokens[:, None] * DL + o_n[None, :], b_acc * b_weight[:, None],
                  mask=m_m[:, None] & m_n[None, :], sem="relaxed")


def moe_experts_mxfp4_fp8_down(
    z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
    use_dot_scaled: bool = False,
) -> torch.Tensor:
    """``moe_experts_mxfp4``'s arguments -> u fp32 [T, Dl], h in MXFP8 (module docstring), in
    the package's byte-decode tiles. ``use_dot_scaled`` needs a GPU."""
    check_kernel_operands(w13_packed, w13_scales, w2_packed, w2_scales)
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_tokens, top_k = topk_ids.shape
    num_pairs = num_tokens * top_k
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if num_pairs == 0:
        return u
    on_interpreter = runs_on_interpreter(moe_gate_up_fp8_down_kernel)
    if use_dot_scaled and on_interpreter:
        raise ValueError("moe_experts_mxfp4_fp8_down: use_dot_scaled does not run under the "
                         "Triton interpreter; leave it False on the CPU")
    config = grouped_tiles(num_pairs, num_experts, words=False)
    blocks = sort_pairs_by_expert(topk_ids, num_experts, config.block_m)
    z = z.contiguous()
    num_rows = blocks.num_blocks_max * config.block_m
    hidden = torch.empty((num_rows, intermediate_size), device=z.device,
                         dtype=torch.float8_e4m3fn)
    hidden_scales = torch.empty((num_rows, intermediate_size // 32), dtype=torch.uint8,
                                device=z.device)
    meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=top_k,
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                USE_DOT_SCALED=use_dot_scaled, FP8_DOWN=True,
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                num_warps=config.num_warps, num_stages=config.num_stages)
    moe_gate_up_fp8_down_kernel[(blocks.num_blocks_max,
                                 triton.cdiv(intermediate_size, config.block_n))](
        z, blocks.pair_ids, blocks.block_expert, w13_packed, w13_scales, hidden, hidden_scales,
        num_pairs, z.stride(0), beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_fp8_down_kernel[(blocks.num_blocks_max, triton.cdiv(latent_size, config.block_n))](
        hidden, hidden_scales, blocks.pair_ids, blocks.block_expert, w2_packed, w2_scales,
        topk_weights.float().contiguous(), u, num_pairs, **meta,
    )
    return u


def moe_experts_mxfp4_fp8_down_torch(
    z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
) -> torch.Tensor:
    """The variant's definition in fp32: each used expert once over its (token, slot) pairs,
    h through MXFP8 straight from fp32."""
    out = torch.zeros(z.shape[0], 2 * w13_packed.shape[2], dtype=torch.float32,
                      device=z.device)
    flat_ids = topk_ids.reshape(-1).long()
    tokens_of_pairs = torch.arange(z.shape[0], device=z.device).repeat_interleave(
        topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1).float()
    for expert in torch.unique(flat_ids).tolist():
        pairs = (flat_ids == expert).nonzero().flatten()
        tokens = tokens_of_pairs[pairs]
        w13 = dequantize_mxfp4(w13_packed[expert], w13_scales[expert])
        gate, up = (z[tokens].float() @ w13.T).chunk(2, dim=-1)
        hidden = dequantize_mxfp8(*quantize_mxfp8(situ_glu_torch(gate, up, beta, linear_beta)))
        w2 = dequantize_mxfp4(w2_packed[expert], w2_scales[expert])
        out.index_add_(0, tokens, (hidden @ w2.T) * flat_weights[pairs, None])
    return out
