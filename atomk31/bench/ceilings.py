"""The device's ceilings, measured at the start of a benchmark run: copy bandwidth (the memory
roofline, bytes read + written per second of a large device-to-device copy) and the matrix rate
(FLOP/s of a large matmul in the compute dtype: BF16 8192^3 on a GPU).

On a CPU both are measured at small sizes in float32 and labelled "CPU": the ratios then say
how the engine's CPU path uses the machine, not what a GPU would do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

GPU_COPY_BYTES = 2 << 30       # 2 GiB copied (4 GiB moved): far past every cache level
CPU_COPY_BYTES = 64 << 20
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 512
NUM_TIMED_RUNS = 10


@dataclass(frozen=True)
class Ceilings:
    """Measured limits of one device; `label` names how they were measured."""

    device: str                 # "NVIDIA H200", "CPU"
    copy_bytes_per_s: float
    matmul_flop_per_s: float
    matmul_dtype: str
    label: str                  # e.g. "2 GiB device copy; bfloat16 8192^3 matmul"

    def to_dict(self) -> dict:
        return {"device": self.device, "copy_bytes_per_s": self.copy_bytes_per_s,
                "matmul_flop_per_s": self.matmul_flop_per_s, "matmul_dtype": self.matmul_dtype,
                "label": self.label}


def device_name(device: torch.device) -> str:
    """"NVIDIA H200" (the GPU's name) or "CPU"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device,
                   num_runs: int = NUM_TIMED_RUNS) -> float:
    """Median wall seconds of `fn` over `num_runs` runs after one warm-up, the device
    synchronized around each run."""
    fn()
    times = []
    for _ in range(num_runs):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    """Copy bandwidth and the `dtype` matrix rate of `device` (module docstring)."""
    on_gpu = device.type == "cuda"
    copy_bytes = GPU_COPY_BYTES if on_gpu else CPU_COPY_BYTES
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src), device)
    del src, dst
    n = GPU_MATMUL_N if on_gpu else CPU_MATMUL_N
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    matmul_s = median_seconds(lambda: a @ b, device)
    dtype_name = str(dtype).removeprefix("torch.")
    label = f"{copy_bytes / 2**20:.0f} MiB {'device' if on_gpu else 'host'} copy; " \
            f"{dtype_name} {n}^3 matmul"
    return Ceilings(device_name(device), 2 * copy_bytes / copy_s, 2 * n**3 / matmul_s,
                    dtype_name, label)
