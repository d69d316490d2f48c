"""Triton top-k (k = 2048) over 64 rows of 128K to 1M scores, against torch.topk.

Cases: random normal scores at 128K, 256K and 1M positions; at 128K also all scores equal
(every row overflows its candidate buffer: the one-program-per-row rescan) and scores rising
with the position (ties in runs of 4). Every variant's result is checked against the op's
torch implementation (a stable sort, then the selected positions in ascending order: the
exact definition) on every case before it is timed.

Times are CUDA-graph replays (`time_graph_ms`: what a captured decode step pays; the scores
stay in L2 between replays where they fit, as after the indexer that writes them); "triton"
and "split" are also timed eagerly (`time_ms`). Variants (a `TopkConfig` each): "triton" is
the launcher's defaults (at 64 rows on NVIDIA: stage 1 one program per row that also finds
T0, the staged collect ranking candidates with warp ballots, the overflow rescan inside the
finish, whose search runs 128 ways); "split" stages 1 and 1b apart, the overflow kernel, 64
ways (the defaults below 64 rows and on AMD, but the ways); "ovf kernel" the defaults with
the overflow rescan in its own kernel (faster when rows overflow: the all-equal case); the
tuning variants change one option of the defaults ("coll 24/sm": 24 one-warp collect
programs per multiprocessor instead of 16). Earlier rounds (stage-by-stage timings, the warp
collect, programmatic dependent launch, since removed): benchmarks/NOTES.md.
Peers from the same run: torch.topk (best first, no tie rule: the goal's peer) and
torch.topk followed by a sort of its positions (the same output order as ours, for honesty).
Ratios: torch.topk time over ours (graph), and the scores' bytes read once per time over the
copy bandwidth of the same run.

Usage: python -m benchmarks.kernels.bench_topk [--out DIR] [--quick] [--cases ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from atomk31.ops.topk import positions_to_slots_torch, topk_positions_torch
from atomk31.triton_kernels.topk import topk_triton
from atomk31.triton_kernels.topk_config import TopkConfig
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
# Timed on every case: the defaults and the other paths a default takes elsewhere.
MAIN_VARIANTS = {
    "triton": TopkConfig(),  # the launcher's defaults
    "split": TopkConfig(fuse_threshold=False, fuse_overflow=False, search_ways=64),
    "ovf kernel": TopkConfig(fuse_overflow=False),
}
# Timed on the normal cases only: one option of the defaults changed.
TUNING_VARIANTS = {
    "coll 24/sm": TopkConfig(collect_programs_per_sm=24),
    "ways64": TopkConfig(search_ways=64),
}
STAGED = ("triton", "split")  # also timed eagerly
PEERS = ("torch.topk", "torch.topk+sort")


def make_scores(length: int, kind: str) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(NUM_ROWS, length, device=DEVICE)
    if kind == "equal":
        return torch.full((NUM_ROWS, length), 0.5, device=DEVICE)
    position = torch.arange(length, device=DEVICE, dtype=torch.float32)
    return (position // 4)[None].repeat(NUM_ROWS, 1)


def check_and_time(result: dict, name: str, run: Callable[[], torch.Tensor],
                   want: torch.Tensor, is_timed: bool = True) -> None:
    """Exactness first, then the graph time; a failing variant is reported, not raised, so
    it cannot hide the others."""
    try:
        got = run()
        is_exact = bool(torch.equal(got, want))
        result["exact"][name] = is_exact if is_exact else (
            f"{int((got != want).sum())} of {want.numel()} entries differ")
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
              "exact": {}, "graph_ms": {}, "ms": {}}
    # The peers first, so that every variant's row prints its ratios as soon as it is timed.
    peers = {"torch.topk": lambda: torch.topk(scores, K, dim=1),
             "torch.topk+sort": lambda: torch.sort(torch.topk(scores, K, dim=1).indices,
                                                   dim=1)}
    for peer, run in peers.items():
        result["graph_ms"][peer] = time_graph_ms(run, rep=GRAPH_REP_MS)
        result["ms"][peer] = time_ms(run)
    result["ms"]["torch_exact"] = time_ms(lambda: topk_positions_torch(scores, K, lengths))
    print_case(result, copy_bw)
    variants = {**MAIN_VARIANTS, **(TUNING_VARIANTS if tuning else {})}
    for variant, config in variants.items():
        check_and_time(result, variant,
                       lambda c=config: topk_triton(scores, K, lengths, config=c), want)
        if variant in MAIN_VARIANTS:
            check_and_time(result, f"{variant} slots", lambda c=config: topk_triton(
                scores, K, lengths, block_table, row_request, BLOCK_SIZE, config=c),
                want_slots, is_timed=variant in STAGED)
        if variant in STAGED and result["exact"][variant] is True:
            result["ms"][variant] = time_ms(
                lambda c=config: topk_triton(scores, K, lengths, config=c))
        print_variant(result, variant, copy_bw)
    num_bytes = scores.numel() * 4
    result["bandwidth_fraction"] = {variant: num_bytes / (ms * 1e-3) / copy_bw
                                    for variant, ms in result["graph_ms"].items()}
    return result


def print_header(copy_bw: float) -> None:
    print(f"copy {copy_bw / 1e12:.2f} TB/s. us, CUDA graph replay (L2 kept); x = torch.topk / "
          "ours, xs = torch.topk+sort / ours (graph); BW = scores bytes once / time / copy bw; "
          "exact: equal to the torch op (no tolerance); eager = time_ms", flush=True)


def print_case(r: dict, copy_bw: float) -> None:
    g, e = r["graph_ms"], r["ms"]
    floor_us = r["rows"] * r["length"] * 4 / copy_bw * 1e6
    print(f"{r['case']} {r['rows']}x{r['length']}: floor (scores read once) {floor_us:.1f} us; "
          f"torch.topk {g['torch.topk'] * 1e3:.1f} (eager {e['torch.topk'] * 1e3:.1f}), "
          f"torch.topk+sort {g['torch.topk+sort'] * 1e3:.1f}; exact torch op eager "
          f"{e['torch_exact'] * 1e3:.0f}", flush=True)


def print_variant(r: dict, variant: str, copy_bw: float) -> None:
    """The variant's rows as soon as it is timed (a step killed at its limit keeps them)."""
    g = r["graph_ms"]
    for name in (variant, f"{variant} slots"):
        if name not in g:
            continue
        ok = r["exact"][name]
        verdict = "exact" if ok is True else f"WRONG {ok}"
        if g[name] != g[name]:  # checked, not timed
            print(f"   {name:<20} {'':>7} (checked only) {verdict}", flush=True)
            continue
        us = g[name] * 1e3
        fraction = r["rows"] * r["length"] * 4 / (us * 1e-6) / copy_bw
        extra = f" eager {r['ms'][name] * 1e3:6.1f}" if name in r["ms"] else ""
        print(f"   {name:<20} {us:7.1f} x{g['torch.topk'] / g[name]:5.2f} "
              f"xs{g['torch.topk+sort'] / g[name]:5.2f} BW {fraction:5.1%} "
              f"{verdict}{extra}", flush=True)


def print_summary(results: list[dict]) -> None:
    print("summary (graph us): case: torch.topk | defaults | best exact variant")
    for r in results:
        g = r["graph_ms"]
        timed = {v: ms for v, ms in g.items() if v not in PEERS and r["exact"][v] is True
                 and not v.endswith(" slots") and ms == ms}
        best = min(timed, key=timed.get) if timed else "none"
        print(f"   {r['case']:<12} {g['torch.topk'] * 1e3:6.1f} | "
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
    path = write_result("triton_topk", {"copy_bandwidth_Bps": copy_bw, "results": results},
                        out_dir=args.out)
    print_summary(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
