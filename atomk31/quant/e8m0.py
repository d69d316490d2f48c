"""E8M0: the MX block-scale format (MODEL_SPEC §6.2).

An 8-bit unsigned exponent with bias 127: byte ``e`` in 0..254 means ``2^(e - 127)``;
``0xFF`` is NaN. No sign, no mantissa, no zero. Both directions are exact: every code is a
float32 (``2^-127`` is a float32 subnormal), and only powers of two are encodable.
"""

import torch

E8M0_BIAS: int = 127
E8M0_NAN: int = 0xFF

_FLOAT32_EXPONENT_SHIFT = 23
_FLOAT32_MANTISSA_MASK = 0x7FFFFF
_FLOAT32_QUIET_NAN_BITS = 0x7FC00000
# 2^-127 is the float32 subnormal with only mantissa bit 22 set.
_FLOAT32_TWO_TO_MINUS_127_BITS = 1 << 22


def e8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 bytes.

    Args:
        codes: ``[...]`` uint8.

    Returns:
        ``[...]`` float32, ``2^(code - 127)``; NaN for 0xFF. Built from float32 bits, so exact.
    """
    if codes.dtype != torch.uint8:
        raise ValueError(f"e8m0_to_float expects uint8 codes, got dtype {codes.dtype}")
    exponent = codes.to(torch.int32)
    bits = exponent << _FLOAT32_EXPONENT_SHIFT  # biases agree: code e is float32 exponent field e
    bits = torch.where(exponent == 0, _FLOAT32_TWO_TO_MINUS_127_BITS, bits)
    bits = torch.where(exponent == E8M0_NAN, _FLOAT32_QUIET_NAN_BITS, bits)
    return bits.view(torch.float32)


def float_to_e8m0(x: torch.Tensor) -> torch.Tensor:
    """Encode exact powers of two as E8M0 bytes.

    Args:
        x: ``[...]`` float (computed in float32); every element a power of two in
            ``[2^-127, 2^127]``, or NaN.

    Returns:
        ``[...]`` uint8; NaN encodes as 0xFF.

    Raises:
        ValueError: if any element is not such a power of two (zero, negative, inf, 3.0, ...).
            This function never rounds: pick the exponent first (e.g. the MXFP4 scale rule).
    """
    x = x.float()
    bits = x.view(torch.int32)
    exponent_field = (bits >> _FLOAT32_EXPONENT_SHIFT) & 0xFF
    is_positive = bits >= 0
    is_normal_power = (exponent_field >= 1) & (exponent_field <= 254) & (
        (bits & _FLOAT32_MANTISSA_MASK) == 0
    )
    is_two_to_minus_127 = bits == _FLOAT32_TWO_TO_MINUS_127_BITS
    is_nan = torch.isnan(x)
    is_valid = is_nan | (is_positive & (is_normal_power | is_two_to_minus_127))
    if not bool(is_valid.all()):
        bad = x[~is_valid]
        raise ValueError(
            f"float_to_e8m0 expects powers of two in [2^-127, 2^127] or NaN; got {bad.numel()} "
            f"other value(s), first {bad[0].item()!r}; choose the exponent before encoding"
        )
    codes = torch.where(is_two_to_minus_127, 0, exponent_field)
    codes = torch.where(is_nan, E8M0_NAN, codes)
    return codes.to(torch.uint8)


def float_blocks(x: torch.Tensor, block_size: int, op_name: str) -> torch.Tensor:
    """x [..., n] float -> float32 [..., n / block_size, block_size]: the blocks that each get
    one E8M0 scale in the MX formats (MXFP4, MXFP8). Raises ValueError, naming `op_name`, for
    a last dim that is not a multiple of the block or a non-float tensor."""
    if x.dim() == 0 or x.shape[-1] % block_size != 0:
        raise ValueError(
            f"{op_name} needs a last dim that is a multiple of {block_size} "
            f"(one scale per block), got shape {tuple(x.shape)}; pad the last dim with zeros"
        )
    if not x.is_floating_point():
        raise ValueError(f"{op_name} expects a float tensor, got dtype {x.dtype}")
    n = x.shape[-1]
    return x.float().reshape(*x.shape[:-1], n // block_size, block_size)
