"""Routed experts from MXFP4 weights at small batch (decode): weight-streaming GEMVs (MODEL_SPEC
§4.7, §3.3, §4.8).

Contract: ``moe_experts_mxfp4`` of ``atomk31/ops/moe.py``, for T <= ``MAX_TOKENS``. At a few
tokens the two grouped GEMMs are bound by reading each used expert's weights once, so the grid
is (expert, N tile): every program streams BLOCK_N rows of one expert's weights and finds its
expert's tokens itself from ``topk_ids`` (T * k ids, a few hundred bytes, cached). No sort of the
(token, slot) pairs, no host sync: programs of unused experts exit after reading the ids. When
T * k < E (one token: 16 slots, 64 experts) the grid's first axis is the (token, slot) pairs
instead (``BY_SLOT``): a program takes its slot's expert unless an earlier slot has it, so at
one token no program is launched for an unused expert.

1. ``moe_gate_up_gemv_kernel``: gate and up rows of ``w13`` side by side, SiTU-GLU in the
   epilogue, h rounded to z's dtype (§4.8) and stored at ``h[e, t]``.
2. ``moe_down_gemv_kernel``: ``h[e, t] W2_e^T`` times the routing weight, added with fp32
   atomics into ``u [T, Dl]`` (the weighted combine over the k experts of a token).

Token rows are indexed by token (row t of program e is token t when t routes to e, else
masked), so BLOCK_M >= T. Ways to multiply (``MODE``), chosen by the launcher:
* "fma" (few tokens): unscaled E2M1 values times the activations, summed per 32-input group,
  then times the group's E8M0 scale: per weight one decode and BLOCK_M FMAs.
* "fma_f32": the same with E2M1 decoded straight to fp32 bits (E2M1 * 2^-126, activations
  times 2^64 so the products stay normal): no FP16 conversion.
* "fma_words": the fp32 decode reading the weights as int32 words of 8 nibbles.
* "dot" (BLOCK_M >= 16, padded tokens): weights dequantized to z's dtype (exact in BF16).
* "dot_t": the same product transposed, W [BLOCK_N, K] as the dot's first operand and the
  tokens as its N side, so the dequantized weights can stay in registers (no shared-memory
  round trip of the B operand).
* "dot_t_words": "dot_t" with the weights read as int32 words and decoded two per 32-bit
  op (moe_mxfp4_decode.e2m1_word_pairs; inline PTX with BF16x2 multiplies on NVIDIA) straight
  into the tensor-core registers: each lane decodes whole words, so the K order inside a tile
  is the "word order" of moe_gemv_tiles.words_order. The launcher permutes z into it and the
  gate/up kernel stores h in it; ~2.6 ops per weight instead of ~10.
* "dot_scaled": tl.dot_scaled on the packed bytes (BF16 activations, GPU only).

E2M1 codes are decoded through FP16 bits (moe_mxfp4_decode.py) or, in "fma_f32" / "fma_words",
straight to fp32 bits: a few integer ops, no tables. Each mode's per-tile product (decode and
multiply one K tile) is in moe_gemv_tiles.py; this file holds the kernels and the launcher.
"""

import torch
import triton
import triton.language as tl

from triton.runtime import driver

from atomk31.triton_kernels.moe_gemv_tiles import (load_activations, tile_accumulator,
                                                   tile_product, words_order)
from atomk31.triton_kernels.moe_mxfp4_decode import ONE_FACTOR_SHIFT
from atomk31.triton_kernels.runtime import runs_on_interpreter

# The most tokens one program's rows hold (row t is token t): past it, the grouped GEMMs.
MAX_TOKENS = 64
ONE_FACTOR_UNDO = tl.constexpr(2.0 ** ONE_FACTOR_SHIFT.value)
MODES = ("fma", "fma_f32", "fma_words", "dot", "dot_t", "dot_t_words", "dot_scaled")


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
def moe_gate_up_gemv_kernel(
    # pointers: z [T, Dl], topk ids/weights [T, k], w13 packed/scales [E, 2F, *], h [E, BM, F]
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
    LOOP_STAGES: tl.constexpr, WORD_DECODE: tl.constexpr,
):
    i_e, owner = _program_expert(ids_ptr, tl.program_id(0), BY_SLOT, BLOCK_SLOTS)
    i_n = tl.program_id(1)
    m_m, _ = _expert_tokens(ids_ptr, weights_ptr, i_e, num_tokens, TOP_K, BLOCK_M, BLOCK_TOP_K)
    if (tl.max(m_m.to(tl.int32), axis=0) == 0) | (owner == 0):
        return
    o_m = tl.arange(0, BLOCK_M)
    p_rows = z_ptr + o_m.to(tl.int64) * stride_z
    STRIDE_PACKED: tl.constexpr = DL // PACKED_INPUTS
    STRIDE_SCALES: tl.constexpr = DL // 32
    row0 = i_e.to(tl.int64) * 2 * F + i_n * BLOCK_N
    p_gate_packed = packed_ptr + row0 * STRIDE_PACKED
    p_gate_scales = scales_ptr + row0 * STRIDE_SCALES
    p_up_packed = p_gate_packed + F * STRIDE_PACKED
    p_up_scales = p_gate_scales + F * STRIDE_SCALES
    b_gate = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    b_up = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    if LOOP_STAGES > 0:
        # Explicit stages: Triton then pipelines the weight loads even without a tl.dot.
        for k0 in tl.range(0, DL, BLOCK_K, num_stages=LOOP_STAGES):
            b_gate, b_up = _gate_up_step(b_gate, b_up, p_rows, m_m, p_gate_packed,
                                         p_gate_scales, p_up_packed, p_up_scales, k0,
                                         STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N,
                                         BLOCK_K, MODE, DOT_FP32, WORD_DECODE)
    else:
        for k0 in range(0, DL, BLOCK_K):
            b_gate, b_up = _gate_up_step(b_gate, b_up, p_rows, m_m, p_gate_packed,
                                         p_gate_scales, p_up_packed, p_up_scales, k0,
                                         STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N,
                                         BLOCK_K, MODE, DOT_FP32, WORD_DECODE)
    if MODE == "dot_t" or MODE == "dot_t_words":
        b_gate = tl.trans(b_gate)
        b_up = tl.trans(b_up)
    if WORD_DECODE == "ptx_one_factor":                   # the weights came times 2^-64
        b_gate = b_gate * ONE_FACTOR_UNDO
        b_up = b_up * ONE_FACTOR_UNDO
    # SiTU-GLU (§4.8): SiLU with the gate soft-capped at ±beta, up capped at ±linear_beta.
    b_h = beta * _tanh(b_gate / beta) * tl.sigmoid(b_gate)
    if HAS_LINEAR_CAP:
        b_up = linear_beta * _tanh(b_up / linear_beta)
    b_h = b_h * b_up
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if MODE == "dot_t_words":
        o_n = words_order(o_n, BLOCK_K)       # h is the down GEMV's input: in its word order
    p_h = h_ptr + (i_e.to(tl.int64) * BLOCK_M + o_m[:, None]) * F + o_n[None, :]
    tl.store(p_h, b_h.to(h_ptr.dtype.element_ty), mask=m_m[:, None])


@triton.jit
def moe_down_gemv_kernel(
    # pointers: h [E, BM, F], topk ids/weights [T, k], w2 packed/scales [E, Dl, *], u [T, Dl]
    h_ptr, ids_ptr, weights_ptr, packed_ptr, scales_ptr, u_ptr,
    # sizes
    num_tokens,
    # meta-parameters
    F: tl.constexpr, DL: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_TOP_K: tl.constexpr, PACKED_INPUTS: tl.constexpr, MODE: tl.constexpr,
    DOT_FP32: tl.constexpr, BY_SLOT: tl.constexpr, BLOCK_SLOTS: tl.constexpr,
    LOOP_STAGES: tl.constexpr, WORD_DECODE: tl.constexpr,
):
    i_e, owner = _program_expert(ids_ptr, tl.program_id(0), BY_SLOT, BLOCK_SLOTS)
    i_n = tl.program_id(1)
    m_m, b_weight = _expert_tokens(ids_ptr, weights_ptr, i_e, num_tokens, TOP_K, BLOCK_M,
                                   BLOCK_TOP_K)
    if (tl.max(m_m.to(tl.int32), axis=0) == 0) | (owner == 0):
        return
    o_m = tl.arange(0, BLOCK_M)
    p_rows = h_ptr + (i_e.to(tl.int64) * BLOCK_M + o_m) * F
    STRIDE_PACKED: tl.constexpr = F // PACKED_INPUTS
    STRIDE_SCALES: tl.constexpr = F // 32
    row0 = i_e.to(tl.int64) * DL + i_n * BLOCK_N
    p_packed = packed_ptr + row0 * STRIDE_PACKED
    p_scales = scales_ptr + row0 * STRIDE_SCALES
    b_acc = tile_accumulator(BLOCK_M, BLOCK_N, MODE)
    if LOOP_STAGES > 0:
        for k0 in tl.range(0, F, BLOCK_K, num_stages=LOOP_STAGES):
            b_even, b_odd, b_a = load_activations(p_rows, m_m, k0, BLOCK_K, MODE)
            b_acc = tile_product(b_even, b_odd, b_a, p_packed, p_scales, k0,
                                  b_acc, STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N,
                                  BLOCK_K, MODE, DOT_FP32, WORD_DECODE)
    else:
        for k0 in range(0, F, BLOCK_K):
            b_even, b_odd, b_a = load_activations(p_rows, m_m, k0, BLOCK_K, MODE)
            b_acc = tile_product(b_even, b_odd, b_a, p_packed, p_scales, k0,
                                  b_acc, STRIDE_PACKED, STRIDE_SCALES, BLOCK_M, BLOCK_N,
                                  BLOCK_K, MODE, DOT_FP32, WORD_DECODE)
    if MODE == "dot_t" or MODE == "dot_t_words":
        b_acc = tl.trans(b_acc)
    if WORD_DECODE == "ptx_one_factor":
        b_acc = b_acc * ONE_FACTOR_UNDO
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.atomic_add(u_ptr + o_m.to(tl.int64)[:, None] * DL + o_n[None, :],
                  b_acc * b_weight[:, None], mask=m_m[:, None], sem="relaxed")


def default_mode(num_tokens: int, dtype: torch.dtype, backend: str | None) -> str:
    """H200, 2026-11-29, round 3 (CUDA-graph replays): BF16 activations on NVIDIA take
    "dot_t_words": 1 / 4 / 16 / 64 tokens 0.119 / 0.310 / 0.428 / 0.714 ms against round 2's
    "fma" / "dot_t" 0.214 / 0.627 / 0.871 / 1.287 ms (56% / 62% / 62% / 37% of copy
    bandwidth). Elsewhere (fp32 activations, AMD, the interpreter) round 2's choice: FMA at one
    token (0.221 ms vs 0.264 ms for "dot"), "dot_t" from two. "fma_f32" is exact only for E8M0
    scales below 2^65 and activations below 2^64, which the launcher cannot check."""
    if dtype == torch.bfloat16 and backend == "cuda":
        return "dot_t_words"
    return "fma" if num_tokens <= 1 else "dot_t"


def default_blocks(num_tokens: int, mode: str, latent_size: int,
                   intermediate_size: int) -> tuple[int, int]:
    """(block_n, block_k). H200, 2026-11-29, round 3, "dot_t_words": 64 rows x 256 inputs up
    to 16 tokens (16 tokens 0.428 ms vs 0.473 for 128 x 128, 0.485 for 64 x 128), 128 x 128
    at 64 tokens (0.714 ms vs 0.848 for 64 x 256). Round 2: "dot" at 16 tokens 0.889 ms with
    64 rows vs 0.927 ms with 32; "dot_t" with 64 rows at 4-64 tokens."""
    if mode == "dot_t_words":
        if num_tokens <= 16 and latent_size % 256 == 0 and intermediate_size % 256 == 0:
            return 64, 256
        return 128, 128
    if mode == "dot_t":
        return 64, 128
    return (64 if mode.startswith("dot") and num_tokens > 4 else 32), 128


def to_words_order(z: torch.Tensor, block_k: int) -> torch.Tensor:
    """z [T, D] with each block of block_k inputs in word order (moe_gemv_tiles.words_order):
    input k = 8 (Q c + q) + 4 i2 + 2 i1 + i0 of a block to 32 q + 16 i1 + 8 i0 + 2 c + i2."""
    num_tokens, size = z.shape
    blocks = z.reshape(num_tokens, size // block_k, 4, block_k // 32, 2, 2, 2)
    return blocks.permute(0, 1, 3, 5, 6, 2, 4).reshape(num_tokens, size).contiguous()


def moe_experts_mxfp4_gemv_triton(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
    mode: str | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    loop_stages: int = 0,
    one_factor: bool = False,
) -> torch.Tensor:
    """Small-batch path; arguments as ``moe_experts_mxfp4_triton`` (shapes checked there).

    mode: one of MODES (None: default_mode); "dot_scaled" needs BF16 activations on a GPU.
    block_n / block_k (None: default_blocks) / num_warps / num_stages are tuning knobs for
    benchmarks (block_k a power of two >= 32 dividing Dl and F); loop_stages > 0 pipelines the
    K loop's loads explicitly (tl.range num_stages), 0 leaves it to Triton. one_factor (mode
    "dot_t_words", NVIDIA, BF16; a benchmark knob): one BF16 multiply per weight pair instead
    of two, exact only for E8M0 scale bytes 59..192 (moe_mxfp4_decode.ONE_FACTOR_SHIFT)."""
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_tokens, top_k = topk_ids.shape
    if num_tokens > MAX_TOKENS:
        raise ValueError(f"moe_experts_mxfp4 (gemv): at most {MAX_TOKENS} tokens, got "
                         f"{num_tokens}; use the grouped GEMMs")
    on_interpreter = runs_on_interpreter(moe_gate_up_gemv_kernel)
    backend = None if on_interpreter else driver.active.get_current_target().backend
    if mode is None:
        mode = default_mode(num_tokens, z.dtype, backend)
    if mode not in MODES:
        raise ValueError(f"moe_experts_mxfp4 (gemv): mode must be one of {MODES}, got {mode!r}")
    default_n, default_k = default_blocks(num_tokens, mode, latent_size, intermediate_size)
    block_n = default_n if block_n is None else block_n
    block_k = default_k if block_k is None else block_k
    if latent_size % block_n or latent_size % block_k or intermediate_size % block_n or \
            intermediate_size % block_k:
        raise ValueError(f"moe_experts_mxfp4 (gemv): Dl={latent_size} and F={intermediate_size} "
                         f"must be multiples of block_n={block_n} and block_k={block_k}")
    if mode == "dot_scaled" and (on_interpreter or z.dtype != torch.bfloat16):
        raise ValueError("moe_experts_mxfp4 (gemv): mode 'dot_scaled' needs BF16 activations on "
                         f"a GPU, got {z.dtype}{' on the interpreter' if on_interpreter else ''}")
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if num_tokens == 0:
        return u
    block_m = triton.next_power_of_2(num_tokens)
    if mode.startswith("dot"):
        block_m = max(block_m, 16)                        # the smallest tensor-core M
    packed_inputs = 2
    if mode in ("fma_words", "dot_t_words"):
        # 8 nibbles per int32 word (rows are multiples of 128 inputs: whole words).
        w13_packed, w2_packed, packed_inputs = (w13_packed.view(torch.int32),
                                                w2_packed.view(torch.int32), 8)
    if mode == "dot_t_words":
        z = to_words_order(z, block_k)
    elif z.stride(1) != 1:
        z = z.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.float().contiguous()
    # Fewer (token, slot) pairs than experts: one program row per pair, none for unused experts.
    num_slots = num_tokens * top_k
    by_slot = num_slots < num_experts
    # Row t of expert e's block is token t; only the rows of tokens routed to e are written.
    hidden = torch.empty((num_experts, block_m, intermediate_size), dtype=z.dtype,
                         device=z.device)
    # "dot_t_words": the word decode in inline PTX on NVIDIA for BF16 products; plain Triton
    # on other backends, under the interpreter and for fp32 (exact fp32 decode).
    word_decode = "triton"
    if mode == "dot_t_words" and z.dtype == torch.bfloat16 and backend == "cuda":
        word_decode = "ptx_one_factor" if one_factor else "ptx"
    # fp32 activations: exact fp32 products (no TF32) on the GPU as on the interpreter.
    meta = dict(F=intermediate_size, DL=latent_size, TOP_K=top_k, BLOCK_M=block_m,
                BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_TOP_K=triton.next_power_of_2(top_k),
                PACKED_INPUTS=packed_inputs, MODE=mode,
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                BY_SLOT=by_slot, BLOCK_SLOTS=triton.next_power_of_2(num_slots),
                LOOP_STAGES=loop_stages, num_warps=num_warps, num_stages=num_stages,
                WORD_DECODE=word_decode)
    num_programs = num_slots if by_slot else num_experts
    moe_gate_up_gemv_kernel[(num_programs, intermediate_size // block_n)](
        z, ids, weights, w13_packed, w13_scales, hidden, num_tokens, z.stride(0),
        beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_gemv_kernel[(num_programs, latent_size // block_n)](
        hidden, ids, weights, w2_packed, w2_scales, u, num_tokens, **meta,
    )
    return u
