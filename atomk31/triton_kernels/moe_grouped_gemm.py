"""Routed experts from MXFP4 weights in Triton: two grouped GEMMs (MODEL_SPEC §4.7, §3.3, §4.8).

Contract: ``moe_experts_mxfp4`` of ``atomk31/ops/moe.py``. Up to SMALL_BATCH_MAX_TOKENS
tokens the launcher hands over to the weight-streaming GEMVs of ``moe_gemv.py``. Above, the
(token, slot) pairs are first grouped by expert (``moe_routing.sort_pairs_by_expert``); a
program owns BLOCK_M rows of one expert and BLOCK_N output columns:

1. ``moe_gate_up_kernel``: ``h = situ_glu(z W1_e^T, z W3_e^T)`` with both halves of the
   fused ``w13`` (gate rows 0..F-1, up rows F..2F-1) accumulated side by side, so SiTU-GLU
   runs in the epilogue; h is rounded to z's dtype (§4.8) and stored in expert order.
2. ``moe_down_kernel``: ``h W2_e^T`` times the pair's routing weight, added (fp32 atomics)
   into ``u [T, Dl]``: the weighted combine over the k experts of a token.

MXFP4 weights are dequantized in the kernel, 32 inputs per E8M0 scale: a nibble's E2M1 value
times ``2^(scale - 127)`` is exact in BF16, so the BF16 tensor-core product sees exactly the
checkpoint's weights. ``use_dot_scaled=True`` hands the packed bytes and scales to
``tl.dot_scaled`` instead (native on GPUs with MX tensor cores; Hopper emulates it); it does
not run under the interpreter.

``fp8_down_activations=True`` (issue #6, opt-in): the gate_up epilogue stores h as MXFP8
(e4m3fn values + one E8M0 scale per 32 along F, ``atomk31/quant/mxfp8.py``'s rule, rounded
explicitly so every backend writes the same bytes) instead of z's dtype, and the down kernel
either hands both MX operands to ``tl.dot_scaled(.., "e4m3", .., "e2m1")`` (use_dot_scaled)
or dequantizes them (e4m3 x 2^k is exact in BF16; fp32 under the interpreter) for ``tl.dot``.
Only the grouped GEMMs have it: the launcher routes it past the small-batch GEMVs.

``words`` (session 5; the default for BF16 on NVIDIA at 128 pairs per block, ``default_words``):
the same two GEMMs with the GEMVs' word decode, weights as the product's first operand
(moe_grouped_words.py), with the weights' one_factor_exact: 4096 tokens 18.67 -> 13.64 ms.
"""

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from atomk31.triton_kernels.kv_write import round_to_e4m3
from atomk31.triton_kernels.runtime import runs_on_interpreter

from atomk31.triton_kernels.moe_gemv import moe_experts_mxfp4_gemv_triton
from atomk31.triton_kernels.moe_grouped_words import moe_experts_mxfp4_grouped_words
from atomk31.triton_kernels.moe_mxfp4_decode import e2m1_times_2_pow_minus_14, e8m0_factor
from atomk31.triton_kernels.moe_routing import ExpertBlocks, sort_pairs_by_expert

MXFP4_BLOCK = 32
# Up to this many tokens the weight-streaming GEMVs of moe_gemv.py run instead (decode).
# H200, 2026-11-29: at 64 tokens the GEMVs (1.53 ms) beat the grouped GEMMs (1.73 ms).
SMALL_BATCH_MAX_TOKENS = 64


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
def moe_gate_up_kernel(
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
def moe_down_kernel(
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


def pick_block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per program: about the expected number of pairs per expert (decode: 16), and 128
    past 32 (H200, 2026-11-29, 256 tokens x top-16 over 64 experts: 128 x 128 tiles 2.59 ms,
    64 x 64 tiles 2.98 ms)."""
    per_expert = num_pairs / max(num_experts, 1)
    for block_m in (16, 32):
        if per_expert <= block_m:
            return block_m
    return 128


def default_words(block_m: int, dtype: torch.dtype, backend: str | None,
                  use_dot_scaled: bool, fp8_down_activations: bool) -> bool:
    """The word-decode grouped GEMMs (moe_grouped_words.py) for BF16 activations on NVIDIA at
    128 pairs per block. H200, session 5, round 1, 4096 tokens: 13.64 ms (41% of the BF16
    rate) with 128 weight rows x 128 inputs on 8 warps against 18.67 ms for the byte decode.
    Smaller blocks (up to ~128 tokens at top-16 of 64) were not measured: byte decode."""
    return (block_m == 128 and dtype == torch.bfloat16 and backend == "cuda"
            and not use_dot_scaled and not fp8_down_activations)


def default_tiles(block_m: int, words: bool) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps): weight rows x inputs per program. Byte decode: 128 x 64
    at 128 pairs (H200, 2026-11-29: 28.4 ms vs 32.1 ms at 4096 tokens), else 64 x 128; 8
    warps past 32 pairs. Words: 128 x 128 on 8 warps (two warpgroups of 64 rows) at 128 pairs
    (session 5, 4096 tokens: 13.64 ms vs 15.92 for 64 rows on 4 warps, 2 stages), else
    64 x 128 on 4 (one warpgroup's 64 rows)."""
    if words:
        return (128, 128, 8) if block_m == 128 else (64, 128, 4)
    num_warps = 4 if block_m <= 32 else 8
    return (128, 64, num_warps) if block_m == 128 else (64, 128, num_warps)


def moe_experts_mxfp4_triton(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
    small_batch: bool | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    use_dot_scaled: bool = False,
    fp8_down_activations: bool = False,
    one_factor_exact: bool = False,
    words: bool | None = None,
    scales_ahead: bool = True,
) -> torch.Tensor:
    """z: [T, Dl]; topk_weights fp32 / topk_ids int32 [T, k]; w13 [E, 2F, Dl/2] + [E, 2F,
    Dl/32]; w2 [E, Dl, F/2] + [E, Dl, F/32] (uint8) -> u fp32 [T, Dl].

    small_batch: the GEMVs of moe_gemv.py (None: up to SMALL_BATCH_MAX_TOKENS tokens).
    block_* / num_warps / num_stages / use_dot_scaled are tuning knobs of the grouped GEMMs for
    benchmarks. fp8_down_activations: h in MXFP8 for the down GEMM (the contract's option;
    grouped GEMMs only, so it is routed past the GEMVs). one_factor_exact: the weights'
    promise (ops/moe.py) that lets BF16 word decodes multiply once per weight pair. words
    (None: default_words; no dot_scaled / fp8 down): the grouped GEMMs of
    moe_grouped_words.py, the weights decoded 8 nibbles per word into the product's first
    operand; scales_ahead: their K loops load each step's scale bytes a step early."""
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    _check(z, topk_weights, topk_ids, w13_packed, w13_scales, w2_packed, w2_scales,
           latent_size, intermediate_size)
    num_tokens, top_k = topk_ids.shape
    if small_batch is None:
        small_batch = (num_tokens <= SMALL_BATCH_MAX_TOKENS and not use_dot_scaled
                       and not fp8_down_activations)
    if small_batch and fp8_down_activations:
        raise ValueError("moe_experts_mxfp4: fp8_down_activations runs on the grouped GEMMs "
                         "only; pass small_batch=False or None")
    if small_batch:
        return moe_experts_mxfp4_gemv_triton(z, topk_weights, topk_ids, w13_packed, w13_scales,
                                             w2_packed, w2_scales, beta, linear_beta,
                                             one_factor_exact=one_factor_exact)
    if words and (use_dot_scaled or fp8_down_activations):
        raise ValueError("moe_experts_mxfp4: words (the word-decode grouped GEMMs) takes "
                         "neither use_dot_scaled nor fp8_down_activations")
    num_pairs = num_tokens * top_k
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if num_pairs == 0:
        return u
    if block_m is None:
        block_m = pick_block_m(num_pairs, num_experts)
    on_interpreter = runs_on_interpreter(moe_gate_up_kernel)
    if use_dot_scaled and on_interpreter:
        raise ValueError("moe_experts_mxfp4: use_dot_scaled does not run under the Triton "
                         "interpreter; leave it False on the CPU")
    # The backend picks the word decode; the byte-decode paths never ask (nor does a test
    # that pretends to be compiled for dot_scaled under the interpreter).
    backend = None
    if not (on_interpreter or words is False or use_dot_scaled or fp8_down_activations):
        backend = driver.active.get_current_target().backend
    if words is None:
        words = default_words(block_m, z.dtype, backend, use_dot_scaled, fp8_down_activations)
    default_n, default_k, default_warps = default_tiles(block_m, words)
    block_n = default_n if block_n is None else block_n
    block_k = default_k if block_k is None else block_k
    num_warps = default_warps if num_warps is None else num_warps
    blocks: ExpertBlocks = sort_pairs_by_expert(topk_ids, num_experts, block_m)
    if z.stride(1) != 1:
        z = z.contiguous()
    if words:
        return moe_experts_mxfp4_grouped_words(
            z, topk_weights, blocks, w13_packed, w13_scales, w2_packed, w2_scales, beta,
            linear_beta, u, block_m=block_m, block_n=block_n, block_k=block_k,
            num_warps=num_warps, num_stages=num_stages, backend=backend,
            on_interpreter=on_interpreter, one_factor_exact=one_factor_exact,
            scales_ahead=scales_ahead)
    num_rows = blocks.num_blocks_max * block_m
    hidden = torch.empty((num_rows, intermediate_size), device=z.device,
                         dtype=torch.float8_e4m3fn if fp8_down_activations else z.dtype)
    # E8M0 scales of h; without the option an unused placeholder pointer.
    hidden_scales = torch.empty((num_rows, intermediate_size // 32), dtype=torch.uint8,
                                device=z.device) if fp8_down_activations else hidden
    meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=top_k,
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                USE_DOT_SCALED=use_dot_scaled, FP8_DOWN=fp8_down_activations,
                # fp32 activations: exact fp32 products (no TF32), as on the interpreter.
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                num_warps=num_warps, num_stages=num_stages)
    moe_gate_up_kernel[(blocks.num_blocks_max, triton.cdiv(intermediate_size, block_n))](
        z, blocks.pair_ids, blocks.block_expert, w13_packed, w13_scales, hidden, hidden_scales,
        num_pairs, z.stride(0), beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_kernel[(blocks.num_blocks_max, triton.cdiv(latent_size, block_n))](
        hidden, hidden_scales, blocks.pair_ids, blocks.block_expert, w2_packed, w2_scales,
        topk_weights.float().contiguous(), u, num_pairs, **meta,
    )
    return u


def _check(z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
           w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
           w2_scales: torch.Tensor, latent_size: int, intermediate_size: int) -> None:
    """Shapes and dtypes only (expert ids are not range-checked: that would sync)."""
    num_experts = w13_packed.shape[0]
    expected = {
        "w13_packed": (num_experts, 2 * intermediate_size, latent_size // 2),
        "w13_scales": (num_experts, 2 * intermediate_size, latent_size // 32),
        "w2_packed": (num_experts, latent_size, intermediate_size // 2),
        "w2_scales": (num_experts, latent_size, intermediate_size // 32),
    }
    arrived = {"w13_packed": w13_packed, "w13_scales": w13_scales,
               "w2_packed": w2_packed, "w2_scales": w2_scales}
    for name, shape in expected.items():
        tensor = arrived[name]
        if tuple(tensor.shape) != shape or tensor.dtype != torch.uint8 or \
                not tensor.is_contiguous():
            raise ValueError(f"moe_experts_mxfp4: {name} must be contiguous uint8 {list(shape)} "
                             f"for E={num_experts}, F={intermediate_size}, Dl={latent_size}; "
                             f"got {tensor.dtype} {list(tensor.shape)}")
    if latent_size % 128 or intermediate_size % 128:
        raise ValueError(f"moe_experts_mxfp4 (triton): Dl and F must be multiples of 128 (the "
                         f"K tile), got Dl={latent_size}, F={intermediate_size}; use the torch "
                         "backend")
    if z.dim() != 2 or z.shape[1] != latent_size:
        raise ValueError(f"moe_experts_mxfp4: z must be [T, Dl] = [T, {latent_size}], "
                         f"got {tuple(z.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != z.shape[0] or \
            topk_weights.shape != topk_ids.shape:
        raise ValueError(f"moe_experts_mxfp4: topk_weights and topk_ids must both be [T, k] "
                         f"with T={z.shape[0]}, got {tuple(topk_weights.shape)} and "
                         f"{tuple(topk_ids.shape)}")
