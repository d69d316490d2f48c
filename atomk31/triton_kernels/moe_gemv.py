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
   epilogue, h rounded to z's dtype (§4.8) and stored per (expert, row).
2. ``moe_down_gemv_kernel``: ``h W2_e^T`` times the routing weight, added with fp32
   atomics into ``u [T, Dl]`` (the weighted combine over the k experts of a token).
(Both in moe_gemv_kernels.py.)

Token rows: row t of program e is token t when t routes to e, else masked, so BLOCK_M >= T
and the tensor cores multiply all T rows for every expert (4x the routed work at 64 tokens,
top-16 of 64). Gathered rows (``gather_rows``; the default for "dot_t_words" past 16 tokens):
row r is the r-th token routed to e, block_m rows at a time. Ways to multiply (``MODE``):
* "fma" (one token; the portable GEMV's): unscaled E2M1 values times the activations, summed
  per 32-input group, then times the group's E8M0 scale: per weight one decode and BLOCK_M FMAs.
* "dot_t" (the portable GEMV's from two tokens): weights dequantized to z's dtype (exact in
  BF16) as the dot's first operand and the tokens as its N side, so the dequantized weights can
  stay in registers (no shared-memory round trip of the B operand).
* "dot_t_words" (``moe_experts_mxfp4_gemv_words_triton``, NVIDIA with BF16 activations):
  "dot_t" with the weights read as int32 words and decoded two per 32-bit op
  (moe_mxfp4_decode.e2m1_word_pairs; inline PTX with BF16x2 multiplies on NVIDIA) straight
  into the tensor-core registers: each lane decodes whole words, so the K order inside a tile
  is the "word order" of moe_gemv_tiles.words_order. The launcher permutes z into it and the
  gate/up kernel stores h in it; ~2.6 ops per weight instead of ~10. BF16 activations take
  one multiply per weight pair instead of two when the weights promise it is exact
  (``one_factor_exact``: every E8M0 byte 0 or 59..192, ops/moe.py; ``pick_word_decode``).

E2M1 codes are decoded through FP16 bits (moe_mxfp4_decode.py): a few integer ops, no tables.
Each mode's per-tile product (decode and multiply one K tile) is in moe_gemv_tiles.py; this
file holds the launchers and their tile table (the measurements behind it: benchmarks/NOTES.md,
"MoE GEMVs").
"""

from dataclasses import dataclass

import torch
import triton

from triton.runtime import driver

from atomk31.triton_kernels.moe_gemv_kernels import (moe_down_gemv_kernel,
                                                     moe_gate_up_gemv_kernel)
from atomk31.triton_kernels.runtime import runs_on_interpreter

# The most tokens of the GEMVs (token rows: one program's rows hold them all; gathered rows:
# each program compares all T tokens' ids): past it, the grouped GEMMs.
MAX_TOKENS = 64
MODES = ("fma", "dot_t", "dot_t_words")


@dataclass(frozen=True)
class GemvConfig:
    """Tiles of the GEMVs; a None field takes the launcher's default for the call.

    mode: one of MODES. block_n / block_k: weight rows / inputs per program and K step
    (block_k a power of two >= 32 dividing Dl and F). num_warps, num_stages (software
    pipelining of the K loop). gather_rows: a program's rows are its expert's own tokens,
    block_m at a time, instead of all T tokens; block_m (gathered rows only) a power of two.
    max_registers (NVIDIA): ptxas's register cap per thread (maxnreg), for more programs per
    SM."""

    mode: str | None = None
    block_n: int | None = None
    block_k: int | None = None
    num_warps: int = 4
    num_stages: int | None = None
    gather_rows: bool | None = None
    block_m: int | None = None
    max_registers: int | None = None


def default_blocks(num_tokens: int, mode: str, latent_size: int, intermediate_size: int,
                   gather_rows: bool = False) -> tuple[int, int]:
    """(block_n, block_k): "dot_t_words" 64 rows x 256 inputs up to 16 tokens and with gathered
    rows, 128 x 128 for token rows at 17-64 tokens; "dot_t" 64 x 128; "fma" 32 x 128."""
    if mode == "dot_t_words":
        if (num_tokens <= 16 or gather_rows) and latent_size % 256 == 0 and \
                intermediate_size % 256 == 0:
            return 64, 256
        return 128, 128
    if mode == "dot_t":
        return 64, 128
    return 32, 128


def default_gather_rows(num_tokens: int, mode: str) -> bool:
    """Gathered rows for "dot_t_words" past 16 tokens (token rows would multiply all T rows
    for every expert); up to 16 tokens the two are the same (16 rows is the smallest
    tensor-core tile)."""
    return mode == "dot_t_words" and num_tokens > 16


def pick_word_decode(dtype: torch.dtype, backend: str | None, one_factor_exact: bool) -> str:
    """The weight decode of "dot_t_words" (moe_gemv_tiles._words_tile_weights): inline PTX
    with BF16x2 multiplies for BF16 activations on NVIDIA, plain Triton elsewhere (``backend``
    None: the interpreter); the one-multiply form ("*_one_factor") for BF16 activations when
    the weights promise it is exact (one_factor_exact, ops/moe.py), the two-multiply form
    otherwise. fp32 activations always take the exact fp32 decode "triton"."""
    if dtype != torch.bfloat16:
        return "triton"
    decode = "ptx" if backend == "cuda" else "triton"
    return decode + "_one_factor" if one_factor_exact else decode


def default_stages_and_registers(mode: str, gather_rows: bool, word_decode: str,
                                 num_stages: int | None,
                                 max_registers: int | None) -> tuple[int, int | None]:
    """(num_stages, max_registers) unless given: 2 stages and a 128-register cap (4 programs
    per SM instead of 2: 50 KB of shared memory, no spills) for gathered rows with the PTX word
    decode; else 3 stages, no cap."""
    gathered_ptx = mode == "dot_t_words" and gather_rows and word_decode.startswith("ptx")
    if num_stages is None:
        num_stages = 2 if gathered_ptx else 3
    if max_registers is None and gathered_ptx:
        max_registers = 128
    return num_stages, max_registers


def default_gather_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """Gathered rows per chunk: about twice the mean tokens per expert (T k / E), so that
    nearly every expert of a random routing fits one chunk (64 tokens, top-16 of 64: mean 16,
    1 in 10^5 experts past 32); 16 to 64."""
    mean = num_tokens * top_k / max(num_experts, 1)
    return min(max(16, triton.next_power_of_2(int(2 * mean + 0.999))), 64)


def to_words_order(z: torch.Tensor, block_k: int) -> torch.Tensor:
    """z [T, D] with each block of block_k inputs in word order (moe_gemv_tiles.words_order):
    input k = 8 (Q c + q) + 4 i2 + 2 i1 + i0 of a block to 32 q + 16 i1 + 8 i0 + 2 c + i2."""
    num_tokens, size = z.shape
    blocks = z.reshape(num_tokens, size // block_k, 4, block_k // 32, 2, 2, 2)
    return blocks.permute(0, 1, 3, 5, 6, 2, 4).reshape(num_tokens, size).contiguous()


def moe_experts_mxfp4_gemv_triton(
    z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
    one_factor_exact: bool = False, config: GemvConfig | None = None,
) -> torch.Tensor:
    """``moe_experts_mxfp4`` (contract and argument check: ops/moe.py) for T <= MAX_TOKENS, the
    portable GEMV: "fma" at one token, "dot_t" from two (``config`` may name any mode).
    -> u fp32 [T, Dl]."""
    config = config or GemvConfig()
    default = "fma" if topk_ids.shape[0] <= 1 else "dot_t"
    return _gemv(z, topk_weights, topk_ids, (w13_packed, w13_scales, w2_packed, w2_scales),
                 beta, linear_beta, one_factor_exact, config, config.mode or default)


def moe_experts_mxfp4_gemv_words_triton(
    z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scales: torch.Tensor, w2_packed: torch.Tensor,
    w2_scales: torch.Tensor, beta: float, linear_beta: float | None,
    one_factor_exact: bool = False, config: GemvConfig | None = None,
) -> torch.Tensor:
    """As ``moe_experts_mxfp4_gemv_triton`` in mode "dot_t_words" (the word decode), the GEMV
    of NVIDIA GPUs with BF16 activations."""
    config = config or GemvConfig()
    return _gemv(z, topk_weights, topk_ids, (w13_packed, w13_scales, w2_packed, w2_scales),
                 beta, linear_beta, one_factor_exact, config, config.mode or "dot_t_words")


def _gemv(z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
          weights: tuple[torch.Tensor, ...], beta: float, linear_beta: float | None,
          one_factor_exact: bool, config: GemvConfig, mode: str) -> torch.Tensor:
    w13_packed, w13_scales, w2_packed, w2_scales = weights
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    num_tokens, top_k = topk_ids.shape
    if num_tokens > MAX_TOKENS:
        raise ValueError(f"moe_experts_mxfp4 (gemv): at most {MAX_TOKENS} tokens, got "
                         f"{num_tokens}; use the grouped GEMMs")
    if mode not in MODES:
        raise ValueError(f"moe_experts_mxfp4 (gemv): mode must be one of {MODES}, got {mode!r}")
    on_interpreter = runs_on_interpreter(moe_gate_up_gemv_kernel)
    backend = None if on_interpreter else driver.active.get_current_target().backend
    gather_rows = default_gather_rows(num_tokens, mode) if config.gather_rows is None \
        else config.gather_rows
    if config.block_m is not None and not gather_rows:
        raise ValueError("moe_experts_mxfp4 (gemv): block_m is for gathered rows only "
                         f"(gather_rows=True), got block_m={config.block_m}")
    default_n, default_k = default_blocks(num_tokens, mode, latent_size, intermediate_size,
                                          gather_rows)
    block_n, block_k = config.block_n or default_n, config.block_k or default_k
    if latent_size % block_n or latent_size % block_k or intermediate_size % block_n or \
            intermediate_size % block_k:
        raise ValueError(f"moe_experts_mxfp4 (gemv): Dl={latent_size} and F={intermediate_size} "
                         f"must be multiples of block_n={block_n} and block_k={block_k}")
    u = torch.zeros((num_tokens, latent_size), dtype=torch.float32, device=z.device)
    if num_tokens == 0:
        return u
    block_m = config.block_m or (default_gather_block_m(num_tokens, top_k, num_experts)
                                 if gather_rows else triton.next_power_of_2(num_tokens))
    if mode != "fma":
        # The smallest tile that stays on wgmma with the weights in registers (triton 3.6
        # takes 8 tokens to mma.sync through shared memory, ~20% more instructions).
        block_m = max(block_m, 16)
    if block_m & (block_m - 1):
        raise ValueError(f"moe_experts_mxfp4 (gemv): block_m must be a power of two, got "
                         f"{block_m}")
    packed_inputs = 2
    if mode == "dot_t_words":
        # 8 nibbles per int32 word (rows are multiples of 128 inputs: whole words).
        w13_packed, w2_packed, packed_inputs = (w13_packed.view(torch.int32),
                                                w2_packed.view(torch.int32), 8)
        z = to_words_order(z, block_k)
    elif z.stride(1) != 1:
        z = z.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.float().contiguous()
    # Fewer (token, slot) pairs than experts: one program row per pair, none for unused experts.
    num_slots = num_tokens * top_k
    by_slot = num_slots < num_experts
    # Token rows: row t of expert e's block is token t (only the rows of tokens routed to e
    # are written). Gathered rows: the T * k pairs in expert order.
    hidden_rows = num_slots if gather_rows else num_experts * block_m
    hidden = torch.empty((hidden_rows, intermediate_size), dtype=z.dtype, device=z.device)
    word_decode = pick_word_decode(z.dtype, backend, one_factor_exact) \
        if mode == "dot_t_words" else "triton"
    num_stages, max_registers = default_stages_and_registers(
        mode, gather_rows, word_decode, config.num_stages, config.max_registers)
    # fp32 activations: exact fp32 products (no TF32) on the GPU as on the interpreter.
    meta = dict(F=intermediate_size, DL=latent_size, TOP_K=top_k, BLOCK_M=block_m,
                BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_TOP_K=triton.next_power_of_2(top_k),
                PACKED_INPUTS=packed_inputs, MODE=mode,
                DOT_FP32=on_interpreter or z.dtype == torch.float32,
                # Only programs per slot read the slots: 1 otherwise, so that batch sizes
                # share their compiles.
                BY_SLOT=by_slot, BLOCK_SLOTS=triton.next_power_of_2(num_slots) if by_slot else 1,
                num_warps=config.num_warps, num_stages=num_stages,
                WORD_DECODE=word_decode, GATHER=gather_rows,
                BLOCK_T=triton.next_power_of_2(num_tokens) if gather_rows else 1,
                CHUNKS=triton.cdiv(num_tokens, block_m) if gather_rows else 1)
    if max_registers is not None and backend == "cuda":
        meta["maxnreg"] = max_registers
    # Gathered rows: CHUNKS programs per expert (or slot), side by side.
    num_programs = (num_slots if by_slot else num_experts) * meta["CHUNKS"]
    moe_gate_up_gemv_kernel[(num_programs, intermediate_size // block_n)](
        z, ids, weights, w13_packed, w13_scales, hidden, num_tokens, z.stride(0),
        beta, 1.0 if linear_beta is None else linear_beta,
        HAS_LINEAR_CAP=linear_beta is not None, **meta,
    )
    moe_down_gemv_kernel[(num_programs, latent_size // block_n)](
        hidden, ids, weights, w2_packed, w2_scales, u, num_tokens, **meta,
    )
    return u
