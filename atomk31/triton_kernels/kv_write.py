"""kv_write in Triton: quantize new tokens' latent rows and index keys into their cache slots.

One launch per layer writes both pages of every token (MODEL_SPEC §4.5, §4.6.1, §7.1): the
576-wide latent row (fp8 with the layer's static scale, or bf16 / fp32) and the index key
(fp8: 128 e4m3 values + one fp32 scale; mxfp4: 64 bytes of E2M1 pairs + 4 E8M0 scales).
The quantizers are bit-exact twins of `atomk31.quant` (divisions are IEEE `div_rn`, as
torch's are on the CPU); `fp8_group_quantize` and `mxfp4_group_quantize` are shared with
the indexer kernel, which quantizes its queries the same way (§4.6 "Quantized evaluation").
"""

import torch
import triton
import triton.language as tl

from atomk31.quant.index_keys import FP8_INDEX_AMAX_FLOOR  # noqa: F401 (the kernels' floor)

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
BLOCK_TOKENS = 16


@triton.jit
def round_to_e4m3(x, FP8_MAX_VALUE: tl.constexpr):
    """e4m3(clamp(x, +-fmax)) as fp32 values: round to nearest even, saturating.

    Rounded here rather than by the fp8 cast because Triton's interpreter casts wrongly where
    rounding carries into the exponent (127.9 -> 64); the cast of the result is then exact.
    e4m3fn (fmax 448) has its smallest normal at 2^-6, e4m3fnuz (240) at 2^-7; below that
    the spacing stays 2^-9 (2^-10). -0 keeps its sign in e4m3fn, becomes +0 in e4m3fnuz.
    """
    magnitude = tl.minimum(tl.abs(x), FP8_MAX_VALUE)
    exponent = ((magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    if FP8_MAX_VALUE == 448.0:
        exponent = tl.maximum(exponent, -6)
    else:
        exponent = tl.maximum(exponent, -7)
    # The grid spacing 2^(e - 3) and its inverse, exact powers of two from their bits (a GPU
    # `/` is the approximate div.full.f32, so divide by multiplying with the exact inverse).
    spacing = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse_spacing = ((127 - (exponent - 3)) << 23).to(tl.float32, bitcast=True)
    # (y + 1.5 * 2^23) - 1.5 * 2^23 rounds y (< 2^22) to an integer, ties to even.
    units = (magnitude * inverse_spacing + 12582912.0) - 12582912.0
    rounded = units * spacing
    # The sign goes back as a bit: compiled Triton negates as 0 - x, which turns -0 into +0.
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    if FP8_MAX_VALUE != 448.0:
        sign = tl.where(rounded != 0, sign, 0)
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def round_to_bf16(x):
    """x rounded to bf16 (nearest even) as fp32 values, so the following cast is exact (the
    interpreter's own fp32 -> bf16 cast truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fp8_group_quantize(x, FP8_MAX_VALUE: tl.constexpr, MIN_AMAX: tl.constexpr):
    """x [R, 128] fp32 -> (e4m3 values [R, 128] as fp32, scales [R] fp32) (§4.6.1, §9 #4).

    s = max(amax, MIN_AMAX) / fmax; values = e4m3(clamp(x / s, +-fmax)), RNE, saturating.
    """
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.math.div_rn(tl.maximum(amax, MIN_AMAX), FP8_MAX_VALUE)
    return round_to_e4m3(tl.math.div_rn(x, scale[:, None]), FP8_MAX_VALUE), scale


@triton.jit
def mxfp4_group_quantize(x):
    """x [R, G, 32] fp32 -> the §6.3 quantizer, one E8M0 scale per group of 32.

    Returns (codes [R, G, 32] int32 E2M1 codes 0..15, values [R, G, 32] fp32 on the E2M1
    grid with the sign applied, scales 2^e [R, G] fp32, scale bytes [R, G] int32).
    """
    amax = tl.max(tl.abs(x), axis=2)
    # floor(log2 amax) from the exponent bits, + 1 when the mantissa is >= 1.75 ("round_up").
    bits = amax.to(tl.int32, bitcast=True)
    exponent_field = (bits >> 23) & 0xFF
    exponent = exponent_field - 127 - 2 + ((bits & 0x7FFFFF) >= 0x600000).to(tl.int32)
    exponent = tl.where(exponent_field == 0, -127, exponent)
    exponent = tl.minimum(tl.maximum(exponent, -127), 127)
    scale_byte = exponent + 127
    # 2^e from its float32 bits; e = -127 is the subnormal with mantissa bit 22.
    scale_bits = tl.where(scale_byte == 0, 1 << 22, scale_byte << 23)
    block_scale = scale_bits.to(tl.float32, bitcast=True)
    scaled = tl.math.div_rn(x, block_scale[:, :, None])
    # Round to nearest even on [0, .5, 1, 1.5, 2, 3, 4, 6]: ties go to the even index.
    magnitude = tl.abs(scaled)
    index = ((magnitude > 0.25).to(tl.int32) + (magnitude >= 0.75).to(tl.int32)
             + (magnitude > 1.25).to(tl.int32) + (magnitude >= 1.75).to(tl.int32)
             + (magnitude > 2.5).to(tl.int32) + (magnitude >= 3.5).to(tl.int32)
             + (magnitude > 5.0).to(tl.int32))
    is_negative = (scaled.to(tl.int32, bitcast=True) >> 31) != 0
    codes = index + is_negative.to(tl.int32) * 8
    grid_value = tl.where(index < 4, index.to(tl.float32) * 0.5,
                          tl.where(index == 7, 6.0, (index - 2).to(tl.float32)))
    values = tl.where(is_negative, -grid_value, grid_value)
    # A group holding NaN or inf gets the E8M0 NaN byte (atomk31.quant.mxfp4).
    is_bad = tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=2) != 0
    scale_byte = tl.where(is_bad, 255, scale_byte)
    return codes, values, block_scale, scale_byte


@triton.jit
def kv_write_kernel(
    # pointers
    latent_ptr, index_key_ptr, slot_mapping_ptr,
    latent_cache_ptr, index_values_ptr, index_scales_ptr,
    # sizes
    num_tokens, block_size, latent_scale,
    # strides (elements; last dims are contiguous)
    stride_latent_t, stride_key_t,
    stride_cache_b, stride_cache_t,
    stride_values_b, stride_values_t,
    stride_scales_b, stride_scales_t,
    # meta-parameters
    LATENT_FP8_MAX: tl.constexpr,  # 0.0 for a float latent cache
    LATENT_IS_BF16: tl.constexpr,
    IS_MXFP4: tl.constexpr,
    KEY_FP8_MAX: tl.constexpr,
    MIN_AMAX: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Program i_t writes tokens [i_t * BLOCK_T, +BLOCK_T); slot -1 tokens are skipped."""
    i_t = tl.program_id(0)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < num_tokens
    b_slot = tl.load(slot_mapping_ptr + o_t, mask=m_t, other=-1).to(tl.int64)
    m_t = m_t & (b_slot >= 0)
    b_slot = tl.maximum(b_slot, 0)
    o_block = b_slot // block_size
    o_offset = b_slot % block_size

    # Latent row [c 512 | k_r 64]: stored = e4m3(clamp(x / scale)) or a plain cast (§7.1).
    p_cache = latent_cache_ptr + o_block * stride_cache_b + o_offset * stride_cache_t
    o_nope = tl.arange(0, 512)
    o_rope = 512 + tl.arange(0, 64)
    b_nope = tl.load(latent_ptr + o_t[:, None] * stride_latent_t + o_nope[None, :],
                     mask=m_t[:, None], other=0.0).to(tl.float32)
    b_rope = tl.load(latent_ptr + o_t[:, None] * stride_latent_t + o_rope[None, :],
                     mask=m_t[:, None], other=0.0).to(tl.float32)
    if LATENT_FP8_MAX > 0:
        b_nope = round_to_e4m3(tl.math.div_rn(b_nope, latent_scale), LATENT_FP8_MAX)
        b_rope = round_to_e4m3(tl.math.div_rn(b_rope, latent_scale), LATENT_FP8_MAX)
    if LATENT_IS_BF16:
        b_nope = round_to_bf16(b_nope)
        b_rope = round_to_bf16(b_rope)
    cache_dtype = latent_cache_ptr.dtype.element_ty
    tl.store(p_cache[:, None] + o_nope[None, :], b_nope.to(cache_dtype), mask=m_t[:, None])
    tl.store(p_cache[:, None] + o_rope[None, :], b_rope.to(cache_dtype), mask=m_t[:, None])

    # Index key (§4.6.1).
    p_values = index_values_ptr + o_block * stride_values_b + o_offset * stride_values_t
    p_scales = index_scales_ptr + o_block * stride_scales_b + o_offset * stride_scales_t
    if IS_MXFP4:
        o_g = tl.arange(0, 4)
        o_byte = tl.arange(0, 16)
        o_nibble = tl.arange(0, 2)
        o_key = (o_g[None, :, None, None] * 32 + o_byte[None, None, :, None] * 2
                 + o_nibble[None, None, None, :])
        b_key = tl.load(index_key_ptr + o_t[:, None, None, None] * stride_key_t + o_key,
                        mask=m_t[:, None, None, None], other=0.0).to(tl.float32)
        b_key = tl.reshape(b_key, (BLOCK_T, 4, 32))
        codes, _, _, scale_byte = mxfp4_group_quantize(b_key)
        # Two codes per byte, the even element in the low nibble (§3.3).
        codes = tl.reshape(codes, (BLOCK_T, 4, 16, 2))
        packed = tl.sum(codes << (o_nibble[None, None, None, :] * 4), axis=3)
        o_packed = o_g[None, :, None] * 16 + o_byte[None, None, :]
        tl.store(p_values[:, None, None] + o_packed, packed.to(tl.uint8),
                 mask=m_t[:, None, None])
        tl.store(p_scales[:, None] + o_g[None, :], scale_byte.to(tl.uint8), mask=m_t[:, None])
    else:
        o_d = tl.arange(0, 128)
        b_key = tl.load(index_key_ptr + o_t[:, None] * stride_key_t + o_d[None, :],
                        mask=m_t[:, None], other=0.0).to(tl.float32)
        scaled, scale = fp8_group_quantize(b_key, KEY_FP8_MAX, MIN_AMAX)
        tl.store(p_values[:, None] + o_d[None, :],
                 scaled.to(index_values_ptr.dtype.element_ty), mask=m_t[:, None])
        tl.store(p_scales, scale, mask=m_t)


def kv_write_triton(
    latent: torch.Tensor,
    index_key: torch.Tensor,
    slot_mapping: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
) -> None:
    """Write Nt tokens' latent [Nt, 576] and index keys [Nt, 128] into their slots [Nt].

    Same contract as `atomk31.ops.kv_write.kv_write_torch` (shapes checked there); caches are
    [num_blocks, block_size, ...] views with a contiguous last dim. fp8_variant only names
    the key dtype, which the index_values tensor already carries.
    """
    del fp8_variant  # the fp8 dtype of index_values says it
    if index_format not in ("fp8", "mxfp4"):
        raise ValueError(f"index_format must be 'fp8' or 'mxfp4', got {index_format!r}")
    for name, cache in (("latent_cache", latent_cache), ("index_values", index_values),
                        ("index_scales", index_scales)):
        if cache.dim() >= 3 and cache.stride(-1) != 1:
            raise ValueError(
                f"{name} must have a contiguous last dim (a view of the pool row), got "
                f"strides {cache.stride()}")
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0 or latent_cache.shape[0] == 0:
        return
    latent = latent if latent.stride(-1) == 1 else latent.contiguous()
    index_key = index_key if index_key.stride(-1) == 1 else index_key.contiguous()
    is_mxfp4 = index_format == "mxfp4"
    key_fp8_max = 0.0 if is_mxfp4 else FP8_MAX[index_values.dtype]
    kv_write_kernel[(triton.cdiv(num_tokens, BLOCK_TOKENS),)](
        latent, index_key, slot_mapping,
        latent_cache, index_values, index_scales,
        num_tokens, latent_cache.shape[1], float(latent_scale),
        latent.stride(0), index_key.stride(0),
        latent_cache.stride(0), latent_cache.stride(1),
        index_values.stride(0), index_values.stride(1),
        index_scales.stride(0), index_scales.stride(1),
        LATENT_FP8_MAX=FP8_MAX.get(latent_cache.dtype, 0.0),
        LATENT_IS_BF16=latent_cache.dtype == torch.bfloat16,
        IS_MXFP4=is_mxfp4,
        KEY_FP8_MAX=key_fp8_max,
        MIN_AMAX=FP8_INDEX_AMAX_FLOOR,
        BLOCK_T=BLOCK_TOKENS,
    )
