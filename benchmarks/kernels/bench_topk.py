"""Triton radix top-k (k = 2048) over 64 rows of 128K to 1M scores, against torch.topk.

Figures: time against torch.topk on the same scores (no tie rule; the peer the goal names)
and against the op's torch implementation (a stable sort: the exact definition), whether
the result equals that definition, and bytes per second (the scores read once) against the
copy bandwidth measured in the same run. Also the fused slot output (`topk_slots`), and both
top-k peers replayed from CUDA graphs (how a decode step runs them): the radix select is
five launches, so eager timings of short rows include Python launch overhead.

Usage: python -m benchmarks.kernels.bench_topk [--out DIR] [--lengths 131072 ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from atomk31.ops.topk import topk_positions_torch
from atomk31.triton_kernels.topk import topk_triton
from benchmarks.common import measure_copy_bandwidth, time_ms, write_result

NUM_ROWS = 64
K = 2048
LENGTHS = [131072, 262144, 524288, 1048576]
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels


def graph_ms(fn: Callable[[], object]) -> float:
    """Median ms of replaying `fn` captured in a CUDA graph (no launch overhead)."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay)


def bench_length(length: int, copy_bw: float) -> dict:
    scores = torch.randn(NUM_ROWS, length, device=DEVICE)
    lengths = torch.full((NUM_ROWS,), length, device=DEVICE)
    # Causal rows of verification: the last rows of each request end a little earlier.
    lengths[1::4] -= 1
    blocks = -(-length // BLOCK_SIZE)
    block_table = torch.randperm(16 * blocks, device=DEVICE).view(16, blocks).int()
    row_request = torch.arange(16, device=DEVICE).repeat_interleave(4).to(torch.int32)
    got = topk_triton(scores, K, lengths)
    result = {"rows": NUM_ROWS, "length": length, "k": K,
              "exact": bool(torch.equal(got, topk_positions_torch(scores, K, lengths)))}
    variants = {
        "triton": lambda: topk_triton(scores, K, lengths),
        "triton_slots": lambda: topk_triton(scores, K, lengths, block_table, row_request,
                                            BLOCK_SIZE),
        "torch.topk": lambda: torch.topk(scores, K, dim=1),
        "torch_exact_sort": lambda: topk_positions_torch(scores, K, lengths),
    }
    num_bytes = scores.numel() * 4
    for name, fn in variants.items():
        ms = time_ms(fn)
        result[name] = {"ms": ms, "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw}
    for name in ("triton", "torch.topk"):
        result[f"{name}_graph"] = {"ms": graph_ms(variants[name])}
    result["speedup_vs_torch_topk"] = result["torch.topk"]["ms"] / result["triton"]["ms"]
    result["graph_speedup_vs_torch_topk"] = (result["torch.topk_graph"]["ms"]
                                             / result["triton_graph"]["ms"])
    result["speedup_vs_torch_exact"] = result["torch_exact_sort"]["ms"] / result["triton"]["ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = measure_copy_bandwidth()
    results = [bench_length(n, copy_bw) for n in args.lengths]
    path = write_result("triton_topk", {"copy_bandwidth_Bps": copy_bw, "results": results},
                        out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    print(f"{'rows x length':>16} {'exact':>5} {'triton ms':>9} {'of BW':>6} {'slots ms':>8} "
          f"{'topk ms':>8} {'x topk':>6} {'sort ms':>8} {'graph: triton':>13} {'topk':>6} "
          f"{'x topk':>6}")
    for r in results:
        print(f"{r['rows']:>5} x {r['length']:>8} {str(r['exact']):>5} "
              f"{r['triton']['ms']:9.3f} {r['triton']['bandwidth_fraction']:6.1%} "
              f"{r['triton_slots']['ms']:8.3f} {r['torch.topk']['ms']:8.3f} "
              f"{r['speedup_vs_torch_topk']:6.2f} {r['torch_exact_sort']['ms']:8.3f} "
              f"{r['triton_graph']['ms']:13.3f} {r['torch.topk_graph']['ms']:6.3f} "
              f"{r['graph_speedup_vs_torch_topk']:6.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
