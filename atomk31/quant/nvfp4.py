"""NVFP4: E2M1 values in blocks of 16, one E4M3 (fn) scale per block, one fp32 global scale.

Layout (MODEL_SPEC §6.4): ``packed [..., n/2]`` uint8, two E2M1 codes per byte, even element in
the low nibble (as MXFP4, §3.3); ``block_scales [..., n/16]`` ``torch.float8_e4m3fn``;
``x = v * s_b * s_g``.

Quantizer: ``s_b = e4m3_rne(amax_b / (6 * s_g))`` (saturating at 448),
``v = round_e2m1(x / (s_b * s_g))``. A block whose ``s_b`` is 0 (an all-zero block, or one so
small that ``s_b`` rounds to 0) gets codes of magnitude 0; they keep ``x``'s sign as in MXFP4
(§9 #7), which decodes to +-0 either way. The block scale is always e4m3fn, the format NVIDIA
Blackwell consumes natively; it is not tied to the platform's FP8 variant.
"""

import math

import torch

from atomk31.quant.e2m1 import E2M1_MAX, decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1
from atomk31.quant.fp8 import divide_exactly, quantize_fp8

NVFP4_BLOCK_SIZE: int = 16


def quantize_nvfp4(
    x: torch.Tensor, global_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to NVFP4 along the last dim.

    Args:
        x: ``[..., n]`` any float dtype (computed in float32); ``n`` a multiple of 16.
        global_scale: ``s_g``, positive and finite (the KV latent uses 1.0, §6.4).

    Returns:
        ``(packed, block_scales)``: ``packed [..., n/2]`` uint8 (even element in the low nibble)
        and ``block_scales [..., n/16]`` ``torch.float8_e4m3fn``.
    """
    _check_global_scale(global_scale)
    if x.dim() == 0 or x.shape[-1] % NVFP4_BLOCK_SIZE != 0:
        raise ValueError(
            f"quantize_nvfp4 needs a last dim that is a multiple of {NVFP4_BLOCK_SIZE} "
            f"(one scale per block), got shape {tuple(x.shape)}; pad the last dim with zeros"
        )
    n = x.shape[-1]
    blocks = x.float().reshape(*x.shape[:-1], n // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    amax = blocks.abs().amax(dim=-1)
    # Round amax / (6 s_g) straight to e4m3 (RNE, saturating): scale 1 inside quantize_fp8.
    block_scales = quantize_fp8(divide_exactly(amax, E2M1_MAX * global_scale), 1.0, "e4m3fn")
    denominator = (block_scales.float() * global_scale).unsqueeze(-1)
    # blocks * 0.0 is a zero carrying each value's sign, for blocks whose s_b rounded to 0.
    scaled = torch.where(denominator > 0, blocks / denominator, blocks * 0.0)
    codes = encode_e2m1(scaled).reshape(*x.shape[:-1], n)
    return pack_e2m1(codes), block_scales


def dequantize_nvfp4(
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantize NVFP4: ``x = v * s_b * s_g``.

    Args:
        packed: ``[..., n/2]`` uint8, two E2M1 codes per byte, even element in the low nibble.
        block_scales: ``[..., n/16]`` ``torch.float8_e4m3fn`` (same leading dims as ``packed``).
        global_scale: ``s_g`` used at quantization.
        dtype: output dtype; the product is formed in float32 and then cast.

    Returns:
        ``[..., n]`` of ``dtype``.
    """
    _check_global_scale(global_scale)
    if packed.dtype != torch.uint8 or block_scales.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"dequantize_nvfp4 expects uint8 packed codes and float8_e4m3fn block scales, got "
            f"{packed.dtype} and {block_scales.dtype}"
        )
    num_bytes_per_block = NVFP4_BLOCK_SIZE // 2
    if (
        packed.dim() == 0
        or packed.shape[:-1] != block_scales.shape[:-1]
        or packed.shape[-1] != num_bytes_per_block * block_scales.shape[-1]
    ):
        raise ValueError(
            f"dequantize_nvfp4 expects packed [..., n/2] and block_scales [..., n/16] with equal "
            f"leading dims (8 packed bytes per scale), got packed {tuple(packed.shape)} and "
            f"block_scales {tuple(block_scales.shape)}"
        )
    values = decode_e2m1(unpack_e2m1(packed))
    n = values.shape[-1]
    blocks = values.reshape(*values.shape[:-1], n // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    blocks = blocks * (block_scales.float() * global_scale).unsqueeze(-1)
    return blocks.reshape(*values.shape[:-1], n).to(dtype)


def _check_global_scale(global_scale: float) -> None:
    if not (math.isfinite(global_scale) and global_scale > 0):
        raise ValueError(
            f"global_scale must be a positive finite float, got {global_scale!r}; "
            f"use 1.0 for the uncalibrated KV latent (MODEL_SPEC §6.4)"
        )
