"""MXFP8 (e4m3fn values, E8M0 per 32): hand-worked codes, ties, saturation, zero and NaN blocks,
exact exponents, an independent pure-Python reference (issue #6)."""

import math

import pytest
import torch

from atomk31.quant.mxfp8 import dequantize_mxfp8, mxfp8_scale_exponent, quantize_mxfp8


def e4m3fn_value(code: int) -> float:
    """Value of a non-NaN e4m3fn byte, from the format's definition (bias 7, 3 mantissa bits)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# Non-negative finite codes in increasing value (0x7F is NaN).
POSITIVE_CODES = list(range(0x7F))


def reference_block(values: list[float]) -> tuple[list[int], int]:
    """Independent pure-Python MXFP8 of one block: (value codes, scale byte)."""
    amax = max(abs(v) for v in values)
    if amax == 0:
        exponent = -127
    else:
        _, frexp_exponent = math.frexp(amax)           # amax = m * 2^e, m in [0.5, 1)
        exponent = max(-127, min(127, frexp_exponent - 1 - 8))
    codes = []
    for value in values:
        scaled = min(abs(value) / 2.0**exponent, 448.0)
        distances = [abs(scaled - e4m3fn_value(c)) for c in POSITIVE_CODES]
        nearest = [c for c in POSITIVE_CODES if distances[c] == min(distances)]
        code = nearest[0] if len(nearest) == 1 else next(c for c in nearest if c % 2 == 0)
        codes.append(code | (0x80 if math.copysign(1.0, value) < 0 else 0))
    return codes, exponent + 127


def codes_of(values: torch.Tensor) -> list:
    return values.view(torch.uint8).tolist()


def test_quantize_hand_worked_codes_ties_and_saturation() -> None:
    x = torch.zeros(3, 32)
    # Block 0: amax 256 = 2^8 -> e = 0, scale byte 127; the grid is e4m3fn itself.
    #   1.0625 ties 1.0 / 1.125 -> 1.0 (even mantissa) 0x38; 1.1875 ties 1.125 / 1.25 -> 1.25
    #   0x3A; -3.0 = -1.5 * 2^1 -> 0xC4; 1.5 * 2^-9 ties 2^-9 / 2^-8 (subnormals) -> 0x02;
    #   2^-10 ties 0 / 2^-9 -> 0x00; 256 -> 0x78.
    x[0, :6] = torch.tensor([1.0625, 1.1875, -3.0, 1.5 * 2.0**-9, 2.0**-10, 256.0])
    # Block 1: amax 500 = 1.95 * 2^8 -> e = 0; 460 rounds to 448 (< 464), 470 and 500 clip
    #   to 448 (0x7E), -500 to -448 (0xFE).
    x[1, :4] = torch.tensor([460.0, 470.0, 500.0, -500.0])
    # Block 2: amax 1.0 -> e = -8, scale byte 119; 1.0 -> 256 = 0x78;
    #   -0.75 -> -192 = -1.5 * 2^7 -> 0xF4.
    x[2, :2] = torch.tensor([1.0, -0.75])
    values, scales = quantize_mxfp8(x)
    assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.uint8
    assert scales.tolist() == [[127], [127], [119]]
    assert codes_of(values[0, :6]) == [0x38, 0x3A, 0xC4, 0x02, 0x00, 0x78]
    assert codes_of(values[1, :4]) == [0x7E, 0x7E, 0x7E, 0xFE]
    assert codes_of(values[2, :2]) == [0x78, 0xF4]
    restored = dequantize_mxfp8(values, scales)
    assert restored[1, :4].tolist() == [448.0, 448.0, 448.0, -448.0]
    assert restored[2, :2].tolist() == [1.0, -0.75]


def test_zero_block_gets_scale_byte_0_and_keeps_signed_zeros() -> None:
    x = torch.zeros(64)
    x[1] = -0.0
    x[40] = 3.0
    values, scales = quantize_mxfp8(x)
    assert scales.tolist() == [0, 120]                # 3.0 = 1.5 * 2^1 -> e = 1 - 8 = -7
    assert codes_of(values[:2]) == [0x00, 0x80]
    restored = dequantize_mxfp8(values, scales)
    assert (restored[:32] == 0).all() and restored[40].item() == 3.0


def test_nan_or_inf_block_dequantizes_to_nan_only_in_its_block() -> None:
    x = torch.ones(3, 32)
    x[0, 5] = float("nan")
    x[1, 7] = -float("inf")
    values, scales = quantize_mxfp8(x)
    assert scales[:, 0].tolist() == [0xFF, 0xFF, 119]
    restored = dequantize_mxfp8(values, scales)
    assert torch.isnan(restored[:2]).all() and (restored[2] == 1.0).all()


@pytest.mark.parametrize("amax, exponent", [
    (448.0, 0), (256.0, 0), (511.9, 0), (512.0, 1), (1.0, -8), (1.75 * 2.0**-10, -18),
    (0.0, -127), (1e-45, -127), (2.0**-118, -126), (2.0**-120, -127), (3.0e38, 119)])
def test_scale_exponent_is_floor_log2_minus_8_clamped(amax: float, exponent: int) -> None:
    assert mxfp8_scale_exponent(torch.tensor([amax])).item() == exponent


def test_scale_exponent_is_exact_just_below_a_power_of_two() -> None:
    # log2 of the largest float32 below 2^20 rounds to 20.0 in float32; the exact floor is 19.
    just_below = torch.nextafter(torch.tensor([2.0**20]), torch.tensor([0.0]))
    assert mxfp8_scale_exponent(just_below).item() == 19 - 8


def test_quantize_matches_independent_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 64, generator=generator) * torch.logspace(-4, 4, 4).reshape(1, 4, 1)
    x[0, 0, :32] *= 500.0 / x[0, 0, :32].abs().max()     # a block that saturates
    x[1, 1, 32:] = 0.0                                     # a zero block
    values, scales = quantize_mxfp8(x)
    for block, (codes, scale) in enumerate(map(reference_block, x.reshape(-1, 32).tolist())):
        assert codes_of(values.reshape(-1, 32)[block]) == codes, f"block {block}"
        assert scales.reshape(-1)[block].item() == scale, f"block {block}"


def test_round_trip_error_within_half_an_e4m3_step() -> None:
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(1))
    values, scales = quantize_mxfp8(x)
    restored = dequantize_mxfp8(values, scales, dtype=torch.float64)
    step = torch.repeat_interleave(2.0 ** (scales.double() - 127), 32, dim=-1)
    # e4m3 relative step 2^-3 in a binade, absolute 2^-9 among subnormals (both times 2^e);
    # values past 448 * 2^e saturate.
    bound = torch.maximum(x.double().abs() * 2.0**-4, step * 2.0**-10)
    bound = torch.maximum(bound, x.double().abs() - 448.0 * step)
    assert ((restored - x.double()).abs() <= bound).all()


def test_bad_shapes_and_dtypes_are_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of 32 .* got shape \\(2, 40\\)"):
        quantize_mxfp8(torch.zeros(2, 40))
    with pytest.raises(ValueError, match="expects a float tensor, got dtype torch.int32"):
        quantize_mxfp8(torch.zeros(32, dtype=torch.int32))
    values, scales = quantize_mxfp8(torch.ones(2, 64))
    with pytest.raises(ValueError, match="float8_e4m3fn values and uint8 E8M0 scales"):
        dequantize_mxfp8(values.float(), scales)
    with pytest.raises(ValueError, match=r"values \[\.\.\., n\] and scales \[\.\.\., n/32\]"):
        dequantize_mxfp8(values, scales[:, :1])
