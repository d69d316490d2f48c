"""Tile choice of the PTPC-FP8 scaled GEMM (MODEL_SPEC §6.5): one config per shape class in an
explicit table, per target (no autotuning).

Three kernels share the config type:
* the pointer kernel (``ptpc_fp8.ptpc_gemm_kernel``): any target, any layout; decode tiles with
  split K, and the AMD configs;
* the TMA kernel (``ptpc_fp8_tma.ptpc_gemm_tma_kernel``, ``tma=True``): Hopper only. Tensor
  descriptors feed a warp-specialized loop: one producer warpgroup issues the TMA loads, two
  consumer warpgroups (64 rows each) run the wgmma and promote their own partial sums, so one
  consumer's promotion overlaps the other's tensor-core work;
* the Gluon kernel (``gluon_kernels/ptpc_fp8_hopper.py``, ``kernel="gluon_hopper"``): Hopper
  only, the large GEMMs (HOPPER_GLUON_CONFIG).
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch options of the PTPC GEMM.

    ``split_k``: programs per output tile along K (fp32 atomics, then one cast).
    ``promote_every``: K elements between promotions of the FP8 wgmma partial sum into the
    fp32 accumulator (NVIDIA sm_90; None: never). ``promote_per_tile``: promote every
    ``block_k`` through an explicit fp32 add of each tile's product instead (same numerics
    as ``promote_every = block_k``). ``warp_specialize``: Triton's automatic warp
    specialization of the K loop (producer / MMA partitions; on sm_90 Triton 3.6 applies it
    only with ``num_warps = 4``, and only the TMA kernel's loop qualifies). ``dot_bf16``:
    widen the FP8 tiles to bf16 before the product (exact values, full fp32 accumulation,
    half the FP8 tensor rate). ``tma``: the TMA kernel. ``split_n``: (TMA kernel) two
    accumulators of ``block_n / 2`` columns, each promoted on its own, so that a consumer of
    64 x 256 outputs holds 2 x 64 + 64 fp32 registers instead of 2 x 128. ``persistent``:
    (TMA kernel) one program per SM walking the tiles. ``promote_lagged``: (TMA kernel) K tiles in
    pairs, each tile's partial promoted while the next tile's wgmma runs (the numerics of
    ``promote_per_tile``; not with ``split_n`` or ``warp_specialize``).
    ``device_descriptors``: (TMA kernel) descriptors built in the kernel, which Triton 3.6's
    Hopper warp specialization can split between its consumer warpgroups (host descriptors:
    a wrong box there, and a hang). ``kernel``: "triton" (the pointer or TMA kernel above) or
    "gluon_hopper" (gluon_kernels/ptpc_fp8_hopper.py, sm_90 only: block_k = 128, block_m x
    block_n one of its TILES, ``num_stages`` ring buffers, ``group_m``, ``persistent``,
    ``overlap_epilogue``: each tile's store under the next tile's first wgmma; no split K; the
    other fields do not apply)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 4
    promote_every: int | None = 128
    promote_per_tile: bool = False
    warp_specialize: bool = False
    dot_bf16: bool = False
    tma: bool = False
    split_n: bool = False
    persistent: bool = False
    promote_lagged: bool = False
    device_descriptors: bool = False
    kernel: str = "triton"
    overlap_epilogue: bool = False


# Under the interpreter: one small config (tests cover split K with explicit configs).
INTERPRETER_CONFIG = GemmConfig(16, 32, 64, num_stages=1, promote_every=None)
# Fewest K tiles one split may hold: fewer would spend the program on its prologue.
MIN_K_TILES_PER_SPLIT = 4


@dataclass(frozen=True)
class HopperGemmRule:
    """The sm_90 tile rules (the TMA and Gluon kernels) instead of the portable pointer
    kernel's: ``replayed`` for launches replayed from a CUDA graph, which cost no host time
    (the Gluon kernel's rule then drops its FLOP floor)."""

    replayed: bool = False


HOPPER_EAGER_RULE = HopperGemmRule(replayed=False)
HOPPER_GRAPH_RULE = HopperGemmRule(replayed=True)


@dataclass(frozen=True)
class GemmTarget:
    """What the tile choice needs to know about the GPU. ``has_tma_ws``: Hopper (sm_90), where
    the TMA kernel and Triton's warp specialization for it exist."""

    num_sms: int
    is_amd: bool
    has_tma_ws: bool = False


@functools.lru_cache(maxsize=None)
def current_target() -> GemmTarget:
    """The active Triton target (the compile-only driver's, in tests/amd_compile)."""
    target = triton.runtime.driver.active.get_current_target()
    if target.backend == "hip":
        return GemmTarget(304 if target.arch == "gfx942" else 256, True)
    if not torch.cuda.is_available():
        return GemmTarget(132, False)
    device = torch.cuda.current_device()
    return GemmTarget(torch.cuda.get_device_properties(device).multi_processor_count, False,
                      has_tma_ws=torch.cuda.get_device_capability(device)[0] == 9)


def split_k_to_fill(tiles: int, k: int, block_k: int, num_sms: int) -> int:
    """Splits of K that bring ``tiles`` output tiles up to about one program per SM, keeping
    >= MIN_K_TILES_PER_SPLIT K tiles per split; normalized so that no split is empty."""
    if 2 * tiles > num_sms:
        return 1
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min(num_sms // tiles, k_tiles // MIN_K_TILES_PER_SPLIT))
    return triton.cdiv(k_tiles, triton.cdiv(k_tiles, split))


# One tile per shape class, by the largest M of the class (None: any larger M); split_k is
# filled in per shape (split_k_to_fill). The round-1 H200 winners
# (benchmarks/kernels/bench_ptpc_fp8.py):
# * decode, M <= 64: 16/32/64-row tiles, 64 columns, K steps of 256; split K only where the
#   tiles cannot cover half the SMs (kv_a: N = 576);
# * M <= 256: 64x128x128 tiles (split K for small N);
# * larger M: 128x128x128 tiles, 8 warps: two warpgroups of 64 rows, 2 x 64 fp32 registers
#   each for the accumulator and the FP8 partial sum it promotes. Not 128x256: 2 x 128
#   registers there, and it spilled (2.6x slower on the H200).
# AMD: 2 stages (the stream pipeliner's double buffer; gfx942 has 64 KiB of LDS), no
# promotion (max_num_imprecise_acc is for NVIDIA's sm_90).
CONFIG_BY_MAX_M: tuple[tuple[int | None, GemmConfig], ...] = (
    (16, GemmConfig(16, 64, 256)),
    (32, GemmConfig(32, 64, 256)),
    (64, GemmConfig(64, 64, 256)),
    (256, GemmConfig(64, 128, 128)),
    (None, GemmConfig(128, 128, 128, num_warps=8)),
)
# Round 2 on the H200 (vs torch._scaled_mm, same accuracy), CUDA only:
# * M <= 16: no split K. kv_a (N = 576, K = 7168) at M = 1: 0.0213 ms unsplit vs 0.0648 with
#   7 splits (fp32 atomics, then a cast); the other decode shapes fill the SMs unsplit anyway.
CUDA_NO_SPLIT_MAX_M = 16
# * 17 <= M <= 256 where the tiles fill the SMs unsplit: 64x128x256 tiles, 8 warps, 3 stages.
#   o_proj at M = 128: 0.0483 ms vs 0.0602 for 64x128x128 on 4 warps. Where they do not
#   (small N: kv_a), round 1's 64x128x128 tiles with split K.
CUDA_UNSPLIT_M256_CONFIG = GemmConfig(64, 128, 256, num_warps=8, num_stages=3)
# Session 4 on the H200, CUDA only:
# * M <= 16 where the decode tiles do not cover the SMs (o_proj: 112 programs of 64 columns):
#   K steps of 512 in 3 stages, 80 KiB in flight per SM instead of 60. H200 session 4 (graph
#   ms): o_proj M = 1 0.0275 vs 0.0307 (16x64x256), M = 16 0.0280 vs 0.0309; where the tiles do
#   cover them (kda qkv, 576 programs) the 256-K steps stayed faster (0.0706 vs 0.0751).
CUDA_FEW_TILES_DECODE_CONFIG = GemmConfig(16, 64, 512, num_stages=3)


# Hopper (sm_90) from HOPPER_TMA_MIN_M tokens up (None: never): the TMA kernel where its 128x128
# tiles alone cover the SMs (small N, e.g. kv_a's 576, keeps the pointer kernel's split K):
# 8 warps (two warpgroups of 64 rows), no warp specialization, K tiles in pairs so that one
# tile's promotion overlaps the next tile's wgmma (one wgmma drain per 256 K instead of per
# 128; offline, Triton 3.6: 206 registers, no spills, 192 KiB of shared memory). H200 session 4,
# M = 4096 (graph ms, equal accuracy to torch._scaled_mm): o_proj 0.749 vs 0.855 for the
# pointer kernel (torch._scaled_mm 0.595), kda qkv 2.40 vs 2.56 (1.55). With 2 stages (two
# buffers per K-tile stream) it starved: 0.998 / 2.92. Final round: o_proj M = 1024 0.199 vs
# 0.227; kda qkv M = 128 (288 tiles) 0.104 vs 0.128, o_proj M = 128 (96 tiles, pointer kernel
# kept by the rule) 0.047 vs 0.040: hence from 128 tokens wherever the tiles cover the SMs.
HOPPER_TMA_MIN_M: int | None = 128
HOPPER_TMA_CONFIG = GemmConfig(128, 128, 128, num_warps=8, num_stages=3, tma=True,
                               promote_lagged=True)
# Triton 3.6's warp specialization of the TMA kernel (one producer and two consumer
# warpgroups of 64 rows), not a default: with host descriptors it hung the H200 (session 3: it
# copies a 128-row box into each consumer's 64-row buffer); with descriptors built in the
# kernel it ran (o_proj M = 4096: 0.709 ms, 128x256 split N 0.641) but stored the second
# consumer's rows 64 rows too far (session 4, round 1; the kernel now takes the store's row
# offset apart from the loads': ptpc_fp8_tma.gemm_tile).
HOPPER_WS_CONFIG = GemmConfig(128, 128, 128, num_warps=4, num_stages=4, promote_per_tile=True,
                              warp_specialize=True, tma=True, device_descriptors=True)


# Hopper (sm_90): the Gluon kernel (gluon_kernels/ptpc_fp8_hopper.py: a TMA producer warp, two
# consumer warpgroups promoting each wgmma partial under the next one, persistent grid, the
# epilogue under the next tile's first wgmma) from HOPPER_GLUON_MIN_M tokens (None: never) where
# its 128 x 128 tiles cover the SMs and the GEMM has >= HOPPER_GLUON_MIN_FLOP
# (operands it cannot take fall back to the pointer kernel in ptpc_fp8). H200 session 5, round 1
# (graph ms vs torch._scaled_mm in the same run, equal accuracy: e/bnd 0.76 like the Triton
# kernels): o_proj M = 4096 0.592 (0.98x; 0.579 without the overlapped epilogue) vs the lag2
# TMA kernel's 0.755 (peer 0.583); kda qkv 4096 1.780 (0.99x) vs 2.227 (peer 1.753); o_proj
# 1024 0.164 (1.04x) vs 0.203; kda qkv 1024 0.459 (0.97x) vs 0.563; kda qkv 128 (288 tiles)
# 0.094 (0.96x, without the overlap) vs 0.104. The floors: a launch through Gluon's JIT cost ~150
# us of host time (o_proj M = 128, eager: 0.16 ms for a 0.03 ms kernel; the Triton pointer kernel
# 0.05), so small GEMMs stay on the Triton kernels, whose launch is cheaper. Below
# HOPPER_GLUON_MIN_K (kv_b's K = 512: 4 K tiles a tile) the overlapped epilogue does not pay:
# kv_b M = 4096, final round and the last call, 0.132-0.135 ms (1.02-1.03x) without it,
# 0.152-0.154 (0.89-0.90x) with it, the lag2 TMA kernel 0.231 (0.60x).
HOPPER_GLUON_MIN_M: int | None = 128
HOPPER_GLUON_MIN_K = 1024
HOPPER_GLUON_MIN_FLOP = 5e10
HOPPER_GLUON_CONFIG = GemmConfig(128, 128, 128, num_stages=4, persistent=True,
                                 kernel="gluon_hopper", overlap_epilogue=True)
HOPPER_GLUON_NO_OVERLAP_CONFIG = dataclasses.replace(HOPPER_GLUON_CONFIG, overlap_epilogue=False)


# Launches replayed from a CUDA graph (the engine's decode steps, HOPPER_GRAPH_RULE) cost
# no host time, so there the rule drops the FLOP floor and takes the Gluon kernel's 128 x 128
# tiles once they fill HOPPER_GLUON_MIN_FILL of the SMs: at one wave or less
# (HOPPER_GLUON_ONE_WAVE_CONFIG) in 6 stages and without the overlapped epilogue (no next tile
# to hide it under; 6 x 32 KiB in flight per SM, where fewer SMs pull the weights), else its
# 128 x 64 tiles once they do. H200 session 6, final run (graph ms, against torch._scaled_mm in
# the same run; the eager rule's choice in brackets): o_proj M = 128 (56 / 112 tiles) 128 x 64
# 0.0304 = 1.16x (pointer kernel 0.87x), shared down 128 1.17x (0.87x); one wave of 128 x 128:
# shared gate_up 128 (96 tiles) 6 stages 0.97x (4 stages 0.84x, pointer 0.55x), o_proj 256
# (112 tiles) 1.06x (0.94x, 0.54x), shared down 256 1.04x (0.92x, 0.51x); q_b 128 1.02x (TMA
# lag2 0.77x), kv_b 128 1.01x (0.83x). Eager, the same Gluon launches took 0.11-0.35 ms of host
# time, which is why eager launches keep the rule above.
HOPPER_GLUON_NARROW_CONFIG = GemmConfig(128, 64, 128, num_stages=6, persistent=True,
                                        kernel="gluon_hopper")
HOPPER_GLUON_ONE_WAVE_CONFIG = GemmConfig(128, 128, 128, num_stages=6, persistent=True,
                                          kernel="gluon_hopper")
HOPPER_GLUON_MIN_FILL = 0.7


def gluon_config_on_hopper(m: int, n: int, k: int, target: GemmTarget,
                           replayed: bool = False) -> GemmConfig | None:
    """The Gluon kernel's rule (above) for launches made eagerly or, ``replayed``, from a
    CUDA graph; None where the Triton kernels run."""
    if not (target.has_tma_ws and HOPPER_GLUON_MIN_M is not None and m >= HOPPER_GLUON_MIN_M):
        return None
    if not replayed and 2 * m * n * k < HOPPER_GLUON_MIN_FLOP:
        return None
    wide_tiles = triton.cdiv(m, HOPPER_GLUON_CONFIG.block_m) * \
        triton.cdiv(n, HOPPER_GLUON_CONFIG.block_n)
    if wide_tiles >= target.num_sms:
        return HOPPER_GLUON_CONFIG if k >= HOPPER_GLUON_MIN_K else HOPPER_GLUON_NO_OVERLAP_CONFIG
    if not replayed:
        return None
    if wide_tiles >= HOPPER_GLUON_MIN_FILL * target.num_sms:
        return HOPPER_GLUON_ONE_WAVE_CONFIG
    narrow_tiles = triton.cdiv(m, HOPPER_GLUON_NARROW_CONFIG.block_m) * \
        triton.cdiv(n, HOPPER_GLUON_NARROW_CONFIG.block_n)
    if narrow_tiles >= HOPPER_GLUON_MIN_FILL * target.num_sms:
        return HOPPER_GLUON_NARROW_CONFIG
    return None


def pick_config_for_target(m: int, n: int, k: int, target: GemmTarget,
                           replayed: bool = False) -> GemmConfig:
    """The launcher's tile choice on a given target (tests check the AMD choices without the
    driver); ``replayed``: the launch will be replayed from a CUDA graph."""
    gluon_config = gluon_config_on_hopper(m, n, k, target, replayed)
    if gluon_config is not None:
        return gluon_config
    if target.has_tma_ws and HOPPER_TMA_MIN_M is not None and m >= HOPPER_TMA_MIN_M and \
            triton.cdiv(m, HOPPER_TMA_CONFIG.block_m) * \
            triton.cdiv(n, HOPPER_TMA_CONFIG.block_n) >= target.num_sms:
        return HOPPER_TMA_CONFIG
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

