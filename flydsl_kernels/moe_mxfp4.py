"""FlyDSL grouped MoE over MXFP4 experts with SiTU-GLU and an FP8 second stage (gfx950; §4.7, §4.8).

Computes the `moe_experts_mxfp4` op (atomk31/ops/moe.py): ``u[t] = sum_j w[t, j] *
W2_e(situ_glu(W1_e z_t, W3_e z_t))`` with MXFP4 weights (§3.3: e2m1 codes, low nibble = even
input index, one E8M0 scale per 32 inputs). Every matmul is one gfx950 scaled MFMA,
``v_mfma_scale_f32_16x16x128_f8f6f4``: the activations go through MX-FP8 (e4m3 values, one
E8M0 scale per 32 inputs, the OCP MX recipe) so both operands carry E8M0 block scales and the
hardware applies them; nothing is dequantized.

Grouping (torch, in the launcher): the (token, slot) pairs are sorted by expert and each
expert's run is padded to a multiple of 16 pairs (pad pairs point at token -1), so a tile of
16 pairs belongs to one expert (``tile_experts``).

* gate_up kernel, one wave per (tile, 32 intermediate columns): A = 16 pairs' e4m3 ``z`` rows,
  B = 32 gate rows and the matching 32 up rows of ``w13`` (e2m1), K = Dl in steps of 128.
  Epilogue: SiTU-GLU (§4.8) on the fp32 accumulators, then the FP8 second stage: the 32
  columns of one pair row are one MX block, so its amax is two in-lane maxima and four xor
  shuffles; values are stored as e4m3 bytes with their E8M0 scale.
* down kernel, one wave per (tile, 32 latent columns): A = the tile's e4m3 hidden rows,
  B = 32 rows of ``w2`` (e2m1), K = F in steps of 128; the result is multiplied by the pair's
  routing weight and written per pair; the launcher sums pairs into tokens (index_add_).

MFMA operand layout (16x16x128, one wave): lane l holds row ``l % 16`` of A (and column
``l % 16`` of B) at K = ``(l // 16) * 32 .. + 32`` of the step, i.e. exactly one MX block, so
its scale is one byte per lane; the result lane l holds rows ``4 * (l // 16) + i`` of column
``l % 16``.

Accuracy: z and the SiTU output go through e4m3 with per-32 power-of-two scales (relative
error ~2^-4 per element) where the torch op keeps fp32/bf16; see tests/flydsl_kernels/
test_moe_mxfp4.py for the stated tolerance. Requires Dl and F to be multiples of 128 (K3.1:
3584 and 3072); the amd backend sends other shapes to the portable implementation.
"""

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import rocdl as rocdl_ops
from flydsl.expr import rocdl
from flydsl.expr.typing import Vector as Vec

TILE_PAIRS = 16  # the MFMA's M: (token, slot) pairs per tile, all routed to one expert
TILE_COLUMNS = 32  # output columns per wave: two MFMA N-tiles, one MX block of the hidden row
K_STEP = 128  # K of v_mfma_scale_f32_16x16x128_f8f6f4
MX_BLOCK = 32  # inputs per E8M0 scale (§3.3)
WAVE = 64
FORMAT_E4M3 = 0  # cbsz/blgp operand format codes of the scaled MFMA
FORMAT_E2M1 = 4
E4M3_MAX = 448.0
E4M3_EMAX = 8  # 448 = 1.75 * 2^8: the OCP MX shared exponent is floor(log2(amax)) - 8
LOG2E = 1.4426950408889634


def _scaled_mfma(acc: Vec, a_words: list, a_scale: fx.Int32, b_words: list,
                 b_scale: fx.Int32) -> Vec:
    """acc += (A e4m3, 32 bytes/lane) x (B e2m1, 16 bytes/lane), both with E8M0 block scales."""
    a = Vec.from_elements(a_words, dtype=fx.Int64).bitcast(fx.Int32)
    b = Vec.from_elements(b_words, dtype=fx.Int64).bitcast(fx.Int32)
    return Vec(rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        Vec.make_type(4, fx.Float32),
        [a.ir_value(), b.ir_value(), acc.ir_value(), FORMAT_E4M3, FORMAT_E2M1,
         0, a_scale.ir_value(), 0, b_scale.ir_value()]), (4,), fx.Float32)


def _tanh(x: fx.Float32) -> fx.Float32:
    """tanh via exp2 (no libm call): 1 - 2 / (e^{2x} + 1), saturating cleanly at +-1."""
    return fx.Float32(1.0) - fx.Float32(2.0) / ((x * fx.Float32(2.0 * LOG2E)).exp2()
                                                 + fx.Float32(1.0))


def _situ_glu(gate: fx.Float32, up: fx.Float32, beta: fx.Float32,
              linear_beta: fx.Float32) -> fx.Float32:
    """§4.8: beta*tanh(a/beta)*sigmoid(a) * (linear_beta*tanh(b/linear_beta), or b if 0)."""
    sigmoid = fx.Float32(1.0) / (fx.Float32(1.0) + (gate * fx.Float32(-LOG2E)).exp2())
    gate_act = beta * _tanh(gate / beta) * sigmoid
    safe_linear = (linear_beta > fx.Float32(0.0)).select(linear_beta, fx.Float32(1.0))
    up_act = (linear_beta > fx.Float32(0.0)).select(safe_linear * _tanh(up / safe_linear), up)
    return gate_act * up_act


@flyc.kernel
def gate_up_situ_kernel(
    z_words: fx.Tensor,  # [T, Dl/8] int64: e4m3 z, 8 per word
    z_scales: fx.Tensor,  # [T, Dl/32] uint8 E8M0
    pair_tokens: fx.Tensor,  # [P] int32: token of each sorted pair, -1 = padding
    tile_experts: fx.Tensor,  # [P/16] int32
    w13_words: fx.Tensor,  # [E, 2F, Dl/16] int64: e2m1 codes, 16 per word
    w13_scales: fx.Tensor,  # [E, 2F, Dl/32] uint8 E8M0
    h_bytes: fx.Tensor,  # [P, F] uint8 out: e4m3 SiTU-GLU output
    h_scales: fx.Tensor,  # [P, F/32] uint8 out: its E8M0 scales
    latent_size: fx.Int32,
    intermediate_size: fx.Int32,
    beta: fx.Float32,
    linear_beta: fx.Float32,  # 0 = no clamp on the up branch
):
    lane = fx.thread_idx.x
    tile = fx.block_idx.x
    column_group = fx.block_idx.y
    n16 = lane % fx.Int32(16)
    kg = lane // fx.Int32(16)
    p_z = fx.get_iter(z_words)
    p_zs = fx.get_iter(z_scales)
    p_tok = fx.get_iter(pair_tokens)
    p_exp = fx.get_iter(tile_experts)
    p_w = fx.get_iter(w13_words)
    p_ws = fx.get_iter(w13_scales)
    p_h = fx.get_iter(h_bytes)
    p_hs = fx.get_iter(h_scales)
    expert = fx.ptr_load(p_exp + tile)
    token = fx.ptr_load(p_tok + (tile * fx.Int32(TILE_PAIRS) + n16))
    token = (token >= fx.Int32(0)).select(token, fx.Int32(0))  # padding rows are never read
    z_row_words = token * (latent_size // fx.Int32(8))
    z_row_blocks = token * (latent_size // fx.Int32(MX_BLOCK))
    first_column = column_group * fx.Int32(TILE_COLUMNS)
    # This lane's B rows: gate rows f and up rows F + f for the two 16-column N-tiles.
    w_rows = []
    for half in fx.range_constexpr(2):
        column = first_column + fx.Int32(half * 16) + n16
        for part in fx.range_constexpr(2):
            w_rows.append(expert * (fx.Int32(2) * intermediate_size)
                          + fx.Int32(part) * intermediate_size + column)
    acc = [Vec.filled(4, 0.0, fx.Float32) for _ in range(4)]  # [gate0, up0, gate1, up1]

    for k0 in range(0, latent_size, K_STEP):
        block = k0 // fx.Int32(MX_BLOCK) + kg  # this lane's MX block along Dl
        a_words = [fx.ptr_load(p_z + (z_row_words + block * fx.Int32(4) + fx.Int32(j)))
                   for j in range(4)]
        a_scale = fx.ptr_load(p_zs + (z_row_blocks + block)).to(fx.Int32)
        for t in fx.range_constexpr(4):
            w_words = w_rows[t] * (latent_size // fx.Int32(16)) + block * fx.Int32(2)
            b_words = [fx.ptr_load(p_w + (w_words + fx.Int32(j))) for j in range(2)]
            b_scale = fx.ptr_load(
                p_ws + (w_rows[t] * (latent_size // fx.Int32(MX_BLOCK)) + block)).to(fx.Int32)
            acc[t] = _scaled_mfma(acc[t], a_words, a_scale, b_words, b_scale)

    # ---- epilogue: SiTU-GLU, then e4m3 + one E8M0 scale per (pair row, 32 columns) ----
    for i in fx.range_constexpr(4):
        pair = tile * fx.Int32(TILE_PAIRS) + kg * fx.Int32(4) + fx.Int32(i)
        hidden = [_situ_glu(acc[2 * half][i], acc[2 * half + 1][i], beta, linear_beta)
                  for half in range(2)]
        amax = hidden[0].abs().maximumf(hidden[1].abs())
        for offset in (1, 2, 4, 8):  # the other 15 columns of each half sit in lanes n16 ^ offset
            amax = amax.maximumf(fx.gpu.shuffle_xor(amax, offset, WAVE))
        exponent = (amax.bitcast(fx.Int32) >> fx.Int32(23)) & fx.Int32(0xFF)
        scale_byte = (exponent - fx.Int32(E4M3_EMAX)).maximumf(fx.Int32(1)) \
            if hasattr(fx.Int32, "maximumf") else None
        shifted = exponent - fx.Int32(E4M3_EMAX)
        scale_byte = (shifted < fx.Int32(1)).select(fx.Int32(1), shifted)
        inverse = ((fx.Int32(254) - scale_byte) << fx.Int32(23)).bitcast(fx.Float32)
        for half in fx.range_constexpr(2):
            value = (hidden[half] * inverse).maximumf(fx.Float32(-E4M3_MAX)).minimumf(
                fx.Float32(E4M3_MAX))
            packed = fx.Int32(rocdl_ops.cvt_pk_fp8_f32(
                fx.T.i32, value.ir_value(), value.ir_value(), fx.Int32(0).ir_value(), False))
            column = first_column + fx.Int32(half * 16) + n16
            fx.ptr_store((packed & fx.Int32(0xFF)).to(fx.Uint8),
                         p_h + (pair * intermediate_size + column))
        if n16 == fx.Int32(0):
            fx.ptr_store(scale_byte.to(fx.Uint8),
                         p_hs + (pair * (intermediate_size // fx.Int32(MX_BLOCK)) + column_group))


@flyc.kernel
def down_kernel(
    h_words: fx.Tensor,  # [P, F/8] int64: e4m3 hidden rows, 8 per word
    h_scales: fx.Tensor,  # [P, F/32] uint8 E8M0
    pair_weights: fx.Tensor,  # [P] fp32: routing weight of each pair, 0 = padding
    tile_experts: fx.Tensor,  # [P/16] int32
    w2_words: fx.Tensor,  # [E, Dl, F/16] int64: e2m1 codes, 16 per word
    w2_scales: fx.Tensor,  # [E, Dl, F/32] uint8 E8M0
    y: fx.Tensor,  # [P, Dl] fp32 out: weight * W2_e(hidden) per pair
    latent_size: fx.Int32,
    intermediate_size: fx.Int32,
):
    lane = fx.thread_idx.x
    tile = fx.block_idx.x
    column_group = fx.block_idx.y
    n16 = lane % fx.Int32(16)
    kg = lane // fx.Int32(16)
    p_h = fx.get_iter(h_words)
    p_hs = fx.get_iter(h_scales)
    p_pw = fx.get_iter(pair_weights)
    p_exp = fx.get_iter(tile_experts)
    p_w = fx.get_iter(w2_words)
    p_ws = fx.get_iter(w2_scales)
    p_y = fx.get_iter(y)
    expert = fx.ptr_load(p_exp + tile)
    a_row = tile * fx.Int32(TILE_PAIRS) + n16
    first_column = column_group * fx.Int32(TILE_COLUMNS)
    w_rows = [expert * latent_size + first_column + fx.Int32(half * 16) + n16
              for half in range(2)]
    acc = [Vec.filled(4, 0.0, fx.Float32) for _ in range(2)]

    for k0 in range(0, intermediate_size, K_STEP):
        block = k0 // fx.Int32(MX_BLOCK) + kg
        a_words = [fx.ptr_load(p_h + (a_row * (intermediate_size // fx.Int32(8))
                                      + block * fx.Int32(4) + fx.Int32(j))) for j in range(4)]
        a_scale = fx.ptr_load(
            p_hs + (a_row * (intermediate_size // fx.Int32(MX_BLOCK)) + block)).to(fx.Int32)
        for half in fx.range_constexpr(2):
            w_words = w_rows[half] * (intermediate_size // fx.Int32(16)) + block * fx.Int32(2)
            b_words = [fx.ptr_load(p_w + (w_words + fx.Int32(j))) for j in range(2)]
            b_scale = fx.ptr_load(p_ws + (w_rows[half] * (intermediate_size // fx.Int32(MX_BLOCK))
                                          + block)).to(fx.Int32)
            acc[half] = _scaled_mfma(acc[half], a_words, a_scale, b_words, b_scale)

    for i in fx.range_constexpr(4):
        pair = tile * fx.Int32(TILE_PAIRS) + kg * fx.Int32(4) + fx.Int32(i)
        weight = fx.ptr_load(p_pw + pair)
        for half in fx.range_constexpr(2):
            column = first_column + fx.Int32(half * 16) + n16
            fx.ptr_store(acc[half][i] * weight, p_y + (pair * latent_size + column))
