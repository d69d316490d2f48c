"""atomk31/bench/ceilings.py: the memory and matrix ceilings, measured (on a CPU here)."""

from __future__ import annotations

import torch

from atomk31.bench.ceilings import measure_ceilings, median_seconds


def test_cpu_ceilings_are_positive_and_say_cpu():
    c = measure_ceilings(torch.device("cpu"), torch.float32)
    assert c.device == "CPU" and c.matmul_dtype == "float32"
    assert c.copy_bytes_per_s > 1e8 and c.matmul_flop_per_s > 1e8
    assert c.label == "64 MiB host copy; float32 512^3 matmul"
    assert set(c.to_dict()) == {"device", "copy_bytes_per_s", "matmul_flop_per_s",
                                "matmul_dtype", "label"}


def test_median_seconds_runs_once_untimed_then_times_each_run():
    calls = []
    seconds = median_seconds(lambda: calls.append(1), torch.device("cpu"), num_runs=4)
    assert len(calls) == 5 and 0 <= seconds < 0.1
