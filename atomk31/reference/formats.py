"""Number formats of the oracle: FP8 E4M3 rounding, E2M1/E8M0 (MXFP4) packing (MODEL_SPEC §6).

The oracle carries its own copies of these rules so that it does not share a bug with the
engine's `atomk31.quant`. Every function works on float32 tensors and returns float32 values
that lie exactly on the target grid ("fake quantization"), except the MXFP4 packers, which
produce and consume the checkpoint bytes of §3.3.

Rounding is round-to-nearest-even everywhere; torch.round rounds halves to even, and dividing
by a power of two (torch.ldexp) is exact, so the grids below are hit exactly.
"""

import torch

FP8_VARIANTS = ("e4m3fn", "e4m3fnuz")
# §6.1: largest finite magnitude and exponent bias of each E4M3 variant.
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}
_FP8_BIAS = {"e4m3fn": 7, "e4m3fnuz": 8}
_FP8_MANTISSA_BITS = 3

# §6.3: magnitudes of the eight E2M1 codes (bit 3 of a nibble is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
MXFP4_BLOCK = 32
# §4.6.1 / §9 #4: FP8 index keys and queries use one scale per group of 128 values.
FP8_GROUP = 128
FP8_SCALE_FLOOR = 1e-4


def check_fp8_variant(variant: str) -> None:
    if variant not in FP8_VARIANTS:
        raise ValueError(f"fp8_variant must be one of {FP8_VARIANTS}, got {variant!r}")


def round_to_e4m3(x: torch.Tensor, variant: str = "e4m3fn") -> torch.Tensor:
    """Round fp32 `x` (any shape) to the E4M3 grid of `variant`, RNE, saturating (§6.1).

    Returns float32 values, each exactly representable in the variant. Signs of zeros are
    kept (harmless: every consumer multiplies or adds them).
    """
    check_fp8_variant(variant)
    x = x.float()
    bias = _FP8_BIAS[variant]
    magnitude = x.abs()
    # frexp is exact: magnitude = m * 2**e with m in [0.5, 1), so floor(log2) = e - 1.
    _, exponent = torch.frexp(magnitude)
    # Below the smallest normal (2**(1 - bias)) the grid is uniform (subnormals).
    exponent = torch.clamp(exponent.to(torch.int32) - 1, min=1 - bias)
    step_exponent = exponent - _FP8_MANTISSA_BITS
    rounded = torch.ldexp(torch.round(torch.ldexp(magnitude, -step_exponent)), step_exponent)
    rounded = torch.clamp(rounded, max=FP8_MAX[variant])
    return torch.copysign(rounded, x)


def fake_quant_fp8_groups(x: torch.Tensor, variant: str = "e4m3fn", group_size: int = FP8_GROUP) -> torch.Tensor:
    """Quantize-dequantize `x` [..., n] with one fp32 scale per group of `group_size` values.

    §4.6.1 / §9 #4: `s = max(amax, 1e-4) / fmax`, `x_hat = e4m3_rne_sat(x / s) * s`. Used for
    index keys (one token row) and index queries (one head row). `n` must be a multiple of
    `group_size` (index_head_dim is validated to be a multiple of 128).
    """
    check_fp8_variant(variant)
    if x.shape[-1] % group_size != 0:
        raise ValueError(f"last dim must be a multiple of {group_size}, got shape {tuple(x.shape)}")
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    scale = torch.clamp(amax, min=FP8_SCALE_FLOOR) / FP8_MAX[variant]
    quantized = round_to_e4m3(groups / scale, variant) * scale
    return quantized.reshape(x.shape)


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 `x` to the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} with RNE, saturating at 6.

    The grid step is 0.5 below 2, 1 in [2, 4) and 2 from 4 on; rounding `|x| / step` half to
    even gives the §6.3 ties (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4).
    """
    x = x.float()
    magnitude = x.abs()
    step = torch.where(magnitude < 2.0, 0.5, torch.where(magnitude < 4.0, 1.0, 2.0))
    rounded = torch.clamp(torch.round(magnitude / step) * step, max=E2M1_MAX)
    return torch.copysign(rounded, x)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 in 0..15) of values already on the E2M1 grid.

    §9 #7: a negative value that rounded to 0 keeps its sign bit (code 0x8).
    """
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=x.device)
    matches = x.abs().unsqueeze(-1) == table                 # [..., 8], one True per value
    assert bool(matches.any(dim=-1).all()), "e2m1_codes needs values already on the E2M1 grid"
    magnitude_code = matches.to(torch.uint8).argmax(dim=-1).to(torch.uint8)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return magnitude_code | sign


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of E2M1 codes (uint8, low 4 bits used)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    codes = codes.to(torch.int64)
    magnitude = table[codes & 0x7]
    return torch.where((codes & 0x8) != 0, -magnitude, magnitude)


def e8m0_values(scale_bytes: torch.Tensor) -> torch.Tensor:
    """Float32 value `2**(byte - 127)` of E8M0 bytes; 0xFF is NaN (§6.2)."""
    exponent = scale_bytes.to(torch.int32) - 127
    values = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    return torch.where(scale_bytes.to(torch.int32) == 0xFF, torch.nan, values)


def mxfp4_scale_exponents(amax: torch.Tensor) -> torch.Tensor:
    """Block exponent `e` (int32) of the §6.3 quantizer for block maxima `amax` (fp32).

    `e = floor(log2 amax) + (mantissa >= 1.75) - 2`, exponent taken exactly with frexp (§9 #7);
    `amax == 0` gives -127 (scale byte 0).
    """
    mantissa, exponent = torch.frexp(amax.float())       # amax = mantissa * 2**exponent, mantissa in [0.5, 1)
    floor_log2 = exponent.to(torch.int32) - 1
    rounds_up = (2.0 * mantissa >= 1.75).to(torch.int32)
    e = torch.clamp(floor_log2 + rounds_up - 2, min=-127, max=127)
    return torch.where(amax == 0, torch.full_like(e, -127), e)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `weight` [rows, n] (n a multiple of 32) to MXFP4 checkpoint bytes (§3.3, §6.3).

    Returns `(weight_packed [rows, n/2] uint8, weight_scale [rows, n/32] uint8)`: element
    `2j` in the low nibble of byte `j`, element `2j+1` in the high nibble.
    """
    rows, n = weight.shape
    if n % MXFP4_BLOCK != 0:
        raise ValueError(f"MXFP4 needs an input dim that is a multiple of {MXFP4_BLOCK}, got {n}")
    blocks = weight.float().reshape(rows, n // MXFP4_BLOCK, MXFP4_BLOCK)
    exponents = mxfp4_scale_exponents(blocks.abs().amax(dim=-1))
    values = round_to_e2m1(torch.ldexp(blocks, -exponents.unsqueeze(-1)))
    codes = e2m1_codes(values).reshape(rows, n)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, (exponents + 127).to(torch.uint8)


def dequantize_mxfp4(weight_packed: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Float32 weight [rows, n] from MXFP4 bytes: packed [rows, n/2], scale [rows, n/32] (§3.3)."""
    rows, half = weight_packed.shape
    n = 2 * half
    if weight_scale.shape != (rows, n // MXFP4_BLOCK):
        raise ValueError(
            f"MXFP4 weight_scale must have shape {(rows, n // MXFP4_BLOCK)} for weight_packed "
            f"{tuple(weight_packed.shape)}, got {tuple(weight_scale.shape)}"
        )
    codes = torch.stack([weight_packed & 0x0F, weight_packed >> 4], dim=-1).reshape(rows, n)
    scales = e8m0_values(weight_scale).repeat_interleave(MXFP4_BLOCK, dim=-1)
    return e2m1_values(codes) * scales


def fake_quant_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize `x` [..., n] (n a multiple of 32) through MXFP4 (§6.3), float32."""
    flat = x.float().reshape(-1, x.shape[-1])
    packed, scale = quantize_mxfp4(flat)
    return dequantize_mxfp4(packed, scale).reshape(x.shape)
