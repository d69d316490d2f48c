"""MXFP8: E4M3 (OCP e4m3fn) values in blocks of 32 along the last dim, one E8M0 scale per block.

The optional FP8 activations of the MoE down projection (issue #6) use it. Layout, as MXFP4's
(MODEL_SPEC §3.3, §6.2): ``values [..., n]`` ``torch.float8_e4m3fn``, ``scales [..., n/32]``
uint8 E8M0 bytes; ``x[..., i] = values[..., i] * 2^(scales[..., i // 32] - 127)``.

Quantizer (DEFINED HERE; the OCP MX v1.0 rule), per block with ``amax = max |x|``:

* ``e = floor(log2 amax) - 8`` (8 = exponent of e4m3fn's largest binade, 448 = 1.75 * 2^8),
  taken from amax's float32 exponent bits, never from a rounded log2 (as MXFP4, §9 #7). The
  block's largest scaled magnitude lands in [256, 512); values in (448, 512) saturate to 448.
  No MXFP4-style round-up: e4m3 already rounds (448, 464) to 448, so only (464, 512) clips.
* ``amax == 0`` (or float32-subnormal) gives ``e = -127`` (scale byte 0); ``e`` is clamped to
  [-127, 127].
* values ``e4m3fn(clamp(x / 2^e, -448, 448))``, round to nearest even (torch's cast, pinned
  by tests/quant/test_fp8.py), saturating; -0 keeps its sign.
* a block holding NaN or +-inf gets scale byte 0xFF (E8M0 NaN) and dequantizes to all NaN,
  as MXFP4 does (OCP MX v1.0 for a NaN scale).
"""

import torch

from atomk31.quant.e8m0 import E8M0_BIAS, E8M0_NAN, e8m0_to_float, float_blocks

MXFP8_BLOCK_SIZE: int = 32
# Exponent of e4m3fn's largest binade (448 = 1.75 * 2^8).
E4M3_MAX_EXPONENT: int = 8
E4M3_MAX: float = 448.0
_MIN_SCALE_EXPONENT = -127
_MAX_SCALE_EXPONENT = 127


def mxfp8_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The block exponent ``e`` (scale ``2^e``) for each block's ``amax``.

    Args:
        amax: ``[...]`` float32, non-negative block maxima of ``|x|``.

    Returns:
        ``[...]`` int32 in [-127, 127]; -127 for ``amax == 0`` and for float32-subnormal amax.
        Non-finite amax returns an unspecified value; callers flag it separately.
    """
    bits = amax.float().view(torch.int32)
    exponent_field = (bits >> 23) & 0xFF
    # A normal float's floor(log2) is its unbiased exponent; a subnormal's is <= -127, so
    # after "- 8" it clamps to -127.
    exponent = exponent_field - 127 - E4M3_MAX_EXPONENT
    exponent = torch.where(exponent_field == 0, _MIN_SCALE_EXPONENT, exponent)
    return exponent.clamp(_MIN_SCALE_EXPONENT, _MAX_SCALE_EXPONENT).to(torch.int32)


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to MXFP8 (e4m3fn values) along the last dim.

    Args:
        x: ``[..., n]`` any float dtype (computed in float32); ``n`` a multiple of 32.

    Returns:
        ``(values, scales)``: ``values [..., n]`` ``torch.float8_e4m3fn``; ``scales [..., n/32]``
        uint8 E8M0 bytes.
    """
    blocks = float_blocks(x, MXFP8_BLOCK_SIZE, "quantize_mxfp8")
    amax = blocks.abs().amax(dim=-1)
    scales = (mxfp8_scale_exponent(amax) + E8M0_BIAS).to(torch.uint8)
    # 2^e is exact in float32 for e in [-127, 127]: the division only moves the exponent.
    scaled = blocks / e8m0_to_float(scales).unsqueeze(-1)
    values = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    is_finite = torch.isfinite(amax) & ~torch.isnan(blocks).any(dim=-1)
    scales = torch.where(is_finite, scales, E8M0_NAN).to(torch.uint8)
    return values.reshape(x.shape), scales


def dequantize_mxfp8(
    values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantize MXFP8.

    Args:
        values: ``[..., n]`` ``torch.float8_e4m3fn``.
        scales: ``[..., n/32]`` uint8 E8M0 bytes (same leading dims as ``values``).
        dtype: output dtype; the product is formed in float32 (exact) and then cast.

    Returns:
        ``[..., n]`` of ``dtype``; a block with scale byte 0xFF is all NaN.
    """
    if values.dtype != torch.float8_e4m3fn or scales.dtype != torch.uint8:
        raise ValueError(
            f"dequantize_mxfp8 expects float8_e4m3fn values and uint8 E8M0 scales, got "
            f"{values.dtype} and {scales.dtype}"
        )
    if (
        values.dim() == 0
        or values.shape[:-1] != scales.shape[:-1]
        or values.shape[-1] != MXFP8_BLOCK_SIZE * scales.shape[-1]
    ):
        raise ValueError(
            f"dequantize_mxfp8 expects values [..., n] and scales [..., n/32] with equal "
            f"leading dims, got values {tuple(values.shape)} and scales {tuple(scales.shape)}"
        )
    n = values.shape[-1]
    blocks = values.float().reshape(*values.shape[:-1], n // MXFP8_BLOCK_SIZE, MXFP8_BLOCK_SIZE)
    blocks = blocks * e8m0_to_float(scales).unsqueeze(-1)
    return blocks.reshape(values.shape).to(dtype)
