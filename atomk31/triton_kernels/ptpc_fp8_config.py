"""Tile choice of the Triton PTPC-FP8 pointer GEMM (``ptpc_fp8.ptpc_gemm_kernel``; MODEL_SPEC
§6.5): one config per class of M in an explicit table, per target, no autotuning.

The rules, each with its reason (the measurements behind them: benchmarks/NOTES.md, "PTPC
pointer kernel"):

* M <= 64 (decode): 16 / 32 / 64-row tiles of 64 columns with K steps of 256, bound by
  reading the weight once; K is split only where the tiles cannot cover half the SMs.
* M <= 256: 64 x 128 x 128 tiles (split K for small N).
* larger M: 128 x 128 x 128 tiles on 8 warps: two warpgroups of 64 rows, each holding 64 fp32
  registers of accumulator and 64 of the FP8 partial sum it promotes (128 x 256 spills).
* CUDA, M <= 16: never split K: the fp32 atomics and the final cast cost more than the split
  gains (kv_a at one token ran 3x slower split); where the 64-column tiles do not cover the
  SMs, K steps of 512 in 3 stages keep more bytes in flight per SM.
* CUDA, 17 <= M <= 256 where unsplit tiles cover the SMs: 64 x 128 x 256 tiles on 8 warps in
  3 stages (the same tile count, longer K steps).
* AMD: 2 stages (the stream pipeliner's double buffer; gfx942 has 64 KiB of LDS) and no
  promotion (``max_num_imprecise_acc`` is NVIDIA sm_90's).

The hopper target's Gluon kernel has its own tiles (gluon_kernels/hopper/ptpc_fp8_launch.py);
which kernel serves a call is the registry's choice (ops/linear.py), never this table's.
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch options of the pointer GEMM.

    ``split_k``: programs per output tile along K (fp32 atomics, then one cast).
    ``promote_every``: K elements between promotions of Hopper's FP8 wgmma partial sum into
    the fp32 accumulator (its running sum keeps ~14 bits; None: never, as on AMD)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 4
    promote_every: int | None = 128


# Under the interpreter: one small config (tests cover split K with explicit configs).
INTERPRETER_CONFIG = GemmConfig(16, 32, 64, num_stages=1, promote_every=None)
# Fewest K tiles one split may hold: fewer would spend the program on its prologue.
MIN_K_TILES_PER_SPLIT = 4


@dataclass(frozen=True)
class GemmTarget:
    """What the tile choice needs to know about the GPU."""

    num_sms: int
    is_amd: bool


@functools.lru_cache(maxsize=None)
def current_target() -> GemmTarget:
    """The active Triton target (the compile-only driver's, in tests/amd_compile)."""
    target = triton.runtime.driver.active.get_current_target()
    if target.backend == "hip":
        return GemmTarget(304 if target.arch == "gfx942" else 256, True)
    if not torch.cuda.is_available():
        return GemmTarget(132, False)
    device = torch.cuda.current_device()
    return GemmTarget(torch.cuda.get_device_properties(device).multi_processor_count, False)


def split_k_to_fill(tiles: int, k: int, block_k: int, num_sms: int) -> int:
    """Splits of K that bring ``tiles`` output tiles up to about one program per SM, keeping
    >= MIN_K_TILES_PER_SPLIT K tiles per split; normalized so that no split is empty."""
    if 2 * tiles > num_sms:
        return 1
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min(num_sms // tiles, k_tiles // MIN_K_TILES_PER_SPLIT))
    return triton.cdiv(k_tiles, triton.cdiv(k_tiles, split))


# One tile per class of M, by the largest M of the class (None: any larger M); split_k is
# filled in per shape (split_k_to_fill).
CONFIG_BY_MAX_M: tuple[tuple[int | None, GemmConfig], ...] = (
    (16, GemmConfig(16, 64, 256)),
    (32, GemmConfig(32, 64, 256)),
    (64, GemmConfig(64, 64, 256)),
    (256, GemmConfig(64, 128, 128)),
    (None, GemmConfig(128, 128, 128, num_warps=8)),
)
CUDA_NO_SPLIT_MAX_M = 16
CUDA_UNSPLIT_M256_CONFIG = GemmConfig(64, 128, 256, num_warps=8, num_stages=3)
CUDA_FEW_TILES_DECODE_CONFIG = GemmConfig(16, 64, 512, num_stages=3)


def pick_config_for_target(m: int, n: int, k: int, target: GemmTarget) -> GemmConfig:
    """The pointer kernel's tiles for an [m, k] x [n, k] GEMM on ``target`` (module
    docstring); tests check the AMD choices without the driver."""
    max_m, config = next((max_m, c) for max_m, c in CONFIG_BY_MAX_M
                         if max_m is None or m <= max_m)
    if target.is_amd:
        config = dataclasses.replace(config, num_stages=2, promote_every=None)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    split_k = split_k_to_fill(tiles, k, config.block_k, target.num_sms)
    if not target.is_amd and m <= CUDA_NO_SPLIT_MAX_M:
        split_k = 1
        if tiles < target.num_sms:
            config = CUDA_FEW_TILES_DECODE_CONFIG    # 16x64 tiles too: the same tile count
    if not target.is_amd and max_m == 256 and split_k == 1:
        config = CUDA_UNSPLIT_M256_CONFIG  # the same 64x128 tiles, so the same tile count
    return dataclasses.replace(config, split_k=split_k)
