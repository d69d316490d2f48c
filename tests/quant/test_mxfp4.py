"""MXFP4: hand-worked bytes, both scale rules, exact exponents, round trips (§3.3, §6.3)."""

import math

import pytest
import torch

from atomk31.quant.mxfp4 import dequantize_mxfp4, mxfp4_scale_exponent, quantize_mxfp4

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def reference_block(values: list[float], scale_rule: str) -> tuple[list[int], int]:
    """Independent pure-Python MXFP4 of one block: (codes, scale byte)."""
    amax = max(abs(v) for v in values)
    if amax == 0:
        exponent = -127
    else:
        mantissa, frexp_exponent = math.frexp(amax)  # amax = mantissa * 2^e, mantissa in [0.5, 1)
        exponent = frexp_exponent - 1 - 2
        if scale_rule == "round_up" and 2 * mantissa >= 1.75:
            exponent += 1
        exponent = max(-127, min(127, exponent))
    codes = []
    for value in values:
        scaled = abs(value) / 2.0**exponent
        # Nearest grid point; on a tie the even index (mantissa bit 0); above 6 saturates.
        distances = [abs(scaled - g) for g in GRID]
        nearest = [i for i, d in enumerate(distances) if d == min(distances)]
        index = nearest[0] if len(nearest) == 1 else next(i for i in nearest if i % 2 == 0)
        codes.append(index | (0x8 if math.copysign(1.0, value) < 0 else 0))
    return codes, exponent + 127


def reference_quantize(x: torch.Tensor, scale_rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x.reshape(-1, 32).tolist()
    all_codes, scales = [], []
    for row in rows:
        codes, scale = reference_block(row, scale_rule)
        all_codes.extend(codes)
        scales.append(scale)
    codes_tensor = torch.tensor(all_codes, dtype=torch.uint8).reshape(-1, 2)
    packed = codes_tensor[:, 0] | (codes_tensor[:, 1] << 4)
    scales_tensor = torch.tensor(scales, dtype=torch.uint8)
    return packed.reshape(*x.shape[:-1], -1), scales_tensor.reshape(*x.shape[:-1], -1)


def hand_example() -> torch.Tensor:
    """Two blocks, worked out by hand in test_quantize_hand_worked_bytes."""
    x = torch.zeros(2, 32)
    x[0, :4] = torch.tensor([1.0, -3.0, 0.7, 5.5])
    x[1, :4] = torch.tensor([7.0, -0.25, 1.5, 2.5])
    return x


def test_quantize_hand_worked_bytes_round_up() -> None:
    # Block 0: amax 5.5 = 1.375 * 2^2 -> e = 2 - 2 = 0, scale byte 127.
    #   1.0 -> 0x2; -3.0 -> 0xD; 0.7 (< 0.75) -> 0.5 = 0x1; 5.5 (> 5) -> 6 = 0x7.
    #   bytes: 0xD << 4 | 0x2 = 0xD2, 0x7 << 4 | 0x1 = 0x71.
    # Block 1: amax 7.0 = 1.75 * 2^2 -> rounds up: e = 2 + 1 - 2 = 1, scale byte 128.
    #   7/2 = 3.5 (tie) -> 4 = 0x6; -0.25/2 = -0.125 -> -0 = 0x8; 1.5/2 = 0.75 (tie) -> 1 = 0x2;
    #   2.5/2 = 1.25 (tie) -> 1 = 0x2. bytes: 0x86, 0x22.
    packed, scales = quantize_mxfp4(hand_example(), "round_up")
    assert scales.tolist() == [[127], [128]]
    assert packed[:, :2].tolist() == [[0xD2, 0x71], [0x86, 0x22]]
    assert (packed[:, 2:] == 0).all()
    restored = dequantize_mxfp4(packed, scales)[:, :4]
    assert restored.tolist() == [[1.0, -3.0, 0.5, 6.0], [8.0, -0.0, 2.0, 2.0]]


def test_quantize_hand_worked_bytes_floor() -> None:
    # Block 1 under pure OCP: e = 2 - 2 = 0, scale byte 127. 7.0 saturates to 6 = 0x7;
    # -0.25 (tie) -> -0 = 0x8; 1.5 -> 0x3; 2.5 (tie) -> 2 = 0x4. bytes: 0x87, 0x43.
    packed, scales = quantize_mxfp4(hand_example(), "floor")
    assert scales.tolist() == [[127], [127]]
    assert packed[:, :2].tolist() == [[0xD2, 0x71], [0x87, 0x43]]


@pytest.mark.parametrize(
    "amax, round_up_exponent, floor_exponent",
    [
        (7.0, 1, 0),  # mantissa 1.75: rules differ
        (1.75 * 2.0**-10, -11, -12),
        (1.9 * 2.0**20, 19, 18),
        (5.5, 0, 0),  # mantissa 1.375: rules agree
        (4.0, 0, 0),  # exact power of two
        (1.7499999, -2, -2),
        (0.5, -3, -3),
    ],
)
def test_scale_rules_differ_only_at_mantissa_1_75(
    amax: float, round_up_exponent: int, floor_exponent: int
) -> None:
    amax_tensor = torch.tensor([amax])
    assert mxfp4_scale_exponent(amax_tensor, "round_up").item() == round_up_exponent
    assert mxfp4_scale_exponent(amax_tensor, "floor").item() == floor_exponent


def test_scale_exponent_is_exact_just_below_a_power_of_two() -> None:
    # log2 of the largest float32 below 2^20 is 20 - 8.6e-8, which rounds to 20.0 in float32;
    # the exact floor is 19. Exponent bits must give 19 - 2.
    just_below = torch.nextafter(torch.tensor([2.0**20]), torch.tensor([0.0]))
    assert mxfp4_scale_exponent(just_below, "floor").item() == 17
    assert mxfp4_scale_exponent(just_below, "round_up").item() == 18
    just_below_1_75 = torch.nextafter(torch.tensor([1.75]), torch.tensor([0.0]))
    assert mxfp4_scale_exponent(just_below_1_75, "round_up").item() == -2
    assert mxfp4_scale_exponent(torch.tensor([1.75]), "round_up").item() == -1


def test_scale_exponent_edges() -> None:
    amax = torch.tensor([0.0, 1e-45, 2.0**-126, 2.0**-120, 3.0e38])
    assert mxfp4_scale_exponent(amax, "round_up").tolist() == [-127, -127, -127, -122, 126]
    assert mxfp4_scale_exponent(amax, "floor").tolist() == [-127, -127, -127, -122, 125]


@pytest.mark.parametrize("scale_rule", ["round_up", "floor"])
def test_quantize_matches_independent_reference(scale_rule: str) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 64, generator=generator) * torch.logspace(-3, 3, 4).reshape(1, 4, 1)
    x[0, 0, :32] *= 7.0 / x[0, 0, :32].abs().max()  # a block with amax exactly 7
    x[2, 3, 32:] = torch.tensor([0.25, -0.75, 1.25, -1.75, 2.5, -3.5, 5.0, -6.5] * 4)  # ties
    packed, scales = quantize_mxfp4(x, scale_rule)
    expected_packed, expected_scales = reference_quantize(x, scale_rule)
    assert torch.equal(scales, expected_scales)
    assert torch.equal(packed, expected_packed)


@pytest.mark.parametrize("scale_rule", ["round_up", "floor"])
def test_largest_scaled_magnitude_range(scale_rule: str) -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=generator) * torch.logspace(-20, 20, 256).unsqueeze(1)
    _, scales = quantize_mxfp4(x, scale_rule)
    largest = x.abs().amax(dim=-1) / 2.0 ** (scales.squeeze(-1).double() - 127)
    low, high = (3.5, 7.0) if scale_rule == "round_up" else (4.0, 8.0)
    assert (largest >= low).all() and (largest < high).all()


@pytest.mark.parametrize("scale_rule", ["round_up", "floor"])
def test_round_trip_error_and_idempotence(scale_rule: str) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(5, 96, generator=generator)
    packed, scales = quantize_mxfp4(x, scale_rule)
    restored = dequantize_mxfp4(packed, scales)
    block_scale = (2.0 ** (scales.double() - 127)).repeat_interleave(32, dim=-1)
    # Half the widest grid gap (2) is 1 scale unit; clipping in (6, 8) also stays under 2.
    assert ((restored - x).abs() <= block_scale * (1.0 if scale_rule == "round_up" else 2.0)).all()
    again_packed, again_scales = quantize_mxfp4(restored, scale_rule)
    assert torch.equal(again_packed, packed) and torch.equal(again_scales, scales)


def test_zero_blocks_and_negative_zero() -> None:
    x = torch.zeros(1, 64)
    x[0, 1] = -0.0
    x[0, 32:] = -0.0
    packed, scales = quantize_mxfp4(x)
    assert scales.tolist() == [[0, 0]]
    assert packed[0, 0].item() == 0x80  # element 1 (high nibble) is -0
    assert (packed[0, 16:] == 0x88).all()
    restored = dequantize_mxfp4(packed, scales)
    assert (restored == 0).all() and torch.signbit(restored[0, 32:]).all()


def test_nonfinite_block_gets_nan_scale() -> None:
    x = torch.ones(3, 32)
    x[0, 5] = float("nan")
    x[1, 7] = float("-inf")
    packed, scales = quantize_mxfp4(x)
    assert scales.flatten().tolist() == [255, 255, 125]
    restored = dequantize_mxfp4(packed, scales)
    assert torch.isnan(restored[:2]).all() and (restored[2] == 1.0).all()


def test_dequantize_hand_built_bytes() -> None:
    packed = torch.zeros(1, 16, dtype=torch.uint8)
    packed[0, 0] = 0x2A  # element 0 = code 0xA (-1.0), element 1 = code 0x2 (1.0)
    packed[0, 15] = 0xF7  # element 30 = 6.0, element 31 = -6.0
    scales = torch.tensor([[126]], dtype=torch.uint8)  # 2^-1
    restored = dequantize_mxfp4(packed, scales)
    assert restored[0, :2].tolist() == [-0.5, 0.5]
    assert restored[0, 30:].tolist() == [3.0, -3.0]
    assert dequantize_mxfp4(packed, scales, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_shapes_leading_dims_bf16_and_empty() -> None:
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    packed, scales = quantize_mxfp4(x)
    assert packed.shape == (2, 3, 32) and scales.shape == (2, 3, 2)
    assert dequantize_mxfp4(packed, scales).shape == (2, 3, 64)
    packed, scales = quantize_mxfp4(torch.empty(4, 0))
    assert packed.shape == (4, 0) and scales.shape == (4, 0)
    assert dequantize_mxfp4(packed, scales).shape == (4, 0)
    packed, scales = quantize_mxfp4(torch.ones(1, 32))
    assert scales.tolist() == [[125]] and dequantize_mxfp4(packed, scales).eq(1.0).all()


@pytest.mark.parametrize("n", [1, 31, 33, 48])
def test_quantize_rejects_last_dim_not_multiple_of_32(n: int) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.ones(2, n))


def test_rejects_unknown_rule_and_bad_dequantize_inputs() -> None:
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        quantize_mxfp4(torch.ones(32), scale_rule="nearest")
    with pytest.raises(ValueError, match="16 packed bytes per scale"):
        packed = torch.zeros(2, 16, dtype=torch.uint8)
        dequantize_mxfp4(packed, torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(torch.zeros(16, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32))
