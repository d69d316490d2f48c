"""E2M1 codes: full table, RNE ties, saturation, signed zero, nibble packing (MODEL_SPEC §6.3)."""

import pytest
import torch

from atomk31.quant.e2m1 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1


def e2m1_value_from_bits(code: int) -> float:
    """Independent decode from the bit layout: 1 sign, 2 exponent (bias 1), 1 mantissa."""
    sign = -1.0 if code & 0x8 else 1.0
    exponent = (code >> 1) & 0x3
    mantissa = code & 0x1
    if exponent == 0:
        return sign * mantissa * 0.5  # subnormal: 0.M * 2^(1 - 1)
    return sign * (1.0 + mantissa / 2.0) * 2.0 ** (exponent - 1)


def test_decode_all_16_codes_match_bit_layout() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    decoded = decode_e2m1(codes)
    for code in range(16):
        expected = e2m1_value_from_bits(code)
        assert decoded[code].item() == expected, f"code {code:#x}"
        assert bool(torch.signbit(decoded[code])) == bool(code & 0x8), f"sign of code {code:#x}"
    assert decoded[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize(
    "value, expected_code",
    [(0.25, 0x0), (0.75, 0x2), (1.25, 0x2), (1.75, 0x4), (2.5, 0x4), (3.5, 0x6), (5.0, 0x6)],
)
def test_encode_ties_go_to_even_mantissa(value: float, expected_code: int) -> None:
    x = torch.tensor([value, -value])
    assert encode_e2m1(x).tolist() == [expected_code, expected_code | 0x8]


def test_encode_just_off_midpoints_rounds_to_nearest() -> None:
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    above = torch.nextafter(midpoints, torch.tensor(float("inf")))
    below = torch.nextafter(midpoints, torch.tensor(0.0))
    assert encode_e2m1(above).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert encode_e2m1(below).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_encode_grid_values_round_trip() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_e2m1(decode_e2m1(codes)), codes)


def test_encode_saturates_at_six() -> None:
    x = torch.tensor([6.0, 6.5, 7.0, 100.0, float("inf"), -6.5, -1e30, float("-inf")])
    assert encode_e2m1(x).tolist() == [7, 7, 7, 7, 7, 15, 15, 15]


def test_encode_zero_keeps_sign() -> None:
    x = torch.tensor([0.0, -0.0, 0.1, -0.1, -0.25, 1e-30, -1e-30])
    assert encode_e2m1(x).tolist() == [0x0, 0x8, 0x0, 0x8, 0x8, 0x0, 0x8]


def test_encode_bfloat16_input_and_empty() -> None:
    x = torch.tensor([[1.5, -3.0, 0.7]], dtype=torch.bfloat16)
    assert encode_e2m1(x).tolist() == [[0x3, 0xD, 0x1]]
    assert encode_e2m1(torch.empty(0, 5)).shape == (0, 5)


def test_unpack_hand_built_byte_low_nibble_first() -> None:
    packed = torch.tensor([0x2A], dtype=torch.uint8)
    assert unpack_e2m1(packed).tolist() == [0xA, 0x2]
    assert decode_e2m1(unpack_e2m1(packed)).tolist() == [-1.0, 1.0]


def test_pack_even_element_in_low_nibble() -> None:
    codes = torch.tensor([[0xA, 0x2, 0x7, 0xF]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x2A, 0xF7]]


def test_pack_unpack_round_trip_all_byte_values() -> None:
    packed = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    assert torch.equal(pack_e2m1(unpack_e2m1(packed)), packed)


def test_pack_rejects_odd_length() -> None:
    with pytest.raises(ValueError, match="even last dim"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))


def test_decode_rejects_non_uint8() -> None:
    with pytest.raises(ValueError, match="uint8"):
        decode_e2m1(torch.zeros(3, dtype=torch.int32))
