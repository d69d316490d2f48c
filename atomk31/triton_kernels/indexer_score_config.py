"""How indexer_score_kernel multiplies and tiles, and which configuration a launch uses.

The choice follows the active target (not the tensors' device, so the AMD compile checks get
the configuration a launch there would use): the interpreter, CUDA or ROCm. Every product is
exact (fp16 / bf16 operands hold the e4m3 and E2M1 x 2^e values exactly; fp32 sums). The FP8
tensor cores were measured faster on the H200 and left out: Hopper accumulates their products
with ~14 bits, 4x to 23x the op's tolerance (benchmarks/NOTES.md).
benchmarks/kernels/bench_indexer_score.py compares configurations side by side on the H200.
"""

from dataclasses import dataclass

from triton.runtime import driver

from atomk31.triton_kernels.runtime import runs_on_interpreter


@dataclass(frozen=True)
class IndexerScoreConfig:
    """How the kernel multiplies and tiles (`default_config` picks one per target).

    dot: the product's operand type. "fp32" (the interpreter, whose bf16 dot is wrong), "bf16"
      (exact: e4m3 and E2M1 x 2^e values are bf16 values, fp32 accumulation), "fp16" (FP8
      keys only: e4m3 values are fp16 values too, and fp8 -> fp16 is one instruction per two
      values on sm_89+ where fp8 -> bf16 goes through fp16).
    block_n: keys a tile. num_warps: None picks 8 for products of 128 x 128 and up, else 4.
    num_stages: Triton's software pipelining depth of the tile loop.
    programs_per_sm: programs launched per multiprocessor (over row tiles x key chunks).
    tile_group: tiles whose pages are read from the block table at once, so the key loads of
      the tile loop depend on no load of that loop and pipeline num_stages deep (0: one read
      per tile, inside the loop, which then keeps only one tile in flight). The pipeline
      drains at the end of each group: large groups, few drains; up to 32 (a warp), picking a
      tile's page needs no barrier.
    """

    dot: str = "bf16"
    block_n: int = 128
    num_warps: int | None = None
    num_stages: int = 3
    programs_per_sm: int = 4
    tile_group: int = 64


DOTS = ("fp32", "bf16", "fp16")
INTERPRETER_CONFIG = IndexerScoreConfig(dot="fp32", block_n=64, num_warps=4, num_stages=1,
                                        programs_per_sm=1)
# MXFP4 keys on CUDA: bf16 products (E2M1 x 2^e overflows fp16).
CUDA_CONFIG = IndexerScoreConfig(dot="bf16", block_n=128, num_stages=4)
# FP8 keys on CUDA: fp16 products, 64-key tiles on one warpgroup (255 registers: two programs
# a multiprocessor), pages of 32 tiles picked without a barrier, programs for one wave: the
# fastest exact configuration measured on the H200.
CUDA_FP8_KEYS_CONFIG = IndexerScoreConfig(dot="fp16", block_n=64, num_warps=4, num_stages=6,
                                          programs_per_sm=2, tile_group=32)


def default_config(kernel: object, fp8_keys: bool = False) -> IndexerScoreConfig:
    """The configuration a launch uses unless told otherwise: by the active target and, on
    CUDA, by the key format (fp8_keys: FP8 index keys, else MXFP4)."""
    if runs_on_interpreter(kernel):
        return INTERPRETER_CONFIG
    target = driver.active.get_current_target()
    if target.backend == "cuda":
        return CUDA_FP8_KEYS_CONFIG if fp8_keys else CUDA_CONFIG
    if target.arch == "gfx942":
        # 128-key tiles on 8 warps spilled 13 VGPRs there; 64-key tiles on 4 warps fit.
        return IndexerScoreConfig(dot="bf16", block_n=64, num_warps=4, num_stages=2)
    return IndexerScoreConfig(dot="bf16", num_stages=3)
