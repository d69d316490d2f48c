"""E2M1 (FP4) codes: encode with round-to-nearest-even, decode, and nibble packing.

A code is 4 bits: bit 3 is the sign, bits 0-2 index the magnitude grid
``[0, 0.5, 1, 1.5, 2, 3, 4, 6]`` (MODEL_SPEC §6.3; 1 sign, 2 exponent bits with bias 1,
1 mantissa bit, no inf/NaN). Unpacked codes live one per ``uint8`` (values 0..15); packed
codes live two per byte with the EVEN element in the LOW nibble (§3.3, compressed-tensors'
``pack_fp4_to_uint8``: ``byte = code[2j+1] << 4 | code[2j]``).
"""

import torch

E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX: float = 6.0
E2M1_SIGN_BIT: int = 0x8

# Midpoint between grid magnitudes k and k+1. A magnitude exactly on a midpoint is a tie and
# goes to the code whose mantissa bit (bit 0) is 0, i.e. to the even index (§6.3:
# 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4).
_MIDPOINTS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round values onto the E2M1 grid and return their codes.

    Args:
        x: ``[...]`` any float dtype; computed in float32.

    Returns:
        ``[...]`` uint8 codes in 0..15. Round-to-nearest-even on the grid; magnitudes above 6
        saturate to 6 (code 7/15). The sign bit always follows ``x``'s sign bit, so a value that
        rounds to magnitude 0 keeps its sign (``-0.1 -> 0x8``, §9 #7). NaN has no code: it
        encodes as a (signed) zero; callers that must flag NaN do so in the scale (MXFP4).
    """
    magnitude = x.float().abs()
    index = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for k, midpoint in enumerate(_MIDPOINTS):
        # Index k even: a tie stays at k (strict >). Index k odd: a tie moves up to k + 1.
        rounds_up = magnitude >= midpoint if k % 2 == 1 else magnitude > midpoint
        index += rounds_up.to(torch.uint8)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return sign | index


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes.

    Args:
        codes: ``[...]`` uint8, values 0..15 (bits 4-7 are ignored).

    Returns:
        ``[...]`` float32; code 0x8 decodes to -0.0.
    """
    _check_uint8("codes", codes)
    table = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=codes.device)
    magnitude = table[(codes & 0x7).long()]
    is_negative = (codes & E2M1_SIGN_BIT) != 0
    return torch.where(is_negative, -magnitude, magnitude)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack pairs of codes into bytes, even element in the low nibble (§3.3).

    Args:
        codes: ``[..., n]`` uint8 codes (0..15), ``n`` even.

    Returns:
        ``[..., n / 2]`` uint8 with ``packed[..., j] = codes[..., 2j+1] << 4 | codes[..., 2j]``.
    """
    _check_uint8("codes", codes)
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise ValueError(
            f"pack_e2m1 needs an even last dim (two codes per byte), got shape "
            f"{tuple(codes.shape)}; pad the last dim to an even length"
        )
    low = codes[..., 0::2] & 0xF
    high = codes[..., 1::2] & 0xF
    return low | (high << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Split bytes into codes, low nibble first: ``0x2A -> [0xA, 0x2]``.

    Args:
        packed: ``[..., m]`` uint8.

    Returns:
        ``[..., 2m]`` uint8 codes in 0..15.
    """
    _check_uint8("packed", packed)
    if packed.dim() == 0:
        raise ValueError("unpack_e2m1 needs at least one dim, got a 0-dim tensor")
    low = packed & 0xF
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _check_uint8(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.uint8:
        raise ValueError(f"{name} must be a uint8 tensor of E2M1 codes, got dtype {tensor.dtype}")
