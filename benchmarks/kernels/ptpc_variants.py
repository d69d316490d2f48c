"""What bench_ptpc_fp8.py times beside the peer and the engine's tables: the variant tables at
each (shape, M) (the Triton pointer kernel's tiles, the Gluon Hopper kernel's tiles and stages,
the TMA kernel of benchmarks/kernels/variants/ptpc_fp8_tma.py and its warp specialization), and
the host time of a launch of each kernel.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

KINDS = ("pointer", "gluon", "tma")


@dataclass(frozen=True)
class Variant:
    """One timed GEMM: a kernel kind (KINDS), its config or a function of (M, N, K) giving one
    (None: the kind's own tile choice), and whether to measure its fp32-output accumulation
    error (one more compile)."""

    label: str
    kind: str
    config: object = None
    measure_error: bool = False

    def config_for(self, m: int, n: int, k: int) -> object:
        return self.config(m, n, k) if callable(self.config) else self.config


def launcher(kind: str) -> Callable:
    """The kind's ``ptpc_linear_quantized`` launcher (x_q, x_scale, w_q, w_scale, out_dtype,
    config)."""
    if kind == "pointer":
        from atomk31.triton_kernels.ptpc_fp8 import ptpc_linear_quantized_triton
        return ptpc_linear_quantized_triton
    if kind == "gluon":
        from gluon_kernels.hopper.ptpc_fp8_launch import ptpc_linear_quantized_hopper
        return ptpc_linear_quantized_hopper
    if kind == "tma":
        from benchmarks.kernels.variants.ptpc_fp8_tma import ptpc_linear_quantized_tma
        return ptpc_linear_quantized_tma
    raise ValueError(f"unknown kernel kind {kind!r}; expected one of {KINDS}")


def gluon(block_n: int = 128, num_stages: int = 4, overlap_epilogue: bool = False):
    """A config of the Gluon Hopper kernel: 128 x block_n x 128 tiles."""
    from gluon_kernels.hopper.ptpc_fp8 import HopperGemmConfig

    return HopperGemmConfig(block_n, num_stages, overlap_epilogue)


def large_m(n: int, m: int) -> bool:
    """Where 128x128 tiles alone cover the H200's 132 SMs at 1024 tokens and more."""
    return m >= 1024 and ((m + 127) // 128) * ((n + 127) // 128) >= 132


def pointer_default(m: int, n: int, k: int):
    from atomk31.triton_kernels.ptpc_fp8 import pick_config

    return pick_config(m, n, k)


def hopper_variants(n: int, m: int) -> list[Variant]:
    """From 128 tokens, beside the engine's tables: the pointer kernel's own tiles, the TMA
    kernel's paired K tiles, the Gluon kernel's wide tiles with and without the overlapped
    epilogue, and up to 256 tokens its 128 x 64 and 6-stage 128 x 128 tiles. A variant whose
    config another already ran prints "same config as ..."."""
    from benchmarks.kernels.variants.ptpc_fp8_tma import LAGGED_CONFIG

    if m < 128:
        return []
    errors = m >= 1024
    variants = [Variant("pointer tiles", "pointer", pointer_default, measure_error=errors),
                Variant("tma lag2 128x128 s3", "tma", LAGGED_CONFIG, measure_error=errors),
                Variant("gluon 128x128 s4 ovl", "gluon", gluon(overlap_epilogue=True),
                        measure_error=errors),
                Variant("gluon 128x128 s4", "gluon", gluon(), measure_error=errors)]
    if m <= 256:
        # one wave or less of tiles: more K steps in flight per SM (6 x 32 KiB: 225 KiB of
        # shared memory with the bf16 output tile) where fewer SMs pull the weights
        variants += [Variant("gluon 128x64 s6", "gluon", gluon(block_n=64, num_stages=6)),
                     Variant("gluon 128x128 s6", "gluon", gluon(num_stages=6))]
    return variants


def variants_for(name: str, n: int, m: int, quick: bool) -> list[Variant]:
    """The variants timed beside the tables at (shape, M): the Hopper kernels from 128 tokens;
    outside --quick also the pointer kernel's other candidates."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig

    variants = hopper_variants(n, m)
    if quick:
        return variants
    if large_m(n, m):
        # information only: the pointer kernel without promotion (~1e-2 error: not equal
        # accuracy)
        variants.append(Variant("no promotion (info)", "pointer",
                                GemmConfig(128, 128, 128, num_warps=8, promote_every=None)))
    elif m <= 16:
        # 16x64 tiles, K steps of 256 in 4 stages or of 512 in 3
        variants += [Variant("16x64x256 s4", "pointer", GemmConfig(16, 64, 256)),
                     Variant("16x64x512 s3", "pointer", GemmConfig(16, 64, 512, num_stages=3))]
    return variants


def risky_variants_for(n: int, m: int, quick: bool) -> list[Variant]:
    """Variants run once every case has printed (not in --quick): Triton 3.6's Hopper warp
    specialization of the TMA kernel, which hung the H200 with host descriptors and stored
    wrong rows at 128 x 256 with device ones."""
    from benchmarks.kernels.variants.ptpc_fp8_tma import WARP_SPECIALIZED_CONFIG

    if quick or not large_m(n, m) or m < 4096:
        return []
    wide = dataclasses.replace(WARP_SPECIALIZED_CONFIG, block_n=256, num_stages=3, split_n=True)
    return [Variant("ws 128x128 dev", "tma", WARP_SPECIALIZED_CONFIG, measure_error=True),
            Variant("ws 128x256 splitN dev", "tma", wide, measure_error=True)]


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
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig
    from benchmarks.kernels.variants.ptpc_fp8_tma import LAGGED_CONFIG
    from gluon_kernels.hopper import ptpc_fp8 as kernel

    m, n = x_q.shape[0], w_q.shape[0]
    c = torch.empty(m, n, dtype=torch.bfloat16, device=x_q.device)
    descriptors = lambda: (kernel.descriptor(x_q, [64, 128]), kernel.descriptor(w_q, [128, 128]),
                           kernel.descriptor(c, [64, 128]))
    constexprs = (kernel.GROUP_M, 4, True)    # GROUP_M, NUM_STAGES, OVERLAP_EPILOGUE

    def compiled_launch():
        grid = (min(-(-m // 128) * -(-n // 128), kernel.sm_count(0)),)
        compiled = kernel.ptpc_gemm_hopper_kernel[grid](
            *descriptors(), x_scale, w_scale, m, n, x_q.shape[1], *constexprs, num_warps=4,
            maxnreg=kernel.KERNEL_MAX_REGISTERS)
        launch = compiled[grid + (1, 1)]      # a compiled kernel takes a 3-int grid
        return lambda: launch(*descriptors(), x_scale, w_scale, m, n, x_q.shape[1], *constexprs)
    calls = {
        "torch._scaled_mm": lambda: torch._scaled_mm(
            x_q, w_q.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :],
            out_dtype=torch.bfloat16),
        "triton pointer 64x128x256": lambda: launcher("pointer")(
            x_q, x_scale, w_q, w_scale, torch.bfloat16, GemmConfig(64, 128, 256, num_warps=8,
                                                                   num_stages=3)),
        "triton tma lag2": lambda: launcher("tma")(x_q, x_scale, w_q, w_scale, torch.bfloat16,
                                                   LAGGED_CONFIG),
        "gluon (the op)": lambda: launcher("gluon")(x_q, x_scale, w_q, w_scale, torch.bfloat16,
                                                    gluon(overlap_epilogue=True)),
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
