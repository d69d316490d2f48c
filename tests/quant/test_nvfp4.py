"""NVFP4: E2M1 in blocks of 16, an E4M3 block scale, an fp32 global scale (MODEL_SPEC §6.4)."""

import pytest
import torch

from atomk31.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4


def test_quantize_hand_worked_block() -> None:
    # Block 0: amax 6 -> s_b = e4m3(6 / 6) = 1; values map straight onto codes:
    #   1.0 -> 0x2, -6.0 -> 0xF, 0.75 (tie) -> 1.0 = 0x2, 2.5 (tie) -> 2.0 = 0x4.
    # Block 1: amax 6.6 -> 6.6 / 6 = 1.1 -> e4m3 1.125 (1.1 is above the 1.0625 midpoint);
    #   6.6 / 1.125 = 5.87 -> 6 = 0x7; -0.3 / 1.125 = -0.267 -> -0.5 = 0x9.
    x = torch.zeros(32)
    x[:4] = torch.tensor([1.0, -6.0, 0.75, 2.5])
    x[16:18] = torch.tensor([6.6, -0.3])
    packed, block_scales = quantize_nvfp4(x)
    assert block_scales.dtype == torch.float8_e4m3fn
    assert block_scales.float().tolist() == [1.0, 1.125]
    assert packed[:2].tolist() == [0xF2, 0x42]
    assert packed[8].item() == 0x97
    restored = dequantize_nvfp4(packed, block_scales)
    assert restored[:4].tolist() == [1.0, -6.0, 1.0, 2.0]
    assert restored[16:18].tolist() == [6.75, -0.5625]


def test_global_scale_divides_out() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 48, generator=generator)
    packed, block_scales = quantize_nvfp4(x, global_scale=1.0)
    packed_scaled, block_scales_scaled = quantize_nvfp4(x * 1024.0, global_scale=1024.0)
    assert torch.equal(packed, packed_scaled) and torch.equal(block_scales, block_scales_scaled)
    assert torch.equal(
        dequantize_nvfp4(packed_scaled, block_scales_scaled, global_scale=1024.0),
        dequantize_nvfp4(packed, block_scales) * 1024.0,
    )


def test_block_scale_definition_and_round_trip_error() -> None:
    generator = torch.Generator().manual_seed(1)
    global_scale = 0.01
    x = torch.randn(4, 7, 64, generator=generator)
    packed, block_scales = quantize_nvfp4(x, global_scale=global_scale)
    blocks = x.reshape(4, 7, 4, 16)
    expected = (blocks.abs().amax(-1) / (6 * global_scale)).clamp(max=448).to(torch.float8_e4m3fn)
    assert torch.equal(block_scales.view(torch.uint8), expected.view(torch.uint8))
    restored = dequantize_nvfp4(packed, block_scales, global_scale=global_scale)
    restored = restored.reshape(4, 7, 4, 16)
    unit = (block_scales.float() * global_scale).unsqueeze(-1)
    # Half the widest grid gap is 1 unit; s_b rounded down by up to 2^-4 clips at most 0.4 unit.
    assert ((restored - blocks).abs() <= unit).all()


def test_zero_and_tiny_blocks_get_zero_scale_and_signed_zero_codes() -> None:
    x = torch.zeros(3, 16)
    x[0, 3] = -0.0
    x[1] = torch.full((16,), -1e-9)  # amax / 6 is below e4m3's smallest subnormal 2^-9
    x[2] = torch.full((16,), 3.0)
    packed, block_scales = quantize_nvfp4(x)
    assert block_scales.float().flatten().tolist() == [0.0, 0.0, 0.5]
    assert packed[0].tolist() == [0x00, 0x80] + [0x00] * 6
    assert (packed[1] == 0x88).all()
    restored = dequantize_nvfp4(packed, block_scales)
    assert not torch.isnan(restored).any()
    assert (restored[:2] == 0).all() and (restored[2] == 3.0).all()


def test_block_scale_saturates_at_448() -> None:
    x = torch.full((16,), 1e5)
    x[0] = -1.0
    packed, block_scales = quantize_nvfp4(x)
    assert block_scales.float().item() == 448.0
    restored = dequantize_nvfp4(packed, block_scales)
    assert restored[1].item() == 6 * 448.0 and restored[0].item() == -0.0


def test_shapes_length_one_bf16_and_empty() -> None:
    packed, block_scales = quantize_nvfp4(torch.full((1, 16), 3.0, dtype=torch.bfloat16))
    assert packed.shape == (1, 8) and block_scales.shape == (1, 1)
    assert dequantize_nvfp4(packed, block_scales, dtype=torch.bfloat16).eq(3.0).all()
    packed, block_scales = quantize_nvfp4(torch.empty(2, 0))
    assert packed.shape == (2, 0) and block_scales.shape == (2, 0)
    assert dequantize_nvfp4(packed, block_scales).shape == (2, 0)


@pytest.mark.parametrize("n", [1, 15, 17, 40])
def test_quantize_rejects_last_dim_not_multiple_of_16(n: int) -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.ones(n))


@pytest.mark.parametrize("global_scale", [0.0, -1.0, float("inf"), float("nan")])
def test_rejects_bad_global_scale(global_scale: float) -> None:
    with pytest.raises(ValueError, match="global_scale must be a positive finite float"):
        quantize_nvfp4(torch.ones(16), global_scale=global_scale)


def test_dequantize_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="8 packed bytes per scale"):
        block_scales = torch.zeros(2, dtype=torch.float8_e4m3fn)
        dequantize_nvfp4(torch.zeros(8, dtype=torch.uint8), block_scales)
    with pytest.raises(ValueError, match="float8_e4m3fn block scales"):
        dequantize_nvfp4(torch.zeros(8, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8))
