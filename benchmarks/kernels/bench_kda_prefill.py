"""KDA chunked prefill: atomk31's Triton kernel (design variants) vs flash-linear-attention's
chunk_kda, with the time of each GPU kernel of both.

H = 96 heads, K = V = 128, BF16 q/k/v, fp32 g (K3.1's gate, floor -5) and beta, fp32 initial
and final states, both kernels l2-normalising q and k themselves. Cases: a small check case
(two requests, 2K tokens: every variant and fla against the torch op, fp32 on the same BF16
inputs, as max-abs error over max-abs value; every kernel compiles here), then one sequence
of 8K tokens, 4 sequences of 8K and one of 32K (--quick); --full adds one sequence of 64K.

Per case and variant, printed as soon as measured: milliseconds (eager, L2 flushed: every call
is milliseconds long, so launch overhead is small), Mtokens/s, the ratio to fla measured side by
side, the fraction of the measured limits (the fewest bytes over the copy bandwidth, the chunked
form's matrix FLOPs over the BF16 matrix rate), and o's error against fla's. On 1x8K, the
per-kernel breakdown (torch.profiler) of BREAKDOWN_VARIANTS and of fla. ``--budget-s`` (80 with
--quick) skips what would start after that many seconds, so the run always reports.

Run: python -m benchmarks.kernels.bench_kda_prefill --quick [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

HEADS, HEAD_DIM, CHUNK = 96, 128, 64
CHECK_CASE = "check"
CHECK_LENGTHS = [1500, 548]
CHECK_TOLERANCE = 1e-2      # as the GPU test of BF16 inputs: BF16 intermediates and output


def variants() -> dict[str, object]:
    """Design variants of stage 1: the default two kernels with [16, 16] score tiles
    ("tiles"); the column-block scores kernel ("cols": one program per chunk and head,
    [64, 16] products) before the same gated kernel; and the column-block kernel with the
    gated rows and w, u fused in ("fused": q, k, g read again from L2, not HBM). Knobs: slice
    width (bk), warps (w), the fused gated block (g), BF16 score products (bf16), 16-bit aqk
    and inverse (compact). Stages 2 and 3 at the launchers' defaults. The GPU test covers
    each of them (tests/triton_kernels/test_kda_prefill.py, GPU_CASES)."""
    from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning as T

    cols = T(intra_split=True, scores_columns=True, compact_scores=True)
    fused = T(scores_columns=True, fuse_gated=True, compact_scores=True, gated_block=32)
    return {
        "tiles bk16 w2 (default)": T(intra_split=True, scores_block_k=16, scores_num_warps=2),
        "cols bk32 w4 compact": cols,
        "cols bk16 w4 bf16 compact": replace(cols, scores_block_k=16, scores_bf16=True),
        "fused bk32 w8 g32 compact": replace(fused, scores_num_warps=8),
        "fused bk16 w4 g32 compact": replace(fused, scores_block_k=16),
    }


BREAKDOWN_CASE = "1x8K"
BREAKDOWN_VARIANTS = ("tiles bk16 w2 (default)", "fused bk32 w8 g32 compact")


def make_inputs(lengths: list[int], device: str = "cuda") -> dict[str, torch.Tensor]:
    from atomk31.ops.kda import kda_gate_torch

    num_tokens = sum(lengths)
    shape = (num_tokens, HEADS, HEAD_DIM)
    f = torch.randn(shape, device=device) * 3
    g = kda_gate_torch(f, torch.randn(HEADS, device=device),
                       torch.randn(HEADS * HEAD_DIM, device=device), -5.0)
    bounds = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    return {
        "q": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "k": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "v": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "g": g, "beta": torch.rand(num_tokens, HEADS, device=device),
        "state": torch.randn(len(lengths), HEADS, HEAD_DIM, HEAD_DIM, device=device),
        "cu_seqlens": bounds,
    }


def minimal_bytes(num_tokens: int, num_requests: int) -> int:
    per_token = HEADS * HEAD_DIM * (2 + 2 + 2 + 4 + 2) + HEADS * 4    # q k v g o, beta
    return num_tokens * per_token + num_requests * 2 * HEADS * HEAD_DIM * HEAD_DIM * 4


def chunked_flops(num_tokens: int) -> int:
    """Matrix FLOPs per head and chunk of the chunked form: scores (2 C^2 K), solve-applied
    w and u (2 C^2 (K+V)), state read and output (2 C K V x 2 + 2 C^2 V), state update
    (2 C K V)."""
    c, k = CHUNK, HEAD_DIM
    per_chunk = 2 * (2 * c * c * k) + 2 * c * c * 2 * k + 3 * 2 * c * k * k + 2 * c * c * k
    return HEADS * (num_tokens // c) * per_chunk


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected).abs().max() / expected.abs().max())


def kernel_breakdown(fn: Callable[[], object], calls: int = 3) -> dict[str, float]:
    """Milliseconds per call of each GPU kernel that ``fn`` launches (torch.profiler, summed
    by kernel name over ``calls`` calls, after one warm-up call); the L2 is not flushed."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:48]] += event.device_time_total / 1e3 / calls
    if not totals:  # kernels not listed as events: the per-name averages, device time > 0
        for entry in prof.key_averages():
            if entry.self_device_time_total > 0:
                totals[entry.key[:48]] += entry.self_device_time_total / 1e3 / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def run(cases: dict[str, list[int]], out_dir: Path | None, budget_s: float | None) -> dict:
    from atomk31.ops.kda_prefill import kda_prefill_torch
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    try:
        from fla.ops.kda import chunk_kda
    except ImportError:
        chunk_kda = None
    started = time.monotonic()

    def over_budget() -> bool:
        return budget_s is not None and time.monotonic() - started > budget_s

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s", flush=True)
    print(HEADER, flush=True)
    scale = HEAD_DIM ** -0.5
    rows = []
    for case, lengths in cases.items():
        x = make_inputs(lengths)
        num_tokens = sum(lengths)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["cu_seqlens"], scale)
        expected = None
        if case == CHECK_CASE:
            expected = kda_prefill_torch(x["q"].float(), x["k"].float(), x["v"].float(),
                                         *args[3:])
        row: dict = {"case": case, "tokens": num_tokens, "requests": len(lengths)}
        # Ours first, fla last (its first call on a shape autotunes): ours report even if
        # the budget runs out there; o vs fla and the speed-ups follow in the case's summary.
        timed: dict[str, Callable[[], object]] = {}
        for name, tuning in variants().items():
            timed[name] = (lambda tuning=tuning: kda_prefill_triton(*args, tuning=tuning))
        if chunk_kda is not None:
            cu = x["cu_seqlens"].long()
            timed["fla chunk_kda"] = lambda: chunk_kda(
                x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
                scale=scale, initial_state=x["state"], output_final_state=True,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        outputs: dict[str, torch.Tensor] = {}
        for name, fn in timed.items():
            if over_budget():
                row[name] = "skipped: over the time budget"
                print_entry(case, name, row[name])
                continue
            try:
                result = fn()
                ms = time_ms(fn)
            except Exception as error:  # a variant that does not compile is reported, not fatal
                row[name] = f"failed: {type(error).__name__}: {str(error)[:300]}"
                print_entry(case, name, row[name])
                continue
            entry = {"ms": ms, "tokens_per_s": num_tokens / ms * 1e3,
                     "fraction_of_copy_bw":
                         minimal_bytes(num_tokens, len(lengths)) / (ms * 1e-3) / copy_bw,
                     "fraction_of_matmul_rate":
                         chunked_flops(num_tokens) / (ms * 1e-3) / matmul_rate}
            o, final_state = (result[0][0], result[1]) if name.startswith("fla") \
                else result[:2]
            outputs[name] = o
            if expected is not None:
                entry["o_error"] = relative_error(o, expected[0])
                entry["state_error"] = relative_error(final_state, expected[1])
                entry["correct"] = max(entry["o_error"], entry["state_error"]) < CHECK_TOLERANCE
            row[name] = entry
            print_entry(case, name, entry)
            del result, o, final_state
        summarize_against_fla(case, row, outputs)
        if case == BREAKDOWN_CASE:
            row["kernels_ms"] = {}
            for name in BREAKDOWN_VARIANTS + ("fla chunk_kda",):
                if name not in timed or over_budget():
                    continue
                try:
                    row["kernels_ms"][name] = kernel_breakdown(timed[name])
                except Exception as error:  # reported, not fatal
                    row["kernels_ms"][name] = f"failed: {type(error).__name__}: {str(error)[:200]}"
                print_breakdown(case, name, row["kernels_ms"][name])
        rows.append(row)
        del x, expected, outputs
        torch.cuda.empty_cache()
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "heads": HEADS, "head_dim": HEAD_DIM, "rows": rows}
    path = write_result("kda_prefill", payload, out_dir)
    print(f"wrote {path} after {time.monotonic() - started:.0f} s", flush=True)
    return payload


HEADER = (f"{'case':>6} {'variant':>26} {'ms':>7} {'Mtok/s':>7} {'copyBW':>6} {'MMA':>6} "
          f"{'o err':>8} {'S err':>8}")


def print_entry(case: str, name: str, value: dict | str) -> None:
    """One measured variant (or why it was not): ms, Mtokens/s, fractions of the copy
    bandwidth and the BF16 matrix rate, error vs the torch op (o, state; check case) with its
    verdict."""
    if not isinstance(value, dict):
        print(f"{case:>6} {name:>26} {value}", flush=True)
        return
    errors = (f"{value['o_error']:8.1e} {value['state_error']:8.1e} "
              f"{'ok' if value['correct'] else 'FAIL'}" if "o_error" in value else "")
    print(f"{case:>6} {name:>26} {value['ms']:7.3f} {value['tokens_per_s'] / 1e6:7.3f} "
          f"{value['fraction_of_copy_bw']:6.3f} {value['fraction_of_matmul_rate']:6.3f} "
          f"{errors}", flush=True)


def summarize_against_fla(case: str, row: dict, outputs: dict[str, torch.Tensor]) -> None:
    """Adds and prints each variant's speed-up over fla and its o's error against fla's."""
    fla = row.get("fla chunk_kda")
    if not isinstance(fla, dict) or "fla chunk_kda" not in outputs:
        return
    parts = []
    for name in variants():
        entry = row.get(name)
        if isinstance(entry, dict):
            entry["speedup_vs_fla"] = fla["ms"] / entry["ms"]
            entry["o_error_vs_fla"] = relative_error(outputs[name],
                                                     outputs["fla chunk_kda"].float())
            parts.append(f"{name} x{entry['speedup_vs_fla']:.3f} "
                         f"(o vs fla {entry['o_error_vs_fla']:.1e})")
    print(f"{case:>6} vs fla {fla['ms']:.3f} ms: " + "; ".join(parts), flush=True)


def print_breakdown(case: str, name: str, kernels: dict[str, float] | str) -> None:
    if isinstance(kernels, str):
        print(f"{case:>6} kernels of {name}: {kernels}", flush=True)
        return
    parts = "  ".join(f"{kernel} {ms:.3f}" for kernel, ms in list(kernels.items())[:9])
    print(f"{case:>6} kernels of {name} (sum {sum(kernels.values()):.3f} ms): {parts}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the check case, 1x8K, 4x8K and 1x32K only")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip what would start after this many seconds (80 with --quick)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="run only these cases (names as printed, e.g. 1x8K)")
    args = parser.parse_args()
    cases = {CHECK_CASE: CHECK_LENGTHS, "1x8K": [8192], "4x8K": [8192] * 4, "1x32K": [32768]}
    if not args.quick:
        cases["1x64K"] = [65536]
    if args.cases:
        unknown = sorted(set(args.cases) - set(cases))
        if unknown:
            parser.error(f"unknown cases {unknown}; choose from {sorted(cases)}")
        cases = {name: lengths for name, lengths in cases.items() if name in args.cases}
    budget_s = args.budget_s if args.budget_s is not None else (80.0 if args.quick else None)
    run(cases, args.out, budget_s)


if __name__ == "__main__":
    main()

