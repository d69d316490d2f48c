"""Triton top-k (k = 2048) over 64 rows of 128K to 1M scores, against torch.topk.

Cases: random normal scores at 128K, 256K and 1M positions; at 128K also all scores equal
(every row overflows its candidate buffer: the one-program-per-row rescan) and scores rising
with the position (ties in runs of 4). Every variant's result is checked against the op's
torch implementation (a stable sort: the exact definition) on every case.

Figures per case: eager and CUDA-graph times of the Triton top-k (the default launch: the
stream collect, finish_split 1, threshold_ways 64 and parts 4, stage 1 at 4 programs per SM;
the fused slot output; tuning variants: stage 1 programs per row, finish warps and programs
per row, search ways of the finish and of stage 2, stage 2's parts, round 2's collect, the
stream collect's programs per multiprocessor and tile), the stages alone (graph: group maxima, + threshold,
+ collect, + overflow check; the rest is the finish), torch.topk (no tie rule; the peer the
goal names) eager and graph, and the exact torch op. Ratios: torch.topk time over ours (same
mode), and bytes per second (the scores read once) over the copy bandwidth of the same run.
The last table lines compare the graph times with round 2's (ROUND2_US, H200, 2026-11-29).

Usage: python -m benchmarks.kernels.bench_topk [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from atomk31.ops.topk import positions_to_slots_torch, topk_positions_torch
from atomk31.triton_kernels.topk import topk_triton
from benchmarks.common import measure_copy_bandwidth, time_ms, write_result

NUM_ROWS = 64
K = 2048
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
# name: (length, kind of scores)
CASES = {
    "normal_128K": (131072, "normal"),
    "normal_256K": (262144, "normal"),
    "normal_1M": (1048576, "normal"),
    "equal_128K": (131072, "equal"),
    "rising_128K": (131072, "rising"),
}
QUICK_CASES = ["normal_128K", "normal_1M", "equal_128K", "rising_128K"]
# Round 2 on the H200, CUDA graph, us: (default launch = finish_split 8, best variant =
# split1); round 1: 220 / 769 us at 128K / 1M.
ROUND2_US = {"normal_128K": (238.8, 138.8), "normal_1M": (730.0, 623.4),
             "equal_128K": (191.0, 138.6), "rising_128K": (196.4, 94.0)}
STAGE_NAMES = ("group_max", "+threshold", "+collect", "+overflow")
# Also printed: stages 1-3 with round 2's collect, stage 1 with its prefetch.
EXTRA_STAGE_NAMES = (*STAGE_NAMES, "+collect_round2", "group_max(prefetch)")
VARIANT_NAMES = ("ppr_x0.5", "ppr_x2", "finish_warps8", "split4", "split8", "ways64",
                 "threshold_ways16", "threshold_parts1", "group_max_prefetch",
                 "collect_round2", "collect_ppsm2", "collect_ppsm8", "collect_block1024")


def graph_ms(fn: Callable[[], object]) -> float:
    """Median ms of replaying `fn` captured in a CUDA graph (no launch overhead)."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay)


def make_scores(length: int, kind: str) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(NUM_ROWS, length, device=DEVICE)
    if kind == "equal":
        return torch.full((NUM_ROWS, length), 0.5, device=DEVICE)
    position = torch.arange(length, device=DEVICE, dtype=torch.float32)
    return (position // 4)[None].repeat(NUM_ROWS, 1)


def bench_case(name: str, copy_bw: float, programs_per_sm: int) -> dict:
    length, kind = CASES[name]
    scores = make_scores(length, kind)
    lengths = torch.full((NUM_ROWS,), length, device=DEVICE)
    lengths[1::4] -= 1  # causal rows of verification end a little earlier
    blocks, num_requests = -(-length // BLOCK_SIZE), NUM_ROWS // 4  # 4 rows per request
    block_table = torch.randperm(num_requests * blocks, device=DEVICE).view(num_requests, blocks)
    row_request = torch.arange(num_requests, device=DEVICE).repeat_interleave(4)
    want = topk_positions_torch(scores, K, lengths)
    block_table, row_request = block_table.int(), row_request.int()
    want_slots = positions_to_slots_torch(want, block_table, row_request, BLOCK_SIZE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_row = -(-programs_per_sm * sms // NUM_ROWS)
    variants = {
        "triton": {},
        "ppr_x0.5": {"programs_per_row": max(1, per_row // 2)},
        "ppr_x2": {"programs_per_row": 2 * per_row},
        "finish_warps8": {"finish_warps": 8},
        "split4": {"finish_split": 4},
        "split8": {"finish_split": 8},
        "ways64": {"search_ways": 64},
        "threshold_ways16": {"threshold_ways": 16},
        "threshold_parts1": {"threshold_parts": 1},
        "group_max_prefetch": {"group_max_prefetch": True},
        "collect_round2": {"collect": "round2"},
        "collect_ppsm2": {"collect_programs_per_sm": 2},
        "collect_ppsm8": {"collect_programs_per_sm": 8},
        "collect_block1024": {"collect_block": 1024},
    }
    result = {"case": name, "rows": NUM_ROWS, "length": length, "k": K, "scores": kind,
              "exact": {},
              "ms": {}, "graph_ms": {}}
    for variant, options in variants.items():
        try:  # a tuning variant that fails must not hide the others
            got = topk_triton(scores, K, lengths, **options)
            result["exact"][variant] = bool(torch.equal(got, want))
            result["graph_ms"][variant] = graph_ms(
                lambda: topk_triton(scores, K, lengths, **options))
        except Exception as error:  # noqa: BLE001 (reported in the table and the JSON)
            result["exact"][variant] = f"{type(error).__name__}: {error}"[:300]
            result["graph_ms"][variant] = float("nan")
    slots = topk_triton(scores, K, lengths, block_table, row_request, BLOCK_SIZE)
    result["exact"]["triton_slots"] = bool(torch.equal(slots, want_slots))
    result["ms"]["triton"] = time_ms(lambda: topk_triton(scores, K, lengths))
    result["ms"]["triton_slots"] = time_ms(
        lambda: topk_triton(scores, K, lengths, block_table, row_request, BLOCK_SIZE))
    for stages, stage_name in enumerate(STAGE_NAMES, start=1):
        result["graph_ms"][stage_name] = graph_ms(
            lambda: topk_triton(scores, K, lengths, stages=stages))
    result["graph_ms"]["group_max(prefetch)"] = graph_ms(
        lambda: topk_triton(scores, K, lengths, stages=1, group_max_prefetch=True))
    result["graph_ms"]["+collect_round2"] = graph_ms(
        lambda: topk_triton(scores, K, lengths, stages=3, collect="round2"))
    result["ms"]["torch.topk"] = time_ms(lambda: torch.topk(scores, K, dim=1))
    result["graph_ms"]["torch.topk"] = graph_ms(lambda: torch.topk(scores, K, dim=1))
    result["ms"]["torch_exact"] = time_ms(lambda: topk_positions_torch(scores, K, lengths))
    num_bytes = scores.numel() * 4
    result["bandwidth_fraction"] = {
        f"{mode}:{variant}": num_bytes / (ms * 1e-3) / copy_bw
        for mode in ("ms", "graph_ms") for variant, ms in result[mode].items()}
    result["speedup_vs_torch_topk"] = result["ms"]["torch.topk"] / result["ms"]["triton"]
    result["graph_speedup_vs_torch_topk"] = (result["graph_ms"]["torch.topk"]
                                             / result["graph_ms"]["triton"])
    return result


def print_table(copy_bw: float, results: list[dict]) -> None:
    print(f"copy {copy_bw / 1e12:.2f} TB/s; times in us (g = CUDA graph); "
          f"x = torch.topk time / ours; BW = scores bytes / time / copy bandwidth")
    for r in results:
        g, e = r["graph_ms"], r["ms"]
        bad = {v: ok for v, ok in r["exact"].items() if ok is not True}
        print(f"{r['scores']:>6} {r['rows']}x{r['length']:<8} exact={'all' if not bad else bad}")
        print(f"   eager: triton {e['triton'] * 1e3:7.1f} slots {e['triton_slots'] * 1e3:7.1f}"
              f" topk {e['torch.topk'] * 1e3:7.1f} x{r['speedup_vs_torch_topk']:5.2f}"
              f" exact-torch {e['torch_exact'] * 1e3:7.1f}")
        print(f"   graph: triton {g['triton'] * 1e3:7.1f} topk {g['torch.topk'] * 1e3:7.1f}"
              f" x{r['graph_speedup_vs_torch_topk']:5.2f}"
              f" BW {r['bandwidth_fraction']['graph_ms:triton']:5.1%} | stages "
              + " ".join(f"{s} {g[s] * 1e3:.1f}" for s in EXTRA_STAGE_NAMES))
        print("   graph variants: " + " ".join(f"{v} {g[v] * 1e3:.1f}" for v in VARIANT_NAMES))
    print("summary (graph us): case: round2 default / round2 best -> now default, best variant")
    for r in results:
        g = r["graph_ms"]
        timed = {v: ms for v, ms in g.items() if v in VARIANT_NAMES and r["exact"][v] is True}
        best = min(timed, key=timed.get) if timed else "none"
        before = ROUND2_US.get(r["case"], (float("nan"), float("nan")))
        print(f"   {r['case']:<12} {before[0]:6.1f} / {before[1]:6.1f} -> {g['triton'] * 1e3:6.1f}"
              f", {best} {timed.get(best, float('nan')) * 1e3:6.1f}"
              f"  torch.topk {g['torch.topk'] * 1e3:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_CASES}")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=None)
    parser.add_argument("--programs-per-sm", type=int, default=4,
                        help="the default launch's programs per multiprocessor (variants x0.5, x2)")
    args = parser.parse_args()
    cases = args.cases or (QUICK_CASES if args.quick else list(CASES))
    torch.manual_seed(0)
    copy_bw = measure_copy_bandwidth()
    results = [bench_case(name, copy_bw, args.programs_per_sm) for name in cases]
    path = write_result("triton_topk", {"copy_bandwidth_Bps": copy_bw, "results": results},
                        out_dir=args.out)
    print_table(copy_bw, results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
