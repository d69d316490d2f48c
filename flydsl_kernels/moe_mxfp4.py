"""FlyDSL grouped MoE over MXFP4 experts, SiTU-GLU and an FP8 second stage (gfx950; §4.7-§4.8).

Computes the `moe_experts_mxfp4` op (atomk31/ops/moe.py): ``u[t] = sum_j w[t, j] *
W2_e(situ_glu(W1_e z_t, W3_e z_t))`` with MXFP4 weights (§3.3: e2m1 codes, low nibble = even
input index, one E8M0 scale per 32 inputs). Every matmul is one gfx950 scaled MFMA,
``v_mfma_scale_f32_16x16x128_f8f6f4``: the activations go through MX-FP8 (e4m3 values, one
E8M0 scale per 32 inputs, the OCP MX layout) so both operands carry E8M0 block scales and the
hardware applies them; nothing is dequantized.

Grouping (torch, in the launcher): the (token, slot) pairs are sorted by expert and each
expert's run is padded to a multiple of 16 pairs (pad pairs point at token -1), so a tile of
16 pairs belongs to one expert (``tile_experts``). The grid is sized on the host by the worst
case (``max_tiles``: every used expert wastes up to 15 rows), never read back from the device,
so a CUDA (HIP) graph can capture the launch; tiles past the last used one are padding (token
-1, weight 0) and write nothing the sum reads.

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
3584 and 3072; ValueError otherwise).
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
E4M3_EMAX = 8  # 448 = 1.75 * 2^8
E4M3_MANTISSA_LIMIT = 0x600000  # fp32 mantissa bits of 1.75
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
        amax = abs(hidden[0]).maximumf(abs(hidden[1]))
        for offset in (1, 2, 4, 8):  # the other 15 columns of each half sit in lanes n16 ^ offset
            amax = amax.maximumf(fx.gpu.shuffle_xor(amax, offset, WAVE))
        bits = amax.bitcast(fx.Int32)
        exponent = (bits >> fx.Int32(23)) & fx.Int32(0xFF)
        # One more when amax's mantissa exceeds 1.75, so amax / scale <= 448 (no saturation).
        round_up = ((bits & fx.Int32(0x7FFFFF)) > fx.Int32(E4M3_MANTISSA_LIMIT)).select(
            fx.Int32(1), fx.Int32(0))
        shifted = exponent - fx.Int32(E4M3_EMAX) + round_up
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


@flyc.jit
def launch_gate_up_situ(
    z_words: fx.Tensor, z_scales: fx.Tensor, pair_tokens: fx.Tensor, tile_experts: fx.Tensor,
    w13_words: fx.Tensor, w13_scales: fx.Tensor, h_bytes: fx.Tensor, h_scales: fx.Tensor,
    num_tiles: fx.Int32, num_column_groups: fx.Int32, latent_size: fx.Int32,
    intermediate_size: fx.Int32, beta: fx.Float32, linear_beta: fx.Float32,
    stream: fx.Stream = fx.Stream(None),
):
    gate_up_situ_kernel(z_words, z_scales, pair_tokens, tile_experts, w13_words, w13_scales,
                        h_bytes, h_scales, latent_size, intermediate_size, beta,
                        linear_beta).launch(
        grid=(num_tiles, num_column_groups, 1), block=(WAVE, 1, 1), stream=stream)


@flyc.jit
def launch_down(
    h_words: fx.Tensor, h_scales: fx.Tensor, pair_weights: fx.Tensor, tile_experts: fx.Tensor,
    w2_words: fx.Tensor, w2_scales: fx.Tensor, y: fx.Tensor, num_tiles: fx.Int32,
    num_column_groups: fx.Int32, latent_size: fx.Int32, intermediate_size: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    down_kernel(h_words, h_scales, pair_weights, tile_experts, w2_words, w2_scales, y,
                latent_size, intermediate_size).launch(
        grid=(num_tiles, num_column_groups, 1), block=(WAVE, 1, 1), stream=stream)


def quantize_mx_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [N, K] -> (e4m3fn values [N, K], E8M0 scales uint8 [N, K/32]) (MX-FP8).

    Per block of 32: shared exponent floor(log2(amax)) - 8, plus one when amax's mantissa
    exceeds 1.75 so that nothing saturates (the OCP recipe would clip up to 1/8 of amax), E8M0
    byte clamped to >= 1; exactly what the kernel's second stage does. Values x / 2^exponent.
    """
    blocks = x.float().reshape(x.shape[0], -1, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    bits = amax.view(torch.int32)
    exponent = (bits >> 23) & 0xFF  # biased exponent of amax (0 for 0)
    round_up = ((bits & 0x7FFFFF) > E4M3_MANTISSA_LIMIT).to(torch.int32)
    scale_byte = (exponent - E4M3_EMAX + round_up).clamp_min(1)
    scale = torch.exp2(scale_byte.float() - 127.0)
    values = (blocks / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values.reshape(x.shape), scale_byte.to(torch.uint8)


def dequantize_mx_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse of quantize_mx_fp8: [N, K] e4m3fn, [N, K/32] uint8 -> fp32 [N, K]."""
    scale = torch.exp2(scales.float() - 127.0)
    blocks = values.float().reshape(values.shape[0], -1, MX_BLOCK) * scale[..., None]
    return blocks.reshape(values.shape)


def max_tiles(num_pairs: int, num_experts: int) -> int:
    """Tiles of 16 pairs the grouping may need: the pairs plus up to 15 padding rows per used
    expert (at most min(E, pairs) experts are used)."""
    return -(-num_pairs // TILE_PAIRS) + min(num_experts, num_pairs)


def group_pairs(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert, each expert's run padded to 16 pairs, into
    ``max_tiles`` tiles (device ops only: no host sync).

    topk_ids, topk_weights: [T, k] -> (pair_tokens int32 [P], pair_weights fp32 [P],
    tile_experts int32 [P/16]) with P = 16 max_tiles; padding pairs have token -1 and weight 0,
    tiles past the last used one the last expert (in-bounds weights, nothing written)."""
    flat_ids = topk_ids.reshape(-1).long()
    top_k = topk_ids.shape[1]
    device = flat_ids.device
    num_tiles = max_tiles(flat_ids.numel(), num_experts)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts)[:num_experts]
    tiles = (counts + TILE_PAIRS - 1) // TILE_PAIRS
    tile_end = torch.cumsum(tiles, 0)
    start = torch.cumsum(counts, 0) - counts
    sorted_ids = flat_ids[order]
    rank = torch.arange(flat_ids.numel(), device=device) - start[sorted_ids]
    destination = (tile_end - tiles)[sorted_ids] * TILE_PAIRS + rank
    pair_tokens = torch.full((num_tiles * TILE_PAIRS,), -1, dtype=torch.int32, device=device)
    pair_weights = torch.zeros(num_tiles * TILE_PAIRS, dtype=torch.float32, device=device)
    pair_tokens[destination] = (order // top_k).to(torch.int32)
    pair_weights[destination] = topk_weights.reshape(-1).float()[order]
    tile_experts = torch.searchsorted(tile_end, torch.arange(num_tiles, device=device),
                                      right=True).clamp_max(num_experts - 1).to(torch.int32)
    return pair_tokens, pair_weights, tile_experts


def sum_pairs(y: torch.Tensor, pair_tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """u [T, Dl] fp32: the per-pair rows y [P, Dl] summed into their tokens; padding pairs
    (token -1) land in a spare row that is dropped (no boolean indexing: no host sync)."""
    rows = torch.where(pair_tokens >= 0, pair_tokens, num_tokens).long()
    out = torch.zeros(num_tokens + 1, y.shape[1], dtype=torch.float32, device=y.device)
    return out.index_add_(0, rows, y)[:num_tokens]


def check_shapes(w13_packed: torch.Tensor) -> str | None:
    """Why the kernels cannot take these shapes (None if they can): Dl, F multiples of 128."""
    latent_size, intermediate_size = 2 * w13_packed.shape[2], w13_packed.shape[1] // 2
    if latent_size % K_STEP or intermediate_size % K_STEP:
        return (f"needs Dl and F multiples of {K_STEP}, got Dl={latent_size}, "
                f"F={intermediate_size}")
    return None


def moe_experts_mxfp4_flydsl(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
) -> torch.Tensor:
    """`moe_experts_mxfp4` with the two FlyDSL kernels. z: [T, Dl] -> u fp32 [T, Dl]."""
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    reason = check_shapes(w13_packed)
    if reason is not None:
        raise ValueError(f"moe_experts_mxfp4_flydsl {reason}; use the triton or torch op")
    if z.dim() != 2 or z.shape[1] != latent_size or topk_ids.shape != topk_weights.shape:
        raise ValueError(f"moe_experts_mxfp4_flydsl: expected z [T, {latent_size}] and "
                         f"topk_ids/topk_weights [T, k], got {list(z.shape)}, "
                         f"{list(topk_ids.shape)}, {list(topk_weights.shape)}")
    if not beta > 0 or (linear_beta is not None and not linear_beta > 0):
        raise ValueError(f"moe_experts_mxfp4_flydsl: beta and linear_beta must be positive "
                         f"(linear_beta may be None), got {beta}, {linear_beta}")
    out = torch.zeros(z.shape[0], latent_size, dtype=torch.float32, device=z.device)
    if topk_ids.numel() == 0:
        return out
    pair_tokens, pair_weights, tile_experts = group_pairs(topk_ids, topk_weights, num_experts)
    num_pairs, num_tiles = pair_tokens.numel(), tile_experts.numel()
    z_values, z_scales = quantize_mx_fp8(z)
    h_bytes = torch.empty(num_pairs, intermediate_size, dtype=torch.uint8, device=z.device)
    h_scales = torch.empty(num_pairs, intermediate_size // MX_BLOCK, dtype=torch.uint8,
                           device=z.device)
    # torch's current stream, not FlyDSL's default: the engine captures decode steps into
    # CUDA (HIP) graphs on a side stream
    stream = fx.Stream(torch.cuda.current_stream(z.device))
    launch_gate_up_situ(
        z_values.view(torch.uint8).view(torch.int64), z_scales, pair_tokens, tile_experts,
        w13_packed.contiguous().view(torch.int64), w13_scales.contiguous(), h_bytes, h_scales,
        num_tiles, intermediate_size // TILE_COLUMNS, latent_size, intermediate_size,
        float(beta), float(linear_beta or 0.0), stream)
    y = torch.empty(num_pairs, latent_size, dtype=torch.float32, device=z.device)
    launch_down(h_bytes.view(torch.int64), h_scales, pair_weights, tile_experts,
                w2_packed.contiguous().view(torch.int64), w2_scales.contiguous(), y,
                num_tiles, latent_size // TILE_COLUMNS, latent_size, intermediate_size, stream)
    return sum_pairs(y, pair_tokens, z.shape[0])


def _placeholder_problem(num_tokens: int, top_k: int, num_experts: int, latent_size: int,
                         intermediate_size: int) -> dict[str, torch.Tensor]:
    """Zero CPU tensors of the kernels' argument shapes (for COMPILE_ONLY builds)."""
    num_pairs = -(-num_tokens * top_k // TILE_PAIRS) * TILE_PAIRS + num_experts * TILE_PAIRS
    return {
        "z_words": torch.zeros(num_tokens, latent_size // 8, dtype=torch.int64),
        "z_scales": torch.zeros(num_tokens, latent_size // MX_BLOCK, dtype=torch.uint8),
        "pair_tokens": torch.zeros(num_pairs, dtype=torch.int32),
        "pair_weights": torch.zeros(num_pairs),
        "tile_experts": torch.zeros(num_pairs // TILE_PAIRS, dtype=torch.int32),
        "w13_words": torch.zeros(num_experts, 2 * intermediate_size, latent_size // 16,
                                 dtype=torch.int64),
        "w13_scales": torch.zeros(num_experts, 2 * intermediate_size, latent_size // MX_BLOCK,
                                  dtype=torch.uint8),
        "w2_words": torch.zeros(num_experts, latent_size, intermediate_size // 16,
                                dtype=torch.int64),
        "w2_scales": torch.zeros(num_experts, latent_size, intermediate_size // MX_BLOCK,
                                 dtype=torch.uint8),
        "h_bytes": torch.zeros(num_pairs, intermediate_size, dtype=torch.uint8),
        "h_scales": torch.zeros(num_pairs, intermediate_size // MX_BLOCK, dtype=torch.uint8),
        "y": torch.zeros(num_pairs, latent_size),
    }


def compile_gate_up_situ(num_tokens: int = 4, top_k: int = 2, num_experts: int = 4,
                         latent_size: int = 256, intermediate_size: int = 128) -> None:
    """Compile the gate|up + SiTU + FP8 kernel with placeholder CPU tensors."""
    t = _placeholder_problem(num_tokens, top_k, num_experts, latent_size, intermediate_size)
    flyc.compile(launch_gate_up_situ, t["z_words"], t["z_scales"], t["pair_tokens"],
                 t["tile_experts"], t["w13_words"], t["w13_scales"], t["h_bytes"],
                 t["h_scales"], t["tile_experts"].numel(), intermediate_size // TILE_COLUMNS,
                 latent_size, intermediate_size, 1.0, 0.0)


def compile_down(num_tokens: int = 4, top_k: int = 2, num_experts: int = 4,
                 latent_size: int = 256, intermediate_size: int = 128) -> None:
    """Compile the down-projection kernel with placeholder CPU tensors."""
    t = _placeholder_problem(num_tokens, top_k, num_experts, latent_size, intermediate_size)
    flyc.compile(launch_down, t["h_bytes"].view(torch.int64), t["h_scales"], t["pair_weights"],
                 t["tile_experts"], t["w2_words"], t["w2_scales"], t["y"],
                 t["tile_experts"].numel(), latent_size // TILE_COLUMNS, latent_size,
                 intermediate_size)
