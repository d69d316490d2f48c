"""Triton top-k (k = 2048) over 64 rows of 128K to 1M scores, against torch.topk.

Cases: random normal scores at 128K, 256K and 1M positions; at 128K also all scores equal
(every row overflows its candidate buffer: the one-program-per-row rescan) and scores rising
with the position (ties in runs of 4). Every variant's result is checked against the op's
torch implementation (a stable sort: the exact definition) on every case before it is timed.

Times are CUDA-graph replays (`time_graph_ms`: what a captured decode step pays; the scores
stay in L2 between replays where they fit, as after the indexer that writes them); the
default launch, round 2's and the lane collect are also timed as round 2 did (`time_ms` of a
graph replay: L2 flushed before each), eagerly, and stage by stage (cumulative graph times of
the first stages alone; "all" is the whole launch). Variants: "r2" is round 2's final launch;
"lane", "fwarps32" (the select finish and stage 2 at 32 warps) and their combination are
what a default may move to; the others change one option of the defaults. Ratios: torch.topk time over ours (same timing),
and the scores' bytes read once per time over the copy bandwidth of the same run.

Usage: python -m benchmarks.kernels.bench_topk [--out DIR] [--quick] [--cases ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from atomk31.ops.topk import positions_to_slots_torch, topk_positions_torch
from atomk31.triton_kernels.topk import topk_triton
from benchmarks.common import measure_copy_bandwidth, time_graph_ms, time_ms, write_result

NUM_ROWS = 64
K = 2048
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
GRAPH_REP_MS = 20
# name: (length, kind of scores)
CASES = {
    "normal_128K": (131072, "normal"),
    "normal_256K": (262144, "normal"),
    "normal_1M": (1048576, "normal"),
    "equal_128K": (131072, "equal"),
    "rising_128K": (131072, "rising"),
}
QUICK_CASES = ["normal_128K", "normal_1M", "equal_128K", "rising_128K"]
# Round 2's final run on the H200 (2026-11-29), graph replay with L2 flushed, us.
ROUND2_US = {"normal_128K": 124.8, "normal_1M": 475.0, "equal_128K": 126.9,
             "rising_128K": 93.7}
# Round 2's final launch (the launcher's defaults then).
R2 = {"collect": "stream", "threshold_slack": -1, "group_max_stages": 1,
      "programs_per_row": "x2"}
# Timed on every case: the defaults, round 2's launch, and the variants a default may move to.
MAIN_VARIANTS = {
    "triton": {},  # the launcher's defaults
    "r2": R2,
    "lane": {"collect": "lane"},
    "fwarps32": {"finish_warps": 32},
    "lane+fwarps32": {"collect": "lane", "finish_warps": 32},
}
# Timed on the normal cases only: one option of the defaults changed.
TUNING_VARIANTS = {
    "exact T0": {"threshold_slack": -1},
    "gmax s1": {"group_max_stages": 1},
    "ppr x2": {"programs_per_row": "x2"},
    "lane ppsm32": {"collect": "lane", "collect_programs_per_sm": 32},
    "lane stages4": {"collect": "lane", "stream_stages": 4},
}
STAGED = ("triton", "r2", "lane")  # variants also timed stage by stage
STAGE_NAMES = ("gmax", "+thr", "+coll", "+ovf", "all")


def make_scores(length: int, kind: str) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(NUM_ROWS, length, device=DEVICE)
    if kind == "equal":
        return torch.full((NUM_ROWS, length), 0.5, device=DEVICE)
    position = torch.arange(length, device=DEVICE, dtype=torch.float32)
    return (position // 4)[None].repeat(NUM_ROWS, 1)


def flushed_graph_ms(fn: Callable[[], object]) -> float:
    """Round 2's graph time: one capture of `fn`, replays timed with L2 flushed before each."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay)


def resolve(options: dict) -> dict:
    """Options with programs_per_row "x2" made a number: round 2's default (4 programs per
    multiprocessor over all rows), twice round 3's."""
    if options.get("programs_per_row") != "x2":
        return options
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return {**options, "programs_per_row": -(-4 * sms // NUM_ROWS)}


def check_and_time(result: dict, name: str, run: Callable[[], torch.Tensor],
                   want: torch.Tensor, is_timed: bool = True) -> None:
    """Exactness first, then the graph time; a failing variant is reported, not raised, so
    it cannot hide the others."""
    try:
        got = run()
        result["exact"][name] = bool(torch.equal(got, want))
        result["graph_ms"][name] = (time_graph_ms(run, rep=GRAPH_REP_MS) if is_timed
                                    else float("nan"))
    except Exception as error:  # noqa: BLE001 (reported in the table and the JSON)
        result["exact"][name] = f"{type(error).__name__}: {error}"[:300]
        result["graph_ms"][name] = float("nan")


def bench_case(name: str, copy_bw: float, tuning: bool) -> dict:
    length, kind = CASES[name]
    scores = make_scores(length, kind)
    lengths = torch.full((NUM_ROWS,), length, device=DEVICE)
    lengths[1::4] -= 1  # causal rows of verification end a little earlier
    blocks, num_requests = -(-length // BLOCK_SIZE), NUM_ROWS // 4  # 4 rows per request
    block_table = torch.randperm(num_requests * blocks, device=DEVICE).view(num_requests, blocks)
    block_table = block_table.int()
    row_request = torch.arange(num_requests, device=DEVICE).repeat_interleave(4).int()
    want = topk_positions_torch(scores, K, lengths)
    want_slots = positions_to_slots_torch(want, block_table, row_request, BLOCK_SIZE)
    result = {"case": name, "rows": NUM_ROWS, "length": length, "k": K, "scores": kind,
              "exact": {}, "graph_ms": {}, "flushed_graph_ms": {}, "ms": {}, "stages_ms": {}}
    variants = {**MAIN_VARIANTS, **(TUNING_VARIANTS if tuning else {})}
    variants = {name: resolve(options) for name, options in variants.items()}
    for variant, options in variants.items():
        check_and_time(result, variant, lambda o=options: topk_triton(scores, K, lengths, **o),
                       want)
    for variant, options in MAIN_VARIANTS.items():
        options = variants[variant]
        check_and_time(result, f"{variant} slots", lambda o=options: topk_triton(
            scores, K, lengths, block_table, row_request, BLOCK_SIZE, **o), want_slots,
            is_timed=variant == "triton")
        if variant in STAGED and result["exact"][variant] is True:
            run = (lambda o=options: topk_triton(scores, K, lengths, **o))
            result["flushed_graph_ms"][variant] = flushed_graph_ms(run)
            result["ms"][variant] = time_ms(run)
            result["stages_ms"][variant] = [
                time_graph_ms(lambda s=stages, o=options: topk_triton(
                    scores, K, lengths, stages=s, **o), rep=GRAPH_REP_MS)
                for stages in range(1, 5)] + [result["graph_ms"][variant]]
    peer = lambda: torch.topk(scores, K, dim=1)  # noqa: E731 (no tie rule; the goal's peer)
    result["graph_ms"]["torch.topk"] = time_graph_ms(peer, rep=GRAPH_REP_MS)
    result["flushed_graph_ms"]["torch.topk"] = flushed_graph_ms(peer)
    result["ms"]["torch.topk"] = time_ms(peer)
    result["ms"]["torch_exact"] = time_ms(lambda: topk_positions_torch(scores, K, lengths))
    num_bytes = scores.numel() * 4
    result["bandwidth_fraction"] = {variant: num_bytes / (ms * 1e-3) / copy_bw
                                    for variant, ms in result["graph_ms"].items()}
    return result


def print_header(copy_bw: float) -> None:
    print(f"copy {copy_bw / 1e12:.2f} TB/s. us; graph = CUDA graph replay (L2 kept), flushed = "
          "round 2's timing (L2 flushed); x = torch.topk / ours (graph); BW = scores bytes "
          "once / time / copy bw; err: exact match with the torch op (no tolerance)", flush=True)


def print_case(copy_bw: float, r: dict) -> None:
    g, f, e = r["graph_ms"], r["flushed_graph_ms"], r["ms"]
    peer = g["torch.topk"]
    floor_us = r["rows"] * r["length"] * 4 / copy_bw * 1e6
    print(f"{r['case']} {r['rows']}x{r['length']}: floor {floor_us:.1f} us; torch.topk graph "
          f"{peer * 1e3:.1f} flushed {f['torch.topk'] * 1e3:.1f} eager "
          f"{e['torch.topk'] * 1e3:.1f}; exact torch op eager {e['torch_exact'] * 1e3:.0f}; "
          f"round 2 final {ROUND2_US.get(r['case'], float('nan')):.1f} (flushed)")
    for variant, ms in g.items():
        if variant == "torch.topk":
            continue
        ok = r["exact"][variant]
        extra = ""
        if variant in f:
            extra = f" flushed {f[variant] * 1e3:6.1f} eager {e[variant] * 1e3:6.1f}"
        if variant in r["stages_ms"]:
            extra += " | " + " ".join(f"{s} {t * 1e3:.1f}" for s, t in zip(
                STAGE_NAMES, r["stages_ms"][variant]))
        print(f"   {variant:<19} {ms * 1e3:7.1f} x{peer / ms:5.2f} BW "
              f"{r['bandwidth_fraction'][variant]:5.1%} "
              f"{'exact' if ok is True else 'WRONG ' + str(ok)}{extra}", flush=True)


def print_summary(results: list[dict]) -> None:
    print("summary (graph us): case: torch.topk | r2 | defaults | best exact variant")
    for r in results:
        g = r["graph_ms"]
        timed = {v: ms for v, ms in g.items() if v != "torch.topk" and r["exact"][v] is True
                 and not v.endswith(" slots") and ms == ms}
        best = min(timed, key=timed.get) if timed else "none"
        print(f"   {r['case']:<12} {g['torch.topk'] * 1e3:6.1f} | {g['r2'] * 1e3:6.1f} | "
              f"{g['triton'] * 1e3:6.1f} x{g['torch.topk'] / g['triton']:4.2f} | {best} "
              f"{timed.get(best, float('nan')) * 1e3:6.1f} "
              f"x{g['torch.topk'] / timed.get(best, float('nan')):4.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_CASES}")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=None)
    args = parser.parse_args()
    cases = args.cases or (QUICK_CASES if args.quick else list(CASES))
    torch.manual_seed(0)
    copy_bw = measure_copy_bandwidth()
    print_header(copy_bw)
    results = []
    for name in cases:
        results.append(bench_case(name, copy_bw, tuning=CASES[name][1] == "normal"))
        print_case(copy_bw, results[-1])
    path = write_result("triton_topk", {"copy_bandwidth_Bps": copy_bw, "results": results},
                        out_dir=args.out)
    print_summary(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
