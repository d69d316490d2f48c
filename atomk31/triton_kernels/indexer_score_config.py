"""How indexer_score_kernel multiplies and tiles, and which configuration a launch uses.

The choice follows the active target (not the tensors' device, so the AMD compile checks get
the configuration a launch there would use): the interpreter, CUDA (Hopper: fp8 tensor cores
for e4m3fn keys) or ROCm. benchmarks/kernels/bench_indexer_score.py compares configurations
side by side on the H200.
"""

from dataclasses import dataclass

import torch
from triton.runtime import driver

from atomk31.triton_kernels.runtime import runs_on_interpreter


@dataclass(frozen=True)
class IndexerScoreConfig:
    """How the kernel multiplies and tiles (the benchmark compares them; `default_config`
    picks one per target).

    dot: the product's operands. "fp32" (the interpreter), "bf16" (exact: e4m3 and E2M1 x 2^e
      values are bf16 values, fp32 accumulation), "fp8" (e4m3fn keys and queries on the fp8
      tensor cores; Hopper accumulates their products with ~14 bits), "fp8_acc32" /
      "fp8_acc64" (the same, the partial sums added into fp32 every 32 / 64 products, as
      DeepGEMM does every 128: one fp32 add per accumulator element each time).
    k_split: 4 runs four products of K = 32 and sums them in fp32 (FP8 keys only).
    num_warps: None picks 8 for products of 128 x 128 and up, else 4.
    programs_per_sm: programs launched per multiprocessor (over row tiles x key chunks).
    tile_group: tiles whose pages are read from the block table at once (0: one read per
      tile, inside the pipelined loop, which then keeps only one tile in flight). The
      pipeline drains at the end of each group: large groups, few drains.
    max_registers: a register cap a thread (CUDA's maxnreg), e.g. 128 for two programs of 8
      warps a multiprocessor; what does not fit spills (the queries' prologue, once).
    """

    dot: str = "bf16"
    k_split: int = 1
    block_n: int = 128
    num_warps: int | None = None
    num_stages: int = 3
    programs_per_sm: int = 4
    tile_group: int = 64
    max_registers: int | None = None


DOTS = ("fp32", "bf16", "fp8", "fp8_acc32", "fp8_acc64")
FP8_ACC_INTERVALS = {"fp8_acc32": 32, "fp8_acc64": 64}  # the others: 0, no fp32 partial sums
INTERPRETER_CONFIG = IndexerScoreConfig(dot="fp32", block_n=64, num_warps=4, num_stages=1,
                                        programs_per_sm=1)
# Hopper, e4m3fn keys, bf16 queries: the fp8 tensor cores with fp32 sums every K = 32.
# PENDING H200 MEASUREMENT (issue #5): if its error exceeds the op's tolerance, use "bf16".
CUDA_E4M3FN_DOT = "fp8_acc32"


def default_config(kernel: object, q_dtype: torch.dtype, index_values_dtype: torch.dtype,
                   index_format: str) -> IndexerScoreConfig:
    """The configuration a launch uses unless told otherwise: by the active target."""
    if runs_on_interpreter(kernel):
        return INTERPRETER_CONFIG
    target = driver.active.get_current_target()
    if target.backend != "cuda":
        if target.arch == "gfx942":
            # 128-key tiles on 8 warps spilled 13 VGPRs there; 64-key tiles on 4 warps fit.
            return IndexerScoreConfig(dot="bf16", block_n=64, num_warps=4, num_stages=2)
        return IndexerScoreConfig(dot="bf16", num_stages=3)
    is_e4m3fn_keys = index_format == "fp8" and index_values_dtype == torch.float8_e4m3fn
    is_hopper = target.arch == 90  # where the fp8 products' accumulation was measured
    can_use_fp8_dot = is_e4m3fn_keys and q_dtype != torch.float32 and is_hopper
    if can_use_fp8_dot and CUDA_E4M3FN_DOT != "bf16":
        # 64-key tiles on 8 warps: 32 accumulator registers a thread, room for the fp32
        # partial sums (128-key tiles spill with them); 5 tiles in flight.
        return IndexerScoreConfig(dot=CUDA_E4M3FN_DOT, block_n=64, num_warps=8, num_stages=6)
    return IndexerScoreConfig(dot="bf16", num_stages=4)
