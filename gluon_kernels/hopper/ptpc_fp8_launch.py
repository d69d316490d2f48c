"""The hopper target's PTPC-FP8 linear (MODEL_SPEC §6.5): ``ptpc_linear`` and
``ptpc_linear_quantized`` (contracts and argument checks: atomk31/ops/linear.py) on the Gluon
kernel of ptpc_fp8.py, for the calls the registry sends it: 128 rows or more with N >= 1024
(ops/linear.py's "small_gemm" and "large_gemm" classes). The activations are quantized by the
Triton quantizer, the one every target shares.

Tiles per call, by the number of 128 x 128 output tiles against the SM count (the rules; the
measurements behind them: benchmarks/NOTES.md, "PTPC: the Gluon kernel's tiles"):

* one wave or more: 128 x 128 tiles in 4 stages, each tile's epilogue under the next tile's
  first wgmma; without that overlap below K = 1024 (a K loop of 4 tiles or fewer is too short
  to hide the store under);
* 0.7 of a wave to one: 128 x 128 tiles in 6 stages, no overlap (there is no next tile to hide
  it under, and fewer SMs pull the weights, so each needs more bytes in flight);
* fewer: 128 x 64 tiles in 6 stages (twice the tiles).

Six stages fit beside a bf16 / fp16 output tile in Hopper's shared memory, five beside a
float32 one (``stages_that_fit``).
"""

import dataclasses

import torch
import triton

from atomk31.triton_kernels.ptpc_fp8 import ptpc_quantize_triton
from gluon_kernels.hopper.ptpc_fp8 import (
    BLOCK_M, MAX_SHARED_BYTES, HopperGemmConfig, ptpc_gemm_hopper, shared_bytes, sm_count,
)

WIDE_CONFIG = HopperGemmConfig(block_n=128, num_stages=4, overlap_epilogue=True)
SHORT_K_CONFIG = HopperGemmConfig(block_n=128, num_stages=4)
ONE_WAVE_CONFIG = HopperGemmConfig(block_n=128, num_stages=6)
NARROW_CONFIG = HopperGemmConfig(block_n=64, num_stages=6)
# K from which the overlapped epilogue pays, and the fraction of a wave from which the 128-column
# tiles are kept.
OVERLAP_MIN_K = 1024
MIN_WAVE_FRACTION = 0.7


def pick_hopper_config(m: int, n: int, k: int, num_sms: int,
                       out_dtype: torch.dtype = torch.bfloat16) -> HopperGemmConfig:
    """The tiles of an [m, k] x [n, k] GEMM on ``num_sms`` SMs (module docstring)."""
    wide_tiles = triton.cdiv(m, BLOCK_M.value) * triton.cdiv(n, 128)
    if wide_tiles >= num_sms:
        config = WIDE_CONFIG if k >= OVERLAP_MIN_K else SHORT_K_CONFIG
    elif wide_tiles >= MIN_WAVE_FRACTION * num_sms:
        config = ONE_WAVE_CONFIG
    else:
        config = NARROW_CONFIG
    return stages_that_fit(config, out_dtype)


def stages_that_fit(config: HopperGemmConfig, out_dtype: torch.dtype) -> HopperGemmConfig:
    """``config`` with its ring cut to the stages that fit beside the output tile."""
    size = torch.empty((), dtype=out_dtype).element_size()
    stages = config.num_stages
    while stages > 2 and shared_bytes(config.block_n, stages, size) > MAX_SHARED_BYTES:
        stages -= 1
    return config if stages == config.num_stages else \
        dataclasses.replace(config, num_stages=stages)


def ptpc_linear_quantized_hopper(
    x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16, config: HopperGemmConfig | None = None,
) -> torch.Tensor:
    """x_q: [..., K] e4m3fn; x_scale: fp32 [...]; w_q: [N, K] e4m3fn; w_scale: fp32 [N]
    -> [..., N] in out_dtype. ``config``: the tiles (None: ``pick_hopper_config``). K must be
    a multiple of 16 and N times the output's element size a multiple of 16 bytes (TMA rows);
    ValueError otherwise."""
    n, k = w_q.shape
    a = x_q.reshape(-1, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    m = a.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if config is None:
        config = pick_hopper_config(m, n, k, sm_count(a.device.index or 0), out_dtype)
    ptpc_gemm_hopper(a, w_q.contiguous(), x_scale.reshape(-1).float().contiguous(),
                     w_scale.float().contiguous(), c, config)
    return c.view(*x_q.shape[:-1], n)


def ptpc_linear_hopper(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                       config: HopperGemmConfig | None = None) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x.dtype: the Triton per-token quantizer, then the Gluon GEMM
    (``config`` as in ``ptpc_linear_quantized_hopper``)."""
    x_q, x_scale = ptpc_quantize_triton(x, w_q.dtype)
    return ptpc_linear_quantized_hopper(x_q, x_scale, w_q, w_scale, x.dtype, config)
