"""FP8 E4M3 fn/fnuz: code tables, RNE, saturation, scales, fn -> fnuz (MODEL_SPEC §6.1, §6.5)."""

import math

import pytest
import torch

from atomk31.quant.fp8 import (
    convert_e4m3fn_to_e4m3fnuz,
    decode_e4m3,
    dequantize_fp8,
    dequantize_fp8_per_group,
    encode_e4m3,
    fp8_dtype,
    fp8_max,
    quantize_fp8,
    quantize_fp8_per_group,
    quantize_fp8_per_row,
    quantize_fp8_per_tensor,
)

VARIANTS = ("e4m3fn", "e4m3fnuz")


def e4m3_value_from_bits(code: int, variant: str) -> float:
    """Independent decode from the bit layout (1 sign, 4 exponent, 3 mantissa bits)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    if variant == "e4m3fn":
        bias = 7
        if exponent == 0xF and mantissa == 0x7:
            return math.nan
    else:
        bias = 8
        if code == 0x80:
            return math.nan
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0 ** (1 - bias)
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - bias)


def positive_finite_values(variant: str) -> torch.Tensor:
    """All distinct finite values >= 0 of ``variant``, ascending, from the independent table."""
    values = {e4m3_value_from_bits(code, variant) for code in range(128)}
    return torch.tensor(sorted(v for v in values if not math.isnan(v)), dtype=torch.float64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_all_256_codes_match_bit_layout(variant: str) -> None:
    decoded = decode_e4m3(torch.arange(256, dtype=torch.uint8), variant)
    for code in range(256):
        expected = e4m3_value_from_bits(code, variant)
        got = decoded[code].item()
        if math.isnan(expected):
            assert math.isnan(got), f"{variant} code {code:#x}: expected NaN, got {got}"
        else:
            assert got == expected, f"{variant} code {code:#x}: expected {expected}, got {got}"
    # Signed zero: fn 0x80 is -0.0; fnuz has no -0 (0x80 is NaN).
    assert variant != "e4m3fn" or bool(torch.signbit(decoded[0x80]))


def test_table_edges_match_spec() -> None:
    assert fp8_max("e4m3fn") == 448.0 and fp8_max("e4m3fnuz") == 240.0
    fn = decode_e4m3(torch.tensor([0x7E, 0x08, 0x01, 0x7F, 0xFF], dtype=torch.uint8), "e4m3fn")
    assert fn[:3].tolist() == [448.0, 2.0**-6, 2.0**-9]
    assert torch.isnan(fn[3:]).all()
    fnuz = decode_e4m3(torch.tensor([0x7F, 0x08, 0x01, 0x80], dtype=torch.uint8), "e4m3fnuz")
    assert fnuz[:3].tolist() == [240.0, 2.0**-7, 2.0**-10]
    assert torch.isnan(fnuz[3])


def test_fnuz_is_half_of_fn_for_every_other_pattern() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    keep = (codes != 0x80) & (codes != 0x7F) & (codes != 0xFF)  # fnuz NaN, fn NaNs
    fn = decode_e4m3(codes[keep], "e4m3fn")
    fnuz = decode_e4m3(codes[keep], "e4m3fnuz")
    assert torch.equal(fnuz, fn / 2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cast_rounds_to_nearest_even_at_every_midpoint(variant: str) -> None:
    values = positive_finite_values(variant)
    low, high = values[:-1], values[1:]
    midpoints = ((low + high) / 2).float()  # exact: midpoints need one more bit than e4m3
    low_codes = encode_e4m3(low.float(), variant)
    high_codes = encode_e4m3(high.float(), variant)
    expected = torch.where(low_codes % 2 == 0, low_codes, high_codes)  # even mantissa wins
    assert torch.equal(encode_e4m3(midpoints, variant), expected)
    # Negative midpoints: the same magnitudes with the sign bit, except that fnuz has no -0.
    negative_expected = expected | 0x80
    if variant == "e4m3fnuz":
        negative_expected = torch.where(expected == 0, expected, negative_expected)
    assert torch.equal(encode_e4m3(-midpoints, variant), negative_expected)
    inf = torch.tensor(float("inf"))
    above = torch.nextafter(midpoints, inf)
    below = torch.nextafter(midpoints, -inf)
    assert torch.equal(encode_e4m3(above, variant), high_codes)
    assert torch.equal(encode_e4m3(below, variant), low_codes)


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantize_saturates(variant: str) -> None:
    fmax = fp8_max(variant)
    x = torch.tensor([fmax * 1.0001, fmax + 16, 1e6, float("inf"), -1e6, float("-inf")])
    assert quantize_fp8(x, 1.0, variant).float().tolist() == [fmax] * 4 + [-fmax] * 2
    # Through a scale: x / s beyond max saturates too.
    assert quantize_fp8(torch.tensor([1000.0]), 2.0, variant).float().item() == fmax


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantize_nan_and_negative_zero(variant: str) -> None:
    q = quantize_fp8(torch.tensor([float("nan"), -0.0]), 1.0, variant)
    assert torch.isnan(q.float()[0])
    assert q.view(torch.uint8)[1].item() == (0x80 if variant == "e4m3fn" else 0x00)


def test_quantize_rejects_unknown_variant() -> None:
    with pytest.raises(ValueError, match="FP8 variant must be one of"):
        quantize_fp8(torch.ones(2), 1.0, "e5m2")
    with pytest.raises(ValueError, match="FP8 variant must be one of"):
        fp8_max("fp8")


def test_dequantize_rejects_bytes() -> None:
    with pytest.raises(ValueError, match="decode_e4m3"):
        dequantize_fp8(torch.zeros(3, dtype=torch.uint8), 1.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_row_matches_definition_and_round_trips(variant: str) -> None:
    generator = torch.Generator().manual_seed(0)
    row_magnitudes = torch.tensor([[1e-3], [1.0], [300.0], [0.0], [7.0]])
    x = torch.randn(5, 37, generator=generator) * row_magnitudes
    q, scales = quantize_fp8_per_row(x, variant)
    fmax = fp8_max(variant)
    amax = x.abs().amax(dim=-1)
    assert scales.shape == (5,) and q.shape == (5, 37) and q.dtype == fp8_dtype(variant)
    assert torch.equal(scales, amax.clamp_min(1e-12) / fmax)
    assert torch.equal(q.float(), (x / scales[:, None]).clamp(-fmax, fmax).to(q.dtype).float())
    # Each nonzero row's largest element lands on +-max.
    rows = torch.tensor([0, 1, 2, 4])
    top = x[rows].abs().argmax(dim=-1)
    assert (q.float()[rows, top].abs() == fmax).all()
    # Error: half an ulp (2^-4 relative for normals), or half the smallest subnormal.
    min_subnormal = 2.0**-9 if variant == "e4m3fn" else 2.0**-10
    error = (dequantize_fp8(q, scales[:, None]) - x).abs()
    bound = torch.maximum(x.abs() * 2.0**-4, scales[:, None] * min_subnormal / 2)
    assert (error <= bound * (1 + 1e-6)).all()
    assert (q.float()[3] == 0).all()


def test_per_row_length_one_and_empty() -> None:
    q, scales = quantize_fp8_per_row(torch.tensor([[-3.0]]))
    assert q.float().item() == -448.0 and scales.item() == pytest.approx(3.0 / 448)
    q, scales = quantize_fp8_per_row(torch.empty(4, 0))
    assert q.shape == (4, 0) and scales.shape == (4,)
    q, scales = quantize_fp8_per_row(torch.empty(0, 8))
    assert q.shape == (0, 8) and scales.shape == (0,)


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_group_scales_each_group(variant: str) -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 256, generator=generator)
    x[1, 0, :128] = 0.0  # an all-zero group takes the floor
    q, scales = quantize_fp8_per_group(x, 128, variant, min_amax=1e-4)
    assert q.shape == x.shape and scales.shape == (3, 2, 2)
    expected_scales = x.reshape(3, 2, 2, 128).abs().amax(-1).clamp_min(1e-4) / fp8_max(variant)
    assert torch.equal(scales, expected_scales)
    assert scales[1, 0, 0].item() == pytest.approx(1e-4 / fp8_max(variant))
    restored = dequantize_fp8_per_group(q, scales, 128)
    assert (restored - x).abs().max() <= x.abs().max() * 2.0**-4


def test_per_group_rejects_non_multiple() -> None:
    with pytest.raises(ValueError, match="dividing the last dim"):
        quantize_fp8_per_group(torch.ones(2, 100), 128, "e4m3fn", min_amax=1e-4)
    with pytest.raises(ValueError, match="equal leading dims"):
        q = torch.zeros(2, 128, dtype=torch.float8_e4m3fn)
        dequantize_fp8_per_group(q, torch.ones(2, 2), 128)


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_tensor(variant: str) -> None:
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q, scale = quantize_fp8_per_tensor(x, variant, min_amax=1e-12)
    assert scale.dim() == 0 and torch.equal(scale, torch.tensor(2.0) / fp8_max(variant))
    assert q.float()[0, 1].item() == -fp8_max(variant)
    q, scale = quantize_fp8_per_tensor(torch.empty(0), variant, min_amax=1e-12)
    assert q.shape == (0,) and scale.item() == pytest.approx(1e-12 / fp8_max(variant))


def test_convert_fn_to_fnuz_preserves_every_finite_value() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    finite = (codes != 0x7F) & (codes != 0xFF)
    q_fn = codes[finite].view(torch.float8_e4m3fn)
    scale = torch.tensor(0.37)
    q_fnuz, scale_fnuz = convert_e4m3fn_to_e4m3fnuz(q_fn, scale)
    assert q_fnuz.dtype == torch.float8_e4m3fnuz
    assert scale_fnuz.item() == pytest.approx(0.74)
    # Same bytes except fn's -0 (0x80), which must not become fnuz NaN.
    expected_bytes = torch.where(codes[finite] == 0x80, 0, codes[finite]).to(torch.uint8)
    assert torch.equal(q_fnuz.view(torch.uint8), expected_bytes)
    assert torch.equal(dequantize_fp8(q_fnuz, scale_fnuz), dequantize_fp8(q_fn, scale))


def test_convert_rejects_fnuz_input() -> None:
    with pytest.raises(ValueError, match="float8_e4m3fn data"):
        convert_e4m3fn_to_e4m3fnuz(torch.zeros(2, dtype=torch.float8_e4m3fnuz), 1.0)


def _available_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _available_devices())
def test_divide_exactly_is_correctly_rounded_where_the_reciprocal_is_not(device):
    """x / 448 rounded once (from float64) — including values where multiplying by the rounded
    reciprocal, what CUDA does for a host-scalar divisor, is one ulp off."""
    from atomk31.quant.fp8 import divide_exactly

    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 1000
    exact = (x.double() / 448).float()
    by_reciprocal = x * torch.tensor(1 / 448, dtype=torch.float32)
    assert not torch.equal(by_reciprocal, exact), "the sample must contain reciprocal misses"
    got = divide_exactly(x.to(device), 448.0).cpu()
    assert torch.equal(got, exact)
