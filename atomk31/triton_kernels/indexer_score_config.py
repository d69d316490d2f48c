"""How indexer_score_kernel multiplies and tiles, and which configuration a launch uses.

The choice follows the active target (not the tensors' device, so the AMD compile checks get
the configuration a launch there would use): the interpreter, CUDA or ROCm. Every default is
the exact bf16-product path; the fp8 tensor cores are an explicit opt-in (`fp8_dot_config`).
benchmarks/kernels/bench_indexer_score.py compares configurations side by side on the H200.
"""

from dataclasses import dataclass, replace

from triton.runtime import driver

from atomk31.triton_kernels.runtime import runs_on_interpreter


@dataclass(frozen=True)
class IndexerScoreConfig:
    """How the kernel multiplies and tiles (the benchmark compares them; `default_config`
    picks one per target).

    dot: the product's operands. "fp32" (the interpreter), "bf16" (exact: e4m3 and E2M1 x 2^e
      values are bf16 values, fp32 accumulation), "fp16" (FP8 keys only: e4m3 values are fp16
      values too, and the conversion is one instruction per two values), "fp8" (e4m3fn keys
      and queries on the fp8 tensor cores; Hopper accumulates their products with ~14 bits),
      "fp8_acc32" / "fp8_acc64" (the same, the partial sums added into fp32 every 32 / 64
      products, as DeepGEMM does every 128: one fp32 add per accumulator element each time).
    k_split: 4 runs four products of K = 32 and sums them in fp32 (FP8 keys only).
    num_warps: None picks 8 for products of 128 x 128 and up, else 4.
    programs_per_sm: programs launched per multiprocessor (over row tiles x key chunks).
    tile_group: tiles whose pages are read from the block table at once (0: one read per
      tile, inside the pipelined loop, which then keeps only one tile in flight). The
      pipeline drains at the end of each group: large groups, few drains; up to 32 (a warp),
      picking a tile's page needs no barrier (64: two per tile on 8 warps).
    max_registers: a register cap a thread (CUDA's maxnreg), e.g. 128 for two programs of 8
      warps a multiprocessor; what does not fit spills (the queries' prologue, once).
    key_convert: how the e4m3fn keys become the bf16 operand. "cvt": the conversion
      instructions; "bits": from each byte's bits, two shifts, two masks and an or (the code
      x 2^-120, exact also for subnormal codes); "words": the same on int32 words of 4 bytes
      (5 operations per 4 keys' values). The queries then carry the 2^120 (2^119, below the
      bf16 maximum, and the weights x 2).
    repeat_epilogue: a benchmark probe, not for use: runs relu / weights / head sum twice
      (same scores), so the time difference is the epilogue's cost.
    unmasked_full_tiles: (tile_group > 0) the tiles before every row's position run without
      key, causal and chunk masks, in a loop of their own; the rest with them.
    """

    dot: str = "bf16"
    k_split: int = 1
    block_n: int = 128
    num_warps: int | None = None
    num_stages: int = 3
    programs_per_sm: int = 4
    tile_group: int = 64
    max_registers: int | None = None
    key_convert: str = "cvt"
    repeat_epilogue: bool = False
    unmasked_full_tiles: bool = False


DOTS = ("fp32", "bf16", "fp16", "fp8", "fp8_acc32", "fp8_acc64")
KEY_CONVERTS = ("cvt", "bits", "words")  # the kernel's KEY_CONVERT 0, 1, 2
FP8_ACC_INTERVALS = {"fp8_acc32": 32, "fp8_acc64": 64}  # the others: 0, no fp32 partial sums
INTERPRETER_CONFIG = IndexerScoreConfig(dot="fp32", block_n=64, num_warps=4, num_stages=1,
                                        programs_per_sm=1)
# The exact path on CUDA for MXFP4 keys (bf16 products: E2M1 x 2^e overflows fp16), round 1's
# fastest bf16 tiling on the H200 (issue #5).
CUDA_CONFIG = IndexerScoreConfig(dot="bf16", block_n=128, num_stages=4)
# FP8 keys on CUDA: fp16 products (exact, one conversion per two values), 64-key tiles on one
# warpgroup (255 registers: two programs a multiprocessor), pages of 32 tiles picked without
# a barrier, programs for one wave. Measured on the H200 (2026-11-29 s3 round 1, 16 requests x
# 4 rows, CUDA-graph replay): 0.031 / 0.175 / 1.361 ms at 16K / 128K / 1M (53-54% of the bf16
# matrix rate from 128K) vs 0.055 / 0.268 / 1.897 for round 2's bf16 "words" default with the
# same fix of int64 key offsets; same error (0.031 / 0.008 / 0.010 of the bound).
CUDA_FP8_KEYS_CONFIG = IndexerScoreConfig(dot="fp16", block_n=64, num_warps=4, num_stages=6,
                                          programs_per_sm=2, tile_group=32)
# Opt-in (`use_fp8_dot`, Hopper, e4m3fn keys): the fp8 tensor cores with fp32 sums every
# K = 32, on 64-key tiles, two programs a multiprocessor. 0.204 ms at 128K on the H200 (s3
# round 1: slower than the exact fp16 default), and its error is 4.2x the op's tolerance
# (1e-5 |score| + 1e-5 max |score|) at 128K: Hopper accumulates fp8 products with ~14 bits
# between the fp32 sums. Without the fp32 sums ("fp8"): 23x.
FP8_OPT_IN_CONFIG = IndexerScoreConfig(dot="fp8_acc32", block_n=64, num_warps=8,
                                       num_stages=6, max_registers=128)


# The launcher's `kernel` names: "triton" (this file's configurations), or the Gluon Hopper
# kernel (gluon_kernels/indexer_score_hopper.py, FP8 e4m3fn keys on sm_90) with its product:
# "fp16" exact, "fp16_ss" exact (the keys converted to FP16 in shared memory by a converter
# warpgroup, products pipelined; measured slower than "fp16" on the H200), "fp8_acc32" / "fp8"
# opt-in (outside the op's tolerance, as FP8_OPT_IN_CONFIG).
# None: indexer_score.default_kernel ("gluon_hopper" for graph-replayed launches on Hopper).
GLUON_HOPPER_PRODUCTS = {"gluon_hopper": "fp16", "gluon_hopper_ss": "fp16_ss",
                         "gluon_hopper_fp8_acc32": "fp8_acc32", "gluon_hopper_fp8": "fp8"}
KERNELS = ("triton", *GLUON_HOPPER_PRODUCTS)


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


def fp8_dot_config(kernel: object) -> IndexerScoreConfig:
    """The opt-in fp8 tensor-core configuration (outside the op's tolerance, see above)."""
    if runs_on_interpreter(kernel):
        return INTERPRETER_CONFIG  # the interpreter's products are fp32 whatever the dot
    target = driver.active.get_current_target()
    if target.backend == "cuda":
        if target.arch < 89:
            raise ValueError(f"the fp8 tensor cores need sm_89 or later, got sm_{target.arch}")
        return FP8_OPT_IN_CONFIG
    return replace(default_config(kernel), dot="fp8")  # ROCm: the default tiling
