"""What every benchmark shares: the measured limits of the device, timing, and result files.

A figure is reported as a ratio to a limit measured in the same run (DEVELOPERS.md):
- bytes moved per second against `measure_copy_bandwidth` (a device-to-device copy of 2 GiB),
- FLOP/s against `measure_matmul_rate` (a large BF16 GEMM through torch / cuBLAS / hipBLASLt),
and to a peer measured side by side. `write_result` stores one JSON file per benchmark run in
benchmarks/results/, named `YYYY-MM-DD_<gpu>_<bench>.json`, with the GPU, the software versions
and the commit.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def time_ms(fn: Callable[[], object], warmup: int = 10, rep: int = 50) -> float:
    """Median milliseconds of `fn` on the GPU (triton's do_bench: flushes L2 between runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def time_graph_ms(fn: Callable[[], object], rep: int = 100) -> float:
    """Median milliseconds of `fn` replayed from a CUDA graph (triton's do_bench_cudagraph).

    What the engine pays once it captures its decode step: no host launch overhead, which
    dominates `time_ms` for kernels shorter than ~50 us or made of several launches. `fn` must
    be capturable (no host syncs, no allocations whose addresses change between replays). To
    time what the engine's graph steps run, take the op from `engine_kernels().graph`.
    """
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def engine_kernels(device: torch.device | str = "cuda"):
    """The eager and graph tables the engine builds on this device (BF16 compute, FP8 latent
    and index keys, 128-token blocks): benchmarks time the kernels the engine runs."""
    from atomk31.ops import KernelContext, Target, select_kernels

    return select_kernels("auto", KernelContext.default_for(Target.of_device(device)))


def measure_copy_bandwidth(device: torch.device | str = "cuda", num_bytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), the memory roofline."""
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def measure_matmul_rate(device: torch.device | str = "cuda", n: int = 8192,
                        dtype: torch.dtype = torch.bfloat16) -> float:
    """FLOP per second of an n x n x n GEMM in `dtype`, the matrix roofline."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3)


def environment() -> dict:
    """GPU, software versions and commit, for the result file."""
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    # The device machine's copy of the tree may carry no .git, or a stale one (seen
    # 2026-11-29: an older HEAD), so a commit passed by the caller wins.
    commit = os.environ.get("ATOMK31_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=True,
                                    cwd=RESULTS_DIR.parent).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "hip": torch.version.hip,
            "python": platform.python_version(), "commit": commit,
            "date": _dt.date.today().isoformat()}


def write_result(bench: str, payload: dict, out_dir: Path | None = None) -> Path:
    """Write `payload` with the environment to `<out_dir>/YYYY-MM-DD_<gpu>_<bench>.json`."""
    env = environment()
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", env["gpu"]).strip("-").lower()
    out = (out_dir or RESULTS_DIR) / f"{env['date']}_{gpu}_{bench}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": bench, "environment": env, **payload}, indent=2) + "\n")
    return out
