"""The hopper target's PTPC-FP8 op launchers (gluon_kernels/hopper/ptpc_fp8_launch.py): the tile
table on CPU (no device needed: it reads M, N, K, the SM count and the output dtype), and on
an sm_90 GPU (``-m gpu``) the op's contract through ``ptpc_linear_hopper``."""

import pytest
import torch

from gluon_kernels.hopper.ptpc_fp8 import HopperGemmConfig
from gluon_kernels.hopper.ptpc_fp8_launch import (
    NARROW_CONFIG, ONE_WAVE_CONFIG, SHORT_K_CONFIG, WIDE_CONFIG, pick_hopper_config,
    stages_that_fit,
)

H200_SMS = 132


@pytest.mark.parametrize("m, n, k, expected", [
    (4096, 7168, 12288, WIDE_CONFIG),       # o_proj prefill: 1792 tiles of 128 x 128
    (128, 36864, 7168, WIDE_CONFIG),        # kda qkv: 288 tiles
    (128, 18432, 1536, WIDE_CONFIG),        # q_b: 144 tiles
    (4096, 24576, 512, SHORT_K_CONFIG),     # kv_b: K = 512, 4 K tiles a tile: no overlap
    (256, 7168, 6144, ONE_WAVE_CONFIG),     # shared down: 112 tiles, under 132 SMs
    (128, 12288, 7168, ONE_WAVE_CONFIG),    # shared gate_up: 96 tiles
    (128, 7168, 12288, NARROW_CONFIG),      # o_proj: 56 tiles of 128 x 128, 112 of 128 x 64
    (128, 1024, 4096, NARROW_CONFIG),       # 8 tiles: the narrow tiles, the most there are
], ids=["o_proj-4096", "kda-qkv-128", "q_b-128", "kv_b-4096", "down-256", "gate_up-128",
        "o_proj-128", "small"])
def test_tile_table_by_waves_of_128_by_128_tiles(m, n, k, expected):
    assert pick_hopper_config(m, n, k, H200_SMS) == expected


def test_six_stages_fit_beside_a_16_bit_output_tile_only():
    assert pick_hopper_config(128, 12288, 7168, H200_SMS, torch.bfloat16).num_stages == 6
    assert pick_hopper_config(128, 12288, 7168, H200_SMS, torch.float32).num_stages == 5
    # the 128 x 64 tiles leave room for 6 stages beside a float32 tile too
    assert stages_that_fit(NARROW_CONFIG, torch.float32) == NARROW_CONFIG
    assert stages_that_fit(WIDE_CONFIG, torch.float32) == WIDE_CONFIG
    assert stages_that_fit(HopperGemmConfig(num_stages=6), torch.float32).num_stages == 5


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.hip is None and
                         torch.cuda.get_device_capability()[0] == 9),
                    reason="needs an NVIDIA sm_90 GPU (wgmma, TMA)")
def test_ptpc_linear_hopper_keeps_leading_dims_and_matches_the_torch_op_gpu():
    from atomk31.ops.linear import ptpc_linear_torch
    from atomk31.quant.ptpc import quantize_weight_ptpc
    from gluon_kernels.hopper.ptpc_fp8_launch import ptpc_linear_hopper

    generator = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 150, 1024, device="cuda", generator=generator).bfloat16()
    w_q, w_scale = quantize_weight_ptpc(torch.randn(2048, 1024, device="cuda",
                                                    generator=generator).bfloat16())
    y = ptpc_linear_hopper(x, w_q, w_scale)
    expected = ptpc_linear_torch(x, w_q, w_scale)
    assert y.shape == (2, 150, 2048) and y.dtype == torch.bfloat16
    error = ((y.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    assert error <= 2 ** -7, f"relative error {error:.3g}: more than bf16 rounding of both"
