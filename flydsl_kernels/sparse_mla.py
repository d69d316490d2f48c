"""FlyDSL sparse MLA over the FP8 latent cache (gfx950; the prefill case, MODEL_SPEC §4.5, §4.6).

Computes the `sparse_mla` op (atomk31/ops/sparse_mla.py): for each query row, softmax over
its selected latent rows of ``(q · row) * softmax_scale``, times the rows' first 512 values;
returns (out [Nq, H, 512] fp32, lse [Nq, H] fp32).

One workgroup (one wave of 64 lanes) per (query row, group of 16 local heads). It reads the
selected rows straight from the FP8 latent cache, 16 rows per step, never materialising
dequantized rows, and keeps the online-softmax state and the [16 heads, 512] output in
registers. The cache is any page view with 8-byte aligned rows, read in place: the engine's
`layer_view` of its packed pool (atomk31/cache/layout.py) strides each layer's pages by the
whole block row, so the launcher passes the bytes the view spans (`latent_span`) with the
block and token strides, and a slot's row is found at block x block stride + token x token
stride (64-bit: a pool is larger than 2^31 bytes):

* scores, transposed: ``S^T[key, head] = K_tile[16, 576] · Q[16, 576]^T`` with 18
  ``v_mfma_f32_16x16x32_fp8_fp8`` (queries quantized to e4m3 per (row, head) on the host, one
  fp32 scale each, the latent's static scale folded in after);
* online softmax per head across the 16 keys: in the MFMA result layout a lane holds four
  keys of one head, so the reductions are in-lane plus two cross-lane xor shuffles;
* ``O^T[col, head] += V^T[col, key] · P^T[key, head]`` with 32 ``v_mfma_f32_16x16x16_bf16``:
  P^T is already in the B-operand layout (no transpose), V comes from the same FP8 rows
  (e4m3 -> bf16 is exact).

Accuracy: the query goes through e4m3 (§6.1) and P through bf16, as in production FP8 MLA
kernels; the tests therefore compare against the torch op with the queries pre-rounded the
same way and a bf16-level tolerance. Requires K3.1's 576-wide rows; H padded to 16. The op
checks its arguments before the launcher runs; the registry runs it on gfx950 for prefill's
many rows (`sparse_mla`'s "many_rows" shape class), with nothing else behind it.
"""

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import rocdl as rocdl_ops
from flydsl.expr import rocdl
from flydsl.expr.typing import Vector as Vec

LATENT_DIM = 576  # [c 512 | k_r 64] (§4.5)
VALUE_DIM = 512
HEADS_PER_GROUP = 16  # the MFMA's N: one wave covers 16 heads
KEYS_PER_STEP = 16  # the MFMA's M for scores / K for P·V
WAVE = 64
SCORE_K = 32  # K of v_mfma_f32_16x16x32_fp8_fp8
LOG2E = 1.4426950408889634


def _e4m3_to_float(byte: fx.Uint8) -> fx.Float32:
    """One e4m3fn byte -> fp32 with the hardware converter (v_cvt_f32_fp8)."""
    word = byte.to(fx.Int32)
    return fx.Float32(rocdl_ops.cvt_f32_fp8(fx.T.f32, word.ir_value(), 0))


def _row_words(slot: fx.Int32, block_shift: fx.Int32, stride_block_words: fx.Int64,
               stride_token_words: fx.Int64) -> fx.Int64:
    """Word (8-byte) offset of a slot's latent row: block = slot >> shift (block_size a power
    of two), token = slot & (block_size - 1), in 64 bits (a pool spans more than 2^31 B)."""
    block = fx.Int32(slot >> block_shift)
    token = fx.Int32(slot - fx.Int32(block << block_shift))
    return block.to(fx.Int64) * stride_block_words + token.to(fx.Int64) * stride_token_words


@flyc.kernel
def sparse_mla_kernel(
    q_words: fx.Tensor,  # [Nq, H, 72] int64: e4m3 queries, 8 per word
    q_scales: fx.Tensor,  # [Nq, H] fp32: per (row, head) e4m3 scale * latent_scale * sm_scale
    latent_words: fx.Tensor,  # the latent pages' span as int64 words (8 e4m3 values each)
    latent_bytes: fx.Tensor,  # the same span as uint8, for P·V
    slots: fx.Tensor,  # [Nq, k] int32, -1 = masked
    out: fx.Tensor,  # [Nq, H, 512] fp32
    lse: fx.Tensor,  # [Nq, H] fp32
    num_heads: fx.Int32,
    num_selected: fx.Int32,
    latent_scale: fx.Float32,
    block_shift: fx.Int32,  # log2(block_size)
    stride_block_words: fx.Int64,  # the latent's block stride, in words
    stride_token_words: fx.Int64,  # its token (row) stride, in words
):
    lane = fx.thread_idx.x
    row = fx.block_idx.x
    head_group = fx.block_idx.y
    n16 = lane % fx.Int32(16)  # MFMA lane column: the head (scores, P·V) / key row (operand A)
    kg = lane // fx.Int32(16)  # MFMA lane group
    head = head_group * fx.Int32(HEADS_PER_GROUP) + n16
    is_head = head < num_heads
    safe_head = is_head.select(head, fx.Int32(0))
    p_q = fx.get_iter(q_words)
    p_qs = fx.get_iter(q_scales)
    p_kw = fx.get_iter(latent_words)
    p_kv = fx.get_iter(latent_bytes)
    p_slots = fx.get_iter(slots)
    p_out = fx.get_iter(out)
    p_lse = fx.get_iter(lse)
    q_base = (row * num_heads + safe_head) * fx.Int32(LATENT_DIM // 8)
    q_scale = fx.ptr_load(p_qs + (row * num_heads + safe_head))
    slot_base = row * num_selected

    # Online-softmax state of this lane's head, and O^T[col, head] for 32 column tiles.
    running_max = fx.Float32(float("-inf"))
    running_sum = fx.Float32(0.0)
    acc = [Vec.filled(4, 0.0, fx.Float32) for _ in range(VALUE_DIM // 16)]

    for step in range(0, num_selected, KEYS_PER_STEP):
        # ---- S^T tile: keys (M) x heads (N), K = 576 in 18 fp8 MFMAs ----
        key_a = step + n16  # operand A row of this lane
        in_range_a = key_a < num_selected
        slot_a = fx.ptr_load(p_slots + (slot_base + in_range_a.select(key_a, fx.Int32(0))))
        slot_a = (in_range_a & (slot_a >= fx.Int32(0))).select(slot_a, fx.Int32(0))
        row_a = _row_words(slot_a, block_shift, stride_block_words, stride_token_words)
        scores = Vec.filled(4, 0.0, fx.Float32)
        for k_step in fx.range_constexpr(LATENT_DIM // SCORE_K):
            word = fx.Int32(k_step * (SCORE_K // 8)) + kg
            a = fx.ptr_load(p_kw + (row_a + word.to(fx.Int64)))
            b = fx.ptr_load(p_q + (q_base + word))
            scores = Vec(rocdl.mfma_f32_16x16x32_fp8_fp8(
                Vec.make_type(4, fx.Float32), [a, b, scores.ir_value()]), (4,), fx.Float32)

        # ---- this lane's four keys (kg*4 + i) of its head: mask, scale, tile max ----
        key_rows = []  # byte offsets of this lane's four keys' rows
        logits = []
        tile_max = fx.Float32(float("-inf"))
        for i in fx.range_constexpr(4):
            key = step + kg * fx.Int32(4) + fx.Int32(i)
            in_range = key < num_selected
            slot = fx.ptr_load(p_slots + (slot_base + in_range.select(key, fx.Int32(0))))
            is_valid = in_range & (slot >= fx.Int32(0)) & is_head
            key_rows.append(_row_words(is_valid.select(slot, fx.Int32(0)), block_shift,
                                       stride_block_words, stride_token_words) * fx.Int64(8))
            logit = is_valid.select(scores[i] * q_scale, fx.Float32(float("-inf")))
            logits.append(logit)
            tile_max = tile_max.maximumf(logit)
        # The other 12 keys of this head sit in lanes n16 + 16, + 32, + 48.
        tile_max = tile_max.maximumf(fx.gpu.shuffle_xor(tile_max, 16, WAVE))
        tile_max = tile_max.maximumf(fx.gpu.shuffle_xor(tile_max, 32, WAVE))
        new_max = running_max.maximumf(tile_max)
        # A head with every key masked so far keeps max -inf; shift by 0 to avoid NaN.
        shift = (new_max == fx.Float32(float("-inf"))).select(fx.Float32(0.0), new_max)
        alpha = ((running_max - shift) * fx.Float32(LOG2E)).exp2()
        probabilities = []
        tile_sum = fx.Float32(0.0)
        for i in fx.range_constexpr(4):
            p = ((logits[i] - shift) * fx.Float32(LOG2E)).exp2()
            probabilities.append(p)
            tile_sum = tile_sum + p
        tile_sum = tile_sum + fx.gpu.shuffle_xor(tile_sum, 16, WAVE)
        tile_sum = tile_sum + fx.gpu.shuffle_xor(tile_sum, 32, WAVE)
        running_sum = running_sum * alpha + tile_sum
        running_max = new_max
        # P^T in the B-operand layout of the bf16 MFMA: lane holds P[key kg*4+i, head n16].
        p_operand = Vec.from_elements(probabilities, dtype=fx.Float32).to(
            fx.BFloat16).bitcast(fx.Int16)

        # ---- O^T[col, head] = alpha * O^T + V^T[col, keys] P^T[keys, head] ----
        for tile in fx.range_constexpr(VALUE_DIM // 16):
            column = fx.Int32(tile * 16) + n16
            values = [_e4m3_to_float(fx.ptr_load(
                p_kv + (key_rows[i] + column.to(fx.Int64)))) for i in range(4)]
            v_operand = Vec.from_elements(values, dtype=fx.Float32).to(
                fx.BFloat16).bitcast(fx.Int16)
            scaled = Vec.from_elements([acc[tile][i] * alpha for i in range(4)], dtype=fx.Float32)
            acc[tile] = Vec(rocdl.mfma_f32_16x16x16bf16_1k(
                Vec.make_type(4, fx.Float32),
                [v_operand.ir_value(), p_operand.ir_value(), scaled.ir_value()]), (4,), fx.Float32)

    # ---- epilogue: out = O / sum * latent_scale (values are the stored bytes), lse ----
    if is_head:
        inverse = (running_sum > fx.Float32(0.0)).select(latent_scale / running_sum,
                                                        fx.Float32(0.0))
        out_base = (row * num_heads + head) * fx.Int32(VALUE_DIM)
        for tile in fx.range_constexpr(VALUE_DIM // 16):
            for i in fx.range_constexpr(4):
                column = fx.Int32(tile * 16) + kg * fx.Int32(4) + fx.Int32(i)
                fx.ptr_store(acc[tile][i] * inverse, p_out + (out_base + column))
        if kg == fx.Int32(0):
            row_lse = (running_sum > fx.Float32(0.0)).select(
                running_max + fx.math.log(running_sum), fx.Float32(float("-inf")))
            fx.ptr_store(row_lse, p_lse + (row * num_heads + head))


@flyc.jit
def launch_sparse_mla(
    q_words: fx.Tensor, q_scales: fx.Tensor, latent_words: fx.Tensor,
    latent_bytes: fx.Tensor, slots: fx.Tensor, out: fx.Tensor, lse: fx.Tensor,
    num_rows: fx.Int32, num_head_groups: fx.Int32, num_heads: fx.Int32,
    num_selected: fx.Int32, latent_scale: fx.Float32, block_shift: fx.Int32,
    stride_block_words: fx.Int64, stride_token_words: fx.Int64,
    stream: fx.Stream = fx.Stream(None),
):
    sparse_mla_kernel(q_words, q_scales, latent_words, latent_bytes, slots, out, lse,
                      num_heads, num_selected, latent_scale, block_shift, stride_block_words,
                      stride_token_words).launch(
        grid=(num_rows, num_head_groups, 1), block=(WAVE, 1, 1), stream=stream)


def prepare_queries(q: torch.Tensor, latent_scale: float,
                    softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries [Nq, H, 576] -> (e4m3 words [Nq, H, 72] int64, fp32 scales [Nq, H]).

    One scale per (row, head): s = max(amax, 1e-12) / 448 (§6.1, e4m3fn). The returned scale
    also carries the latent's static scale and the softmax scale, so the kernel multiplies
    each raw fp8 dot product by one number.
    """
    amax = q.float().abs().amax(dim=-1).clamp_min(1e-12)
    scale = amax / 448.0
    q_fp8 = (q.float() / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    words = q_fp8.contiguous().view(torch.uint8).view(torch.int64)
    return words, (scale * latent_scale * softmax_scale).contiguous()


def latent_span(latent_cache: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The bytes a strided latent view [num_blocks, block_size, 576] spans, as one 1-D uint8
    view from its first row (no copy: in the engine's pool the span holds the other layers'
    pages too, which the kernel never reads), with the block and token strides in 8-byte
    words. ValueError unless the view can be read as words (rows and strides 8-byte
    aligned, rows dense)."""
    num_blocks, block_size, _ = latent_cache.shape
    stride_block, stride_token, stride_column = latent_cache.stride()
    if stride_column != 1 or stride_block % 8 or stride_token % 8 or \
            latent_cache.storage_offset() % 8:
        raise ValueError(f"sparse_mla_flydsl reads the latent as 8-byte words: rows must be "
                         f"dense and 8-byte aligned, got strides {latent_cache.stride()} at "
                         f"offset {latent_cache.storage_offset()}; pass a page view of the "
                         f"engine's pool")
    span = (num_blocks - 1) * stride_block + (block_size - 1) * stride_token + LATENT_DIM
    return (latent_cache.view(torch.uint8).as_strided((span,), (1,)), stride_block // 8,
            stride_token // 8)


def sparse_mla_flydsl(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `sparse_mla` contract on an e4m3fn latent cache, with the FlyDSL kernel; the op
    checks its arguments first, and the registry runs this on gfx950 for many rows. The cache
    may be any page view with 8-byte aligned rows (the engine's `layer_view` of the packed
    pool: a block stride of the whole row), read in place."""
    num_rows, num_selected = slots.shape
    num_heads = q.shape[1]
    out = torch.zeros(num_rows, num_heads, VALUE_DIM, device=q.device)
    lse = torch.full((num_rows, num_heads), -torch.inf, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    block_size = latent_cache.shape[1]
    row_bytes, stride_block_words, stride_token_words = latent_span(latent_cache)
    q_words, q_scales = prepare_queries(q, latent_scale, softmax_scale)
    num_head_groups = -(-num_heads // HEADS_PER_GROUP)
    if slots.dtype != torch.int32 or not slots.is_contiguous():
        slots = slots.to(torch.int32).contiguous()
    # torch's current stream, not FlyDSL's default: the engine captures decode steps into
    # CUDA (HIP) graphs on a side stream; off a GPU (compile-only builds) the default
    stream = fx.Stream(torch.cuda.current_stream(q.device) if q.is_cuda else None)
    launch_sparse_mla(q_words, q_scales, row_bytes.view(torch.int64), row_bytes, slots, out,
                      lse, num_rows, num_head_groups, num_heads, num_selected,
                      float(latent_scale), block_size.bit_length() - 1, stride_block_words,
                      stride_token_words, stream)
    return out, lse
