"""What bench_ptpc_fp8.py times beside the peer and the launcher's default: the variant tables at
each (shape, M) (Triton pointer / TMA configs, the Gluon Hopper kernel, Triton 3.6's warp
specialization), and the host time of a launch of each kernel.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Variant:
    """One timed GEMM: a config, or a function of (default config, M, N, K) giving one (None:
    the launcher's default), and whether to measure its fp32-output accumulation error (one
    more compile)."""

    label: str
    config: object = None
    measure_error: bool = False


def ws_config(**fields) -> Callable:
    """A variant of HOPPER_WS_CONFIG (Triton 3.6's warp-specialized 128x128x128 tiles, 4 warps,
    promotion per K tile, descriptors built in the kernel)."""
    def config(default, m, n, k):
        from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_WS_CONFIG

        return dataclasses.replace(HOPPER_WS_CONFIG, **fields)
    return config


def gluon(block_m: int = 128, block_n: int = 128, num_stages: int = 4, persistent: bool = True,
          overlap_epilogue: bool = False):
    """A config of the Gluon Hopper kernel (gluon_kernels/ptpc_fp8_hopper.py): block_m x block_n
    x 128 tiles, a TMA producer warp, one consumer warpgroup per 64 rows."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig

    return GemmConfig(block_m, block_n, 128, num_stages=num_stages, persistent=persistent,
                      kernel="gluon_hopper", overlap_epilogue=overlap_epilogue)


def large_m(n: int, m: int) -> bool:
    """Where the 128x128 TMA tiles alone cover the H200's 132 SMs at 1024 tokens and more."""
    return m >= 1024 and ((m + 127) // 128) * ((n + 127) // 128) >= 132


def replayed_default(default, m: int, n: int, k: int):
    """The launcher's choice for a launch replayed from a CUDA graph (the engine's decode steps:
    ptpc_fp8_config.gluon_config_on_hopper's replayed rule, no FLOP floor)."""
    from atomk31.triton_kernels.ptpc_fp8 import pick_config
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GRAPH_RULE

    return pick_config(m, n, k, HOPPER_GRAPH_RULE)


def hopper_variants(n: int, m: int) -> list[Variant]:
    """From 128 tokens, beside the default (the Gluon kernel where HOPPER_GLUON_CONFIG's rule
    takes the shape, else the Triton kernels): the default of graph-replayed launches, the
    other family's default, the Gluon kernel without the overlapped epilogue and (from 4096) in
    192 x 128 tiles, and up to 256 tokens its 128 x 64 tiles (o_proj M = 128: 112 tiles; session
    5: 0.031 ms graph, 0.06-0.16 eager) and 6-stage 128 x 128 tiles. A variant equal to the default prints "same config as
    default". Session 5 round 1 measured the rest (128 x 64 from 1024, 5 stages, one program per
    tile: slower)."""
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GLUON_CONFIG, HOPPER_TMA_CONFIG

    if m < 128:
        return []
    errors = m >= 1024
    variants = [Variant("replayed default", replayed_default, measure_error=errors),
                Variant("tma lag2 128x128 s3", HOPPER_TMA_CONFIG, measure_error=errors),
                Variant("gluon 128x128 s4 ovl", HOPPER_GLUON_CONFIG, measure_error=errors),
                Variant("gluon 128x128 s4", gluon(), measure_error=errors)]
    if m >= 4096:
        variants.append(Variant("gluon 192x128 s3", gluon(block_m=192, num_stages=3),
                                measure_error=True))
    if m <= 256:
        # one wave or less of tiles: more K steps in flight per SM (6 x 32 KiB: 225 KiB of
        # shared memory with the bf16 output tile) where fewer SMs pull the weights
        variants += [Variant("gluon 128x64 s6", gluon(block_n=64, num_stages=6)),
                     Variant("gluon 128x128 s6", gluon(num_stages=6))]
    return variants


def variants_for(name: str, n: int, m: int, quick: bool) -> list[Variant]:
    """The variants timed beside the default at (shape, M): the Hopper kernels from 128 tokens;
    outside --quick also the Triton kernels' earlier candidates."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig

    variants = hopper_variants(n, m)
    if quick:
        return variants
    if large_m(n, m):
        # the pointer kernel, the default before session 4 (a drain per 128-K tile), and,
        # information only, the same without promotion (~1e-2 error: not equal accuracy)
        variants += [Variant("pointer 128x128 w8 s4", GemmConfig(128, 128, 128, num_warps=8),
                             measure_error=True),
                     Variant("no promotion (info)", GemmConfig(128, 128, 128, num_warps=8,
                                                               promote_every=None))]
    elif m <= 16:
        # 16x64 tiles, K steps of 256 in 4 stages or of 512 in 3
        variants += [Variant("16x64x256 s4", GemmConfig(16, 64, 256)),
                     Variant("16x64x512 s3", GemmConfig(16, 64, 512, num_stages=3))]
    return variants


def risky_variants_for(n: int, m: int, quick: bool) -> list[Variant]:
    """Variants run once every case has printed (not in --quick): Triton 3.6's Hopper warp
    specialization, which hung the H200 with host descriptors (session 3) and stored wrong
    rows at 128 x 256 with device ones (session 4)."""
    if quick or not large_m(n, m) or m < 4096:
        return []
    return [Variant("ws 128x128 dev", ws_config(), measure_error=True),
            Variant("ws 128x256 splitN dev", ws_config(block_n=256, num_stages=3, split_n=True),
                    measure_error=True)]


def host_us_per_call(fn: Callable, calls: int = 200) -> float:
    """Host microseconds per call of fn, back to back with no sync (the GPU runs behind)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def launch_overhead(x_q, x_scale, w_q, w_scale) -> dict:
    """Host time per launch (us) of the peer, the Triton kernels and the Gluon kernel at one
    small shape, and of the Gluon launch's parts: its three TMA descriptors, and a launch of the
    compiled kernel that skips Triton's JIT dispatch (binder, specialization, cache key)."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig, ptpc_linear_quantized_triton
    from atomk31.triton_kernels.ptpc_fp8_config import HOPPER_GLUON_CONFIG, HOPPER_TMA_CONFIG
    from gluon_kernels import ptpc_fp8_hopper as gluon

    m, n = x_q.shape[0], w_q.shape[0]
    c = torch.empty(m, n, dtype=torch.bfloat16, device=x_q.device)
    descriptors = lambda: (gluon.descriptor(x_q, [64, 128]), gluon.descriptor(w_q, [128, 128]),
                           gluon.descriptor(c, [64, 128]))
    constexprs = (2, 8, 4, True)    # NUM_CONSUMERS, GROUP_M, NUM_STAGES, OVERLAP_EPILOGUE

    def compiled_launch():
        grid = (min(-(-m // 128) * -(-n // 128), gluon.sm_count(0)),)
        compiled = gluon.ptpc_gemm_hopper_kernel[grid](
            *descriptors(), x_scale, w_scale, m, n, x_q.shape[1], *constexprs, num_warps=4,
            maxnreg=gluon.KERNEL_MAX_REGISTERS[2])
        launch = compiled[grid + (1, 1)]      # a compiled kernel takes a 3-int grid
        return lambda: launch(*descriptors(), x_scale, w_scale, m, n, x_q.shape[1], *constexprs)
    calls = {
        "torch._scaled_mm": lambda: torch._scaled_mm(
            x_q, w_q.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :],
            out_dtype=torch.bfloat16),
        "triton pointer 64x128x256": lambda: ptpc_linear_quantized_triton(
            x_q, x_scale, w_q, w_scale, torch.bfloat16, GemmConfig(64, 128, 256, num_warps=8,
                                                                   num_stages=3)),
        "triton tma lag2": lambda: ptpc_linear_quantized_triton(
            x_q, x_scale, w_q, w_scale, torch.bfloat16, HOPPER_TMA_CONFIG),
        "gluon (the op)": lambda: ptpc_linear_quantized_triton(
            x_q, x_scale, w_q, w_scale, torch.bfloat16, HOPPER_GLUON_CONFIG),
        "gluon: 3 descriptors only": descriptors,
        "gluon: compiled, no JIT dispatch": compiled_launch,
    }
    result = {}
    for label, fn in calls.items():
        try:
            result[label] = host_us_per_call(fn() if fn is compiled_launch else fn)
            print(f"host us per launch, M = {m}: {label:>34} {result[label]:7.1f}", flush=True)
        except Exception as failure:   # a diagnostic: report, go on
            print(f"host us per launch: {label}: {type(failure).__name__}: {failure}"[:160])
    return result
