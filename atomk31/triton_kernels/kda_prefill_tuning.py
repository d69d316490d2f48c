"""Tuning knobs of the Triton KDA chunked prefill (kda_prefill.py), shared by its stages.

The defaults are the launchers' choices; benchmarks pass other values to compare designs.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KdaPrefillTuning:
    """None: the stage launcher's default for the inputs' dtype and the number of requests."""
    intermediate_dtype: torch.dtype | None = None  # w/qg/kd/u (None: v's dtype if 16-bit)
    intra_split: bool = False           # stage 1 as the wide stage 1a ([64, 64] accumulators,
    #                                     kda_prefill_scores_wide.py), then stage 1b (gated
    #                                     rows + w/u) unless fold_w_u
    scores_block_k: int = 32            # stage 1a: head channels per slice
    scores_num_warps: int = 4           # stage 1a
    scores_tf32_solve: bool = False     # stage 1a: solve in TF32 (16-bit inputs only)
    scores_bf16: bool = False           # stage 1a: BF16 score products (16-bit inputs)
    compact_scores: bool = False        # stage 1a: aqk, inverse in the 16-bit dtype
    scores_joined: bool = False         # stage 1a: a slice's 4 blocks in one product
    scores_max_registers: int | None = None  # wide stage 1a: register cap (CUDA maxnreg)
    gated_block: int = 64               # split stage 1b: channels per product
    gated_num_warps: int = 4            # split stage 1b
    intra_num_warps: int = 4            # single-kernel stage 1, one program per (chunk, head)
    intra_cache_right: bool = False     # single-kernel stage 1: right-hand tiles in registers
    block_v: int | None = None          # stage 2: value channels per sequential program
    num_warps: int = 4                  # stage 2
    num_stages: int | None = None       # stage 2: software-pipelining depth of its loads
    split_output: bool = True           # output in the chunk-parallel stage 3, not in stage 2
    bf16_products: bool = True          # stages 2-3 and 1b, BF16 intermediates only
    output_block_v: int | None = None   # stage 3: value channels per program
    plan_on_device: bool = False        # chunk table on the GPU, no host sync (no snapshots)
    fold_w_u: bool = False              # wide stage 1a writes the gated rows; no stage 1b:
    #                                     stage 2 forms V' = P (β v - kb S) itself
