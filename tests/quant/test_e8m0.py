"""E8M0 scale bytes: full decode table, edges, exact encode of powers of two (MODEL_SPEC §6.2)."""

import math

import pytest
import torch

from atomk31.quant.e8m0 import e8m0_to_float, float_to_e8m0


def test_decode_all_finite_codes_are_powers_of_two() -> None:
    codes = torch.arange(255, dtype=torch.uint8)
    decoded = e8m0_to_float(codes).double()
    expected = torch.tensor([math.ldexp(1.0, e - 127) for e in range(255)], dtype=torch.float64)
    assert torch.equal(decoded, expected)


def test_decode_edges() -> None:
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    decoded = e8m0_to_float(codes)
    assert decoded.dtype == torch.float32
    assert decoded[:6].double().tolist() == [
        math.ldexp(1.0, -127),
        math.ldexp(1.0, -126),
        0.5,
        1.0,
        2.0,
        math.ldexp(1.0, 127),
    ]
    assert math.isnan(decoded[6].item())


def test_encode_round_trips_every_code() -> None:
    codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    assert torch.equal(float_to_e8m0(e8m0_to_float(codes)), codes)


def test_encode_nan_is_0xff() -> None:
    assert float_to_e8m0(torch.tensor([float("nan"), -float("nan")])).tolist() == [255, 255]


def test_encode_empty() -> None:
    assert float_to_e8m0(torch.empty(0)).shape == (0,)


@pytest.mark.parametrize(
    "value",
    [3.0, 0.0, -0.0, -1.0, float("inf"), math.ldexp(1.0, -128), 1.5, math.ldexp(1.0, -127) * 3],
)
def test_encode_rejects_non_power_of_two(value: float) -> None:
    with pytest.raises(ValueError, match="powers of two in"):
        float_to_e8m0(torch.tensor([1.0, value]))


def test_decode_rejects_non_uint8() -> None:
    with pytest.raises(ValueError, match="uint8"):
        e8m0_to_float(torch.tensor([127], dtype=torch.int32))
