"""How `sparse_mla_kernel` (sparse and dense MLA) tiles its work, and the defaults per target.

A program owns rows_per_program x block_h query vectors, 512 / value_splits of the value
columns, and one of num_splits key ranges, walking it block_n keys per step. The defaults
come from the H200 benchmarks (benchmarks/kernels/bench_sparse_mla.py, bench_dense_mla.py).
Round 1: one pipeline stage beat two at every shape measured; 128 keys per step won when one
row's programs are many (64 sparse rows) or the keys are long (dense decode); with few
programs over short selections (16 sparse rows) 64 keys per step, probabilities through
memory and two waves of key splits won. Round 2, for the model's 96 heads with bf16
products (`_cuda_many_heads_tiles`): 128 query vectors a program over two value-split
programs, 64 keys a step, and 16 key splits for few programs over short selections.
Round 3 (graph-timed): sparse MLA over few rows takes that layout too, with the next tile's
key rows read ahead and FP16 products over the FP8 latent. Session 4: sparse MLA over many
rows takes FP16 products as well.
"""

from dataclasses import dataclass, replace

import torch
import triton
from triton.runtime import driver

from atomk31.triton_kernels.runtime import runs_on_interpreter

MIN_TILES_PER_SPLIT = 4  # shorter splits cost more in partial writes and merging than they win
SHORT_SELECTION = 4096  # keys per row up to which few programs take more, shorter splits
FEW_SHORT_TILES_PER_SPLIT = 2  # key tiles per split of few programs over a short selection


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
    *,
    num_splits: int | None = None,
    block_h: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    value_splits: int | None = None,
    scores_via_memory: bool | None = None,
    prefetch: int | None = None,
    fp16_operands: bool | None = None,
    is_sparse: bool = False,
) -> MlaTiles:
    """The tile configuration: what the caller fixed, the rest chosen for the target.
    `is_sparse`: the rows' own selections (sparse_mla) rather than causal keys (dense_mla),
    whose defaults were measured apart."""
    tiles = _choose_shape(q, is_fp32, is_interpreter, num_groups, max_keys, rows_per_program,
                          num_splits=num_splits, block_h=block_h, block_n=block_n,
                          num_warps=num_warps, num_stages=num_stages, value_splits=value_splits,
                          scores_via_memory=scores_via_memory, is_sparse=is_sparse)
    if prefetch not in (None, 0, 1):
        raise ValueError(f"prefetch must be 0 or 1, got {prefetch}")
    return replace(tiles, prefetch=tiles.prefetch if prefetch is None else prefetch,
                   fp16_operands=tiles.fp16_operands if fp16_operands is None
                   else fp16_operands)


def _choose_shape(
    q: torch.Tensor,
    is_fp32: bool,
    is_interpreter: bool,
    num_groups: int,
    max_keys: int,
    rows_per_program: int,
    *,
    num_splits: int | None,
    block_h: int | None,
    block_n: int | None,
    num_warps: int | None,
    num_stages: int | None,
    value_splits: int | None,
    scores_via_memory: bool | None,
    is_sparse: bool,
) -> MlaTiles:
    """Block sizes, warps, stages and splits: what the caller fixed, the rest chosen."""
    num_heads = q.shape[1]
    is_hip = not is_interpreter and driver.active.get_current_target().backend == "hip"
    is_small_target = is_interpreter or is_fp32 or is_hip
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
        max_splits = triton.cdiv(num_key_tiles, MIN_TILES_PER_SPLIT)
        num_sms = 1 if is_interpreter else _num_sms(q.device)
        # One warpgroup per program (4 warps): two programs share a multiprocessor.
        slots = num_sms * (2 if num_warps <= 4 else 1) * (2 if is_few_short else 1)
        num_splits = fewest_splits_filling_waves(num_programs, slots, max_splits)
    num_splits = max(1, min(num_splits, num_key_tiles))
    return MlaTiles(block_h, block_n, rows_per_program, num_splits, num_warps, num_stages,
                    value_splits, scores_via_memory)


def _cuda_many_heads_tiles(q: torch.Tensor, num_groups: int, max_keys: int,
                           rows_per_program: int, num_splits: int | None,
                           is_sparse: bool) -> MlaTiles:
    """Round 2's fastest tiles on the H200 for 65-128 heads (the model's 96), bf16 / fp8
    latent, as fractions of the bf16 matrix rate, all within the tests' error:
    - few programs over a short selection (sparse, 16 rows): 64 heads, 64 keys a step,
      16 key splits, scores via memory: 9.4% (round 1's sp8 default: 5.4%);
    - one row a program otherwise (sparse 64 rows; dense 1 row a request): all heads (128)
      in one program, each of two value-split programs owning half the values, 64 keys a
      step: sparse 19.4% (16.2%), dense 20.7% / 22.0% at 16K / 128K (18.3 / 19.6);
    - dense 4 rows a program: 32 heads x 4 rows = 128 query vectors, value splits, one
      stage: 27.9% / 29.1% (21.5 / 22.6).
    2 rows a program keeps round 1's choice (not measured since). Every one: 8 warps.
    Round 3, sparse (graph-timed): few programs over a short selection (16 rows) take the
    64-row layout (128 heads, value halves) with key splits filling the multiprocessors (4),
    the next tile's key rows read ahead and FP16 products over the FP8 latent: 64 us, 14.7%
    (round 2's 64-head via-memory default: 95 us, 10.0%); dense keeps round 2's.
    Session 4 (slots no longer split by an int64 division): sparse 64 rows take FP16
    products too: 153.1 us, 25.2% (BF16: 185.6 us, 20.8%); 16 rows measured 47.2 us, 20.5%."""
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
        max_splits = triton.cdiv(num_key_tiles, MIN_TILES_PER_SPLIT)
        num_splits = fewest_splits_filling_waves(num_programs, _num_sms(q.device), max_splits)
    num_splits = max(1, min(num_splits, num_key_tiles))
    return MlaTiles(block_h, block_n, rows_per_program, num_splits, num_warps, num_stages,
                    value_splits, scores_via_memory, prefetch, fp16_operands)


def fewest_splits_filling_waves(num_programs: int, num_sms: int, max_splits: int) -> int:
    """Key splits per program: the fewest (each costs a partial write and the merge) whose
    waves of programs (num_sms programs at once) keep >= 85% of them busy, else the best
    filling one up to max_splits."""
    def busy_fraction(splits: int) -> float:
        num_waves = triton.cdiv(num_programs * splits, num_sms)
        return num_programs * splits / (num_waves * num_sms)

    if num_programs == 0:
        return 1
    candidates = range(1, max(1, max_splits) + 1)
    good = [s for s in candidates if busy_fraction(s) >= 0.85]
    return good[0] if good else max(candidates, key=busy_fraction)


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
