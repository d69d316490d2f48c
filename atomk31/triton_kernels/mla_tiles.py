"""How `sparse_mla_kernel` (sparse and dense MLA) tiles its work, and the defaults per target.

A program owns rows_per_program x block_h query vectors, 512 / value_splits of the value
columns, and one of num_splits key ranges, walking it block_n keys per step. `MLATileConfig`
is what a caller may fix (tests, benchmarks; None everywhere: chosen here); `choose_tiles`
resolves it into the `MlaTiles` of one launch. The defaults are the fastest tiles measured on
the H200 (benchmarks/kernels/bench_sparse_mla.py, bench_dense_mla.py; the rounds and their
figures: benchmarks/NOTES.md); AMD, float32 products and the interpreter keep small tiles
(both dot operands in registers there).
"""

from dataclasses import dataclass, fields, replace

import torch
import triton
from triton.runtime import driver

from atomk31.triton_kernels.mla_splits import default_splits
from atomk31.triton_kernels.runtime import num_sms

SHORT_SELECTION = 4096  # keys per row up to which few programs take more, shorter splits
FEW_SHORT_TILES_PER_SPLIT = 2  # key tiles per split of few programs over a short selection


@dataclass(frozen=True)
class MLATileConfig:
    """The tile knobs of the Triton MLA launchers (`sparse_mla_triton`, `dense_mla_triton`);
    a field left None is chosen for the target and shape (`choose_tiles`).

    num_splits: key splits per row (flash-decoding; merged by log-sum-exp). block_h: heads per
    program. block_n: keys per step. num_warps, num_stages: as Triton's. value_splits: 1 or 2
    programs per query block, each owning 512 / value_splits value columns (each recomputes
    the scores, for an accumulator half as large). scores_via_memory: the probabilities reach
    the value product through a scratch buffer (Triton then splits the score product's keys
    over the two warpgroups instead of running it on both; one pipeline stage). prefetch: 0 or
    1, the next tile's slots read during this one. fp16_operands: FP16 products over an FP8
    latent (queries scaled into FP16's range, mla_fp16_query.py; ignored for other latents
    and float32 queries).
    """

    num_splits: int | None = None
    block_h: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    value_splits: int | None = None
    scores_via_memory: bool | None = None
    prefetch: int | None = None
    fp16_operands: bool | None = None

    def fixed(self) -> list[str]:
        """The fields a caller set."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


DEFAULT_TILE_CONFIG = MLATileConfig()


@dataclass(frozen=True)
class MlaTiles:
    """One launch configuration of `sparse_mla_kernel`."""

    block_h: int
    block_n: int
    rows_per_program: int
    num_splits: int
    num_warps: int
    num_stages: int
    value_splits: int = 1  # programs sharing a query block, each owning 512 / value_splits
    scores_via_memory: bool = False
    prefetch: int = 0  # 1: the next tile's key rows read during this one
    fp16_operands: bool = False  # FP16 products over an FP8 latent (queries scaled)


def choose_tiles(
    q: torch.Tensor,
    is_fp32: bool,
    is_interpreter: bool,
    num_groups: int,
    max_keys: int,
    rows_per_program: int,
    config: MLATileConfig = DEFAULT_TILE_CONFIG,
    is_sparse: bool = False,
) -> MlaTiles:
    """The tile configuration: what `config` fixes, the rest chosen for the target.
    `is_sparse`: the rows' own selections (sparse_mla) rather than causal keys (dense_mla),
    whose defaults were measured apart."""
    tiles = _choose_shape(q, is_fp32, is_interpreter, num_groups, max_keys, rows_per_program,
                          config, is_sparse)
    if config.prefetch not in (None, 0, 1):
        raise ValueError(f"prefetch must be 0 or 1, got {config.prefetch}")
    return replace(tiles, prefetch=tiles.prefetch if config.prefetch is None
                   else config.prefetch,
                   fp16_operands=tiles.fp16_operands if config.fp16_operands is None
                   else config.fp16_operands)


def _choose_shape(
    q: torch.Tensor,
    is_fp32: bool,
    is_interpreter: bool,
    num_groups: int,
    max_keys: int,
    rows_per_program: int,
    config: MLATileConfig,
    is_sparse: bool,
) -> MlaTiles:
    """Block sizes, warps, stages and splits: what `config` fixes, the rest chosen."""
    num_heads = q.shape[1]
    is_hip = not is_interpreter and driver.active.get_current_target().backend == "hip"
    is_small_target = is_interpreter or is_fp32 or is_hip
    block_h, block_n, num_warps = config.block_h, config.block_n, config.num_warps
    num_stages, value_splits = config.num_stages, config.value_splits
    scores_via_memory, num_splits = config.scores_via_memory, config.num_splits
    tile_knobs = (block_h, block_n, num_warps, num_stages, value_splits, scores_via_memory)
    if not is_small_target and num_heads > 64 and all(knob is None for knob in tile_knobs):
        return _cuda_many_heads_tiles(q, num_groups, max_keys, rows_per_program, num_splits,
                                      is_sparse)
    if block_h is None:
        # 64 query vectors per program: the smallest Hopper warpgroup product (wgmma M = 64).
        # AMD keeps both dot operands in registers (no shared-memory operand), and float32
        # products run on FMA units with register operands: smaller tiles there. On gfx942 /
        # gfx950, 16 vectors x 16 keys x 8 warps is the largest tile that compiles without
        # spills within two waves per SIMD (tests/amd_compile; 32 x 16 spills on gfx942).
        block_h = (16 if is_small_target else 64) // rows_per_program
    # tl.dot needs at least 16 query vectors per program.
    block_h = max(min(block_h, triton.next_power_of_2(num_heads)), 16 // rows_per_program)
    if value_splits is None:
        value_splits = 1
    if value_splits not in (1, 2):
        raise ValueError(f"value_splits must be 1 or 2, got {value_splits}")
    num_programs = num_groups * triton.cdiv(num_heads, block_h) * value_splits
    # Few programs over a short selection: they take more, shorter key splits (two waves).
    is_few_short = num_programs < 64 and max_keys <= SHORT_SELECTION and rows_per_program == 1
    if block_n is None:
        if is_small_target:
            block_n = 16
        elif rows_per_program > 1 or is_few_short:
            block_n = 64  # verification rows: 64 and 128 measured alike; 16 rows: 64
        else:
            block_n = 128
    if num_warps is None:
        num_warps = 8
    if scores_via_memory is None:
        scores_via_memory = is_few_short and not is_small_target
    if num_stages is None:
        # Verification rows (rows_per_program > 1) were measured with two stages only.
        num_stages = 2 if rows_per_program > 1 and not is_small_target else 1
    if scores_via_memory:
        num_stages = 1  # a pipelined scratch load would run ahead of the tile's stores
    num_key_tiles = max(1, triton.cdiv(max_keys, block_n))
    if num_splits is None:
        # One warpgroup per program (4 warps): two programs share a multiprocessor.
        slots = num_sms(q.device) * (2 if num_warps <= 4 else 1) * (2 if is_few_short else 1)
        num_splits = default_splits(num_programs, max_keys, block_n, slots)
    num_splits = max(1, min(num_splits, num_key_tiles))
    return MlaTiles(block_h, block_n, rows_per_program, num_splits, num_warps, num_stages,
                    value_splits, scores_via_memory)


def _cuda_many_heads_tiles(q: torch.Tensor, num_groups: int, max_keys: int,
                           rows_per_program: int, num_splits: int | None,
                           is_sparse: bool) -> MlaTiles:
    """The fastest tiles measured on the H200 for 65-128 heads (the model's 96), bf16 / fp8
    latent, all within the tests' error; 8 warps and 64 keys a step everywhere:
    - few programs over a short selection, sparse (16 rows): 128 heads (96 padded) in one
      program, two value-split programs, the next tile's slots read ahead, FP16 products,
      key splits filling the multiprocessors;
    - the same, dense: 64 heads, scores via memory, 2 key tiles a split;
    - one row a program otherwise (sparse 64 rows; dense 1 row a request): 128 heads, two
      value-split programs (FP16 products for sparse);
    - dense 4 rows a program: 32 heads x 4 rows = 128 query vectors, value splits;
    - dense 2 rows a program: 32 heads x 2 rows, two stages."""
    num_head_blocks_of_64 = triton.cdiv(q.shape[1], 64)
    is_few_short = (num_groups * num_head_blocks_of_64 < 64 and max_keys <= SHORT_SELECTION
                    and rows_per_program == 1)
    prefetch, fp16_operands = 0, False
    if is_few_short and is_sparse:
        block_h, value_splits, num_stages, scores_via_memory = 128, 2, 1, False
        prefetch, fp16_operands = 1, True
    elif is_few_short:
        block_h, value_splits, num_stages, scores_via_memory = 64, 1, 1, True
    elif rows_per_program == 1:
        block_h, value_splits, num_stages, scores_via_memory = 128, 2, 1, False
        fp16_operands = is_sparse
    elif rows_per_program == 4:
        block_h, value_splits, num_stages, scores_via_memory = 32, 2, 1, False
    else:
        block_h, value_splits, num_stages, scores_via_memory = 64 // rows_per_program, 1, 2, False
    block_n, num_warps = 64, 8
    num_key_tiles = max(1, triton.cdiv(max_keys, block_n))
    if num_splits is None and is_few_short and not is_sparse:
        num_splits = triton.cdiv(num_key_tiles, FEW_SHORT_TILES_PER_SPLIT)
    elif num_splits is None:
        num_programs = num_groups * triton.cdiv(q.shape[1], block_h) * value_splits
        num_splits = default_splits(num_programs, max_keys, block_n, num_sms(q.device))
    num_splits = max(1, min(num_splits, num_key_tiles))
    return MlaTiles(block_h, block_n, rows_per_program, num_splits, num_warps, num_stages,
                    value_splits, scores_via_memory, prefetch, fp16_operands)
