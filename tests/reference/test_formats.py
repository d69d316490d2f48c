"""The oracle's own number formats: E4M3 rounding, E2M1/E8M0 MXFP4 packing (MODEL_SPEC §6, §9 #7)."""

import pytest
import torch

from atomk31.reference import (
    dequantize_mxfp4,
    fake_quant_fp8_groups,
    fake_quant_mxfp4,
    quantize_mxfp4,
    round_to_e2m1,
    round_to_e4m3,
)
from atomk31.reference.formats import FP8_MAX, e8m0_values, mxfp4_scale_exponents

TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


@pytest.mark.parametrize("variant", ["e4m3fn", "e4m3fnuz"])
def test_round_to_e4m3_matches_torch_float8_cast(variant: str) -> None:
    generator = torch.Generator().manual_seed(0)
    # Magnitudes from deep subnormal to beyond the maximum, plus every grid midpoint near 1.
    exponents = torch.randint(-14, 10, (20000,), generator=generator).float()
    x = torch.randn(20000, generator=generator) * torch.exp2(exponents)
    midpoints = torch.arange(1.0, 2.0, 1 / 16) + 1 / 32
    x = torch.cat([x, midpoints, -midpoints, torch.tensor([0.0, 500.0, -1e6, 2.0**-11])])
    fmax = FP8_MAX[variant]
    expected = x.clamp(-fmax, fmax).to(TORCH_FP8[variant]).float()
    assert torch.equal(round_to_e4m3(x, variant), expected)


def test_round_to_e4m3_ties_to_even_and_saturates() -> None:
    x = torch.tensor([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 460.0, -1000.0])
    assert round_to_e4m3(x, "e4m3fn").tolist() == [1.0, 1.25, 0.0, 2.0**-8, 448.0, -448.0]
    assert round_to_e4m3(torch.tensor([300.0]), "e4m3fnuz").tolist() == [240.0]
    with pytest.raises(ValueError, match="fp8_variant must be one of"):
        round_to_e4m3(x, "e5m2")


def test_round_to_e2m1_ties_from_the_spec() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 7.0, 100.0, -0.25, -5.0])
    assert round_to_e2m1(x).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -0.0, -4.0]


def test_mxfp4_scale_rounds_amax_up_at_mantissa_one_point_seven_five() -> None:
    amax = torch.tensor([6.0, 6.99, 7.0, 1.0, 0.0, 3.5, 2.0**-140])
    # floor(log2 amax) + (mantissa >= 1.75) - 2, amax 0 -> -127, clamped at -127.
    assert mxfp4_scale_exponents(amax).tolist() == [0, 0, 1, -2, -127, 0, -127]


def test_quantize_mxfp4_packs_even_index_in_the_low_nibble() -> None:
    row = torch.zeros(1, 32)
    row[0, 0], row[0, 1], row[0, 2], row[0, 3], row[0, 31] = 0.5, 1.0, -6.0, -0.1, 6.0
    packed, scale = quantize_mxfp4(row)
    assert scale.tolist() == [[127]]                         # amax 6 -> 2**0
    assert packed[0, 0] == 0x21                              # 0.5 -> code 1 low, 1.0 -> code 2 high
    assert packed[0, 1] == 0x8F                              # -6 -> 0xF low, -0.1 -> -0 = 0x8 high (§9 #7)
    assert packed[0, 15] == 0x70                             # index 31 (6.0 -> 7) in the high nibble
    assert dequantize_mxfp4(packed, scale)[0, :4].tolist() == [0.5, 1.0, -6.0, -0.0]


def test_mxfp4_round_trip_is_close_and_idempotent() -> None:
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(1)) * 3.0
    once = fake_quant_mxfp4(x)
    assert torch.equal(fake_quant_mxfp4(once), once)
    block_max = x.view(8, 3, 32).abs().amax(-1, keepdim=True)
    assert bool(((once - x).view(8, 3, 32).abs() <= block_max / 4).all())   # half a step of the coarsest grid


def test_dequantize_mxfp4_reads_e8m0_and_checks_shapes() -> None:
    assert torch.isnan(e8m0_values(torch.tensor([255], dtype=torch.uint8))).all()
    assert e8m0_values(torch.tensor([0, 127, 130], dtype=torch.uint8)).tolist() == [2.0**-127, 1.0, 8.0]
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(2, 2\)"):
        dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))


def test_fake_quant_fp8_groups_uses_one_scale_per_128_values() -> None:
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2))
    x[1, 128:] *= 1000.0                                     # a loud second group must not hurt the first
    rounded = fake_quant_fp8_groups(x)
    for row in range(3):
        for group in range(2):
            piece = slice(128 * group, 128 * group + 128)
            error = (rounded[row, piece] - x[row, piece]).abs().max()
            assert float(error) <= float(x[row, piece].abs().max()) * 2.0**-4
    assert torch.equal(fake_quant_fp8_groups(torch.zeros(1, 128)), torch.zeros(1, 128))   # 1e-4 scale floor
    with pytest.raises(ValueError, match="multiple of 128"):
        fake_quant_fp8_groups(torch.zeros(1, 100))
