"""MXFP4: E2M1 values in blocks of 32 along the last dim, one E8M0 scale per block.

Layout (MODEL_SPEC §3.3): ``packed [..., n/2]`` uint8 with the even element in the low nibble,
``scales [..., n/32]`` uint8 E8M0 bytes;
``x[..., i] = e2m1(code i) * 2^(scales[..., i // 32] - 127)``.

Quantizer (§6.3, §9 #7), per block with ``amax = max |x|``:

* ``scale_rule="round_up"`` (normative): ``e = floor(log2 amax) + (mantissa(amax) >= 1.75) - 2``,
  the aiter/vLLM rule (add 0x200000 to amax's float32 bits, clear the mantissa, then the OCP
  rule). The block's largest scaled magnitude lands in [3.5, 7), so only (6, 7) clips.
* ``scale_rule="floor"``: pure OCP MX v1.0, ``e = floor(log2 amax) - 2``; clips up to 8.

Both take ``floor(log2 amax)`` from amax's float32 exponent bits, never from a rounded log2
(§9 #7); ``amax == 0`` gives ``e = -127`` (scale byte 0); ``e`` is clamped to [-127, 127].
Values are rounded to nearest even on the E2M1 grid and saturate at 6.
DEFINED HERE: a block holding NaN or +-inf gets scale byte 0xFF (E8M0 NaN), so the whole block
dequantizes to NaN, as OCP MX v1.0 prescribes for a NaN scale.
"""

import torch

from atomk31.quant.e2m1 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1
from atomk31.quant.e8m0 import E8M0_BIAS, E8M0_NAN, e8m0_to_float, float_blocks

MXFP4_BLOCK_SIZE: int = 32
MXFP4_SCALE_RULES: tuple[str, ...] = ("round_up", "floor")

# Exponent of E2M1's largest binade (6 = 1.5 * 2^2).
_E2M1_MAX_EXPONENT = 2
_MIN_SCALE_EXPONENT = -127
_MAX_SCALE_EXPONENT = 127
# float32 mantissa field of 1.75 (binary 1.11): a mantissa at or above it rounds amax up.
_MANTISSA_BITS_OF_1_75 = 0x600000


def mxfp4_scale_exponent(amax: torch.Tensor, scale_rule: str = "round_up") -> torch.Tensor:
    """The block exponent ``e`` (scale ``2^e``) for each block's ``amax``.

    Args:
        amax: ``[...]`` float32, non-negative block maxima of ``|x|``.
        scale_rule: ``"round_up"`` (§6.3, normative) or ``"floor"`` (OCP MX v1.0).

    Returns:
        ``[...]`` int32 in [-127, 127]; -127 for ``amax == 0`` and for float32-subnormal amax.
        Non-finite amax returns an unspecified value; callers flag it separately.
    """
    _check_scale_rule(scale_rule)
    bits = amax.float().view(torch.int32)
    exponent_field = (bits >> 23) & 0xFF
    # For a normal float, floor(log2 amax) is its unbiased exponent exactly. A subnormal
    # (exponent field 0, which includes amax == 0) has floor(log2) <= -127, so after "- 2"
    # it is below -127 whatever the rule and clamps to -127.
    floor_log2 = exponent_field - 127
    exponent = floor_log2 - _E2M1_MAX_EXPONENT
    if scale_rule == "round_up":
        mantissa_rounds_up = (bits & 0x7FFFFF) >= _MANTISSA_BITS_OF_1_75
        exponent = exponent + mantissa_rounds_up.to(torch.int32)
    exponent = torch.where(exponent_field == 0, _MIN_SCALE_EXPONENT, exponent)
    return exponent.clamp(_MIN_SCALE_EXPONENT, _MAX_SCALE_EXPONENT).to(torch.int32)


def quantize_mxfp4(
    x: torch.Tensor, scale_rule: str = "round_up"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to MXFP4 along the last dim.

    Args:
        x: ``[..., n]`` any float dtype (computed in float32); ``n`` a multiple of 32.
        scale_rule: ``"round_up"`` (§6.3, the default and normative) or ``"floor"``.

    Returns:
        ``(packed, scales)``: ``packed [..., n/2]`` uint8, two E2M1 codes per byte, even
        element in the low nibble; ``scales [..., n/32]`` uint8 E8M0 bytes.
    """
    _check_scale_rule(scale_rule)
    blocks = float_blocks(x, MXFP4_BLOCK_SIZE, "quantize_mxfp4")
    amax = blocks.abs().amax(dim=-1)
    exponent = mxfp4_scale_exponent(amax, scale_rule)
    scales = (exponent + E8M0_BIAS).to(torch.uint8)
    # 2^e is exact in float32 for e in [-127, 127], so the division only moves the exponent.
    block_scale = e8m0_to_float(scales)
    codes = encode_e2m1(blocks / block_scale.unsqueeze(-1))
    scales = torch.where(torch.isfinite(amax), scales, E8M0_NAN).to(torch.uint8)
    packed = pack_e2m1(codes.reshape(x.shape))
    return packed, scales


def dequantize_mxfp4(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantize MXFP4.

    Args:
        packed: ``[..., n/2]`` uint8, two E2M1 codes per byte, even element in the low nibble.
        scales: ``[..., n/32]`` uint8 E8M0 bytes (same leading dims as ``packed``).
        dtype: output dtype; the product is formed in float32 (exact) and then cast.

    Returns:
        ``[..., n]`` of ``dtype``; a block with scale byte 0xFF is all NaN.
    """
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(
            f"dequantize_mxfp4 expects uint8 packed codes and uint8 E8M0 scales, got "
            f"{packed.dtype} and {scales.dtype}"
        )
    num_bytes_per_block = MXFP4_BLOCK_SIZE // 2
    if (
        packed.dim() == 0
        or packed.shape[:-1] != scales.shape[:-1]
        or packed.shape[-1] != num_bytes_per_block * scales.shape[-1]
    ):
        raise ValueError(
            f"dequantize_mxfp4 expects packed [..., n/2] and scales [..., n/32] with equal "
            f"leading dims (16 packed bytes per scale), got packed {tuple(packed.shape)} and "
            f"scales {tuple(scales.shape)}"
        )
    values = decode_e2m1(unpack_e2m1(packed))
    n = values.shape[-1]
    blocks = values.reshape(*values.shape[:-1], n // MXFP4_BLOCK_SIZE, MXFP4_BLOCK_SIZE)
    blocks = blocks * e8m0_to_float(scales).unsqueeze(-1)
    return blocks.reshape(*values.shape[:-1], n).to(dtype)


def _check_scale_rule(scale_rule: str) -> None:
    if scale_rule not in MXFP4_SCALE_RULES:
        raise ValueError(
            f"scale_rule must be one of {MXFP4_SCALE_RULES}, got {scale_rule!r}; "
            f"'round_up' is the normative rule of MODEL_SPEC §6.3"
        )
