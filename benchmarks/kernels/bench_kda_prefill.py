"""KDA chunked prefill: atomk31's Triton kernel (its default and variants) vs
flash-linear-attention's chunk_kda, with the time of each GPU kernel of both.

H = 96 heads, K = V = 128, BF16 q/k/v, fp32 g (K3.1's gate, floor -5) and beta, fp32 initial
and final states, both kernels l2-normalising q and k themselves.

Order (``--quick``: ~80 s on the H200, compiles included): FLA_SHARDS child processes compile
fla's autotuning configurations (a share each: one process needed more than a minute), while
this process measures the limits, then compiles every variant on a small check case (two
requests, 2K tokens) and checks it against the torch op (fp32 math on the same BF16 inputs:
error / tolerance, printed); then fla's first call here at 8K (its autotuners time every
configuration, compiled by the children) and its check; then the cases 1x8K and 1x32K
(``--full`` adds 4x8K and 1x64K): fla first, then each variant with its ratio to fla, and on
1x8K the per-kernel times (torch.profiler) of every variant and of fla.

Times: eager, L2 flushed (``time_ms``): every call is milliseconds long, and the launcher's
host planner (snapshots, or ``plan_on_device`` off) reads cu_seqlens on the host, so it cannot
be captured in a CUDA graph; the per-kernel sum beside the end-to-end time shows what the host
adds. ``--budget-s`` (80 with --quick, counted from the start of the process) skips what would
start after it, so the run always reports; fla's compile children get until 50 s.

Run: python -m benchmarks.kernels.bench_kda_prefill --quick [--budget-s S] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

STARTED = time.monotonic()
HEADS, HEAD_DIM, CHUNK = 96, 128, 64
CHECK_LENGTHS = [1500, 548]
CHECK_TOLERANCE = 1e-2      # as the GPU test of BF16 inputs: BF16 intermediates and output
FLA = "fla chunk_kda"
FLA_WARMUP_TOKENS = 8192
FLA_SHARDS = 8              # child processes compiling fla's autotuning configurations
FLA_WARMUP_LIMIT_S = 50     # stop waiting for them this long after the start


def variants() -> dict[str, object]:
    """The launcher's default (None: default_tuning, on CUDA with BF16 the [64, 64]
    accumulators of kda_prefill_scores_wide.py with BF16 score products, a TF32 solve, the
    gated rows written there and w, u folded into stage 2, and the chunk table planned on the
    GPU); the former default (TF32 scores, stage 1b: kda_prefill_gated.py); the default
    with TF32 scores; and the default with 16-channel slices and a 168-register cap in stage
    1a (no stack on sm_90: three programs per SM instead of two)."""
    from atomk31.triton_kernels.kda_prefill import default_tuning
    from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning as T

    default = default_tuning(torch.bfloat16)
    return {
        "default (folded bf16 scores)": None,
        "s4 default (wide tf32, stage 1b)": T(intra_split=True, compact_scores=True,
                                              scores_tf32_solve=True, plan_on_device=True),
        "default, tf32 scores": replace(default, scores_bf16=False),
        "default, bk16 r168": replace(default, scores_block_k=16, scores_max_registers=168),
    }


def make_inputs(lengths: list[int], device: str = "cuda") -> dict[str, torch.Tensor]:
    from atomk31.ops.kda import kda_gate_torch

    generator = torch.Generator(device=device).manual_seed(0)
    num_tokens = sum(lengths)
    shape = (num_tokens, HEADS, HEAD_DIM)

    def normal(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(size, device=device, generator=generator).to(dtype)

    g = kda_gate_torch(normal(*shape) * 3, normal(HEADS), normal(HEADS * HEAD_DIM), -5.0)
    return {
        "q": normal(*shape, dtype=torch.bfloat16), "k": normal(*shape, dtype=torch.bfloat16),
        "v": normal(*shape, dtype=torch.bfloat16), "g": g,
        "beta": torch.rand(num_tokens, HEADS, device=device, generator=generator),
        "state": normal(len(lengths), HEADS, HEAD_DIM, HEAD_DIM),
        "cu_seqlens": torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32),
    }


def callables(x: dict[str, torch.Tensor]) -> dict[str, Callable[[], tuple]]:
    """name -> a call returning (o [T, H, V], final_state) for each variant and fla."""
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    scale = HEAD_DIM ** -0.5
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["cu_seqlens"], scale)
    calls = {name: (lambda tuning=tuning: kda_prefill_triton(*args, tuning=tuning)[:2])
             for name, tuning in variants().items()}
    try:
        from fla.ops.kda import chunk_kda
    except ImportError:
        return calls
    cu = x["cu_seqlens"].long()

    def fla() -> tuple:
        o, final_state = chunk_kda(x["q"][None], x["k"][None], x["v"][None], x["g"][None],
                                   x["beta"][None], scale=scale, initial_state=x["state"],
                                   output_final_state=True, use_qk_l2norm_in_kernel=True,
                                   cu_seqlens=cu)
        return o[0], final_state
    calls[FLA] = fla
    return calls


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
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max())


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
    for entry in prof.key_averages():
        if entry.self_device_time_total > 0:
            totals[short_kernel_name(entry.key)] += entry.self_device_time_total / 1e3 / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def short_kernel_name(name: str) -> str:
    for prefix in ("kda_prefill_", "chunk_kda_fwd_kernel_", "chunk_gated_delta_rule_fwd_kernel_",
                   "chunk_gla_fwd_kernel_", "chunk_"):
        name = name.removeprefix(prefix)
    return name.removesuffix("_kernel")[:28]


def start_fla_compiles() -> list[tuple[subprocess.Popen, object]] | None:
    """fla's autotuners compile ~80 configurations, more than a minute in one process on the
    H200's host; FLA_SHARDS child processes each compile a share of every tuned
    kernel's configurations (one fla call at 8K with the autotuners' lists cut to that
    share), filling Triton's disk cache while this process compiles its own variants. Their
    output goes to temporary files (a full pipe would stall them)."""
    try:
        import fla  # noqa: F401
    except ImportError:
        return None
    started = []
    for shard in range(FLA_SHARDS):
        log = tempfile.TemporaryFile()
        started.append((subprocess.Popen([sys.executable, "-m",
                                          "benchmarks.kernels.bench_kda_prefill",
                                          "--fla-shard", str(shard)],
                                         stdout=log, stderr=subprocess.STDOUT), log))
    return started


def wait_for_fla_compiles(started: list[tuple[subprocess.Popen, object]] | None,
                          limit_s: float) -> bool:
    """Waits for the children until ``limit_s`` after the start (killing the late ones);
    True when at least one finished cleanly (this process compiles what they missed)."""
    if started is None:
        print("fla: not installed", flush=True)
        return False
    problems = []
    for child, log in started:
        try:
            child.wait(timeout=max(limit_s - (time.monotonic() - STARTED), 1.0))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            problems.append("killed at the time limit")
            continue
        if child.returncode != 0:
            log.seek(0)
            problems.append(log.read().decode(errors="replace")[-300:])
    print(f"fla: {len(started) - len(problems)} of {len(started)} compile children done by "
          f"{time.monotonic() - STARTED:.0f} s" + (f"; {problems[0]}" if problems else ""),
          flush=True)
    return len(problems) < len(started)


def tune_fla() -> bool:
    """fla's first call in this process, at 8K tokens: its autotuners time every
    configuration (compiled by the children) at the shape that matters; prints the choices."""
    began = time.monotonic()
    try:
        x = make_inputs([FLA_WARMUP_TOKENS])
        callables(x)[FLA]()
        torch.cuda.synchronize()
    except Exception as failure:  # reported, not fatal: the variants still run
        print(f"fla: failed: {type(failure).__name__}: {str(failure)[:300]}", flush=True)
        return False
    print(f"fla: autotuned at 1x8K in {time.monotonic() - began:.0f} s; chose "
          + "; ".join(fla_choices()), flush=True)
    return True


def check_inputs() -> tuple[dict[str, torch.Tensor], tuple]:
    """The check case's inputs and the torch op's (o, final_state), fp32 math."""
    from atomk31.ops.kda_prefill import kda_prefill_torch

    x = make_inputs(CHECK_LENGTHS)
    expected = kda_prefill_torch(x["q"].float(), x["k"].float(), x["v"].float(), x["g"],
                                 x["beta"], x["state"], x["cu_seqlens"], HEAD_DIM ** -0.5)
    return x, expected[:2]


def check_case(x: dict[str, torch.Tensor], expected: tuple, names: set[str],
               budget_s: float | None) -> dict:
    """Each of ``names`` once on the check case against the torch op: error / tolerance."""
    row = {}
    for name, fn in callables(x).items():
        if name not in names:
            continue
        if over_budget(budget_s):
            row[name] = "skipped: over the time budget"
        else:
            try:
                o, final_state = fn()
                error = max(relative_error(o, expected[0]),
                            relative_error(final_state, expected[1]))
                row[name] = {"error": error, "error_over_tolerance": error / CHECK_TOLERANCE,
                             "correct": error < CHECK_TOLERANCE}
            except Exception as failure:  # a variant that does not compile is reported
                row[name] = f"failed: {type(failure).__name__}: {str(failure)[:300]}"
        entry = row[name]
        text = entry if isinstance(entry, str) else (
            f"err {entry['error']:.1e} = {entry['error_over_tolerance']:.2f} of the bound "
            f"{'ok' if entry['correct'] else 'FAIL'}")
        print(f" check {name:>32} {text}  ({time.monotonic() - STARTED:.0f} s)", flush=True)
    return row


def timed_case(case: str, lengths: list[int], limits: dict[str, float], correct: set[str],
               budget_s: float, breakdown: bool) -> dict:
    """fla, then each variant checked correct on the check case: ms and ratios; per-kernel
    times when ``breakdown``."""
    x = make_inputs(lengths)
    num_tokens = sum(lengths)
    row: dict = {"case": case, "tokens": num_tokens, "requests": len(lengths)}
    reference = None
    calls = callables(x)
    for name in sorted(calls, key=lambda name: name != FLA):     # fla first: the ratios
        fn = calls[name]
        if name not in correct:
            continue
        if over_budget(budget_s):
            row[name] = "skipped: over the time budget"
            print(f"{case:>6} {name:>32} {row[name]}", flush=True)
            continue
        try:
            o, _ = fn()
            ms = time_ms(fn)
        except Exception as failure:  # reported, not fatal (e.g. out of memory at 32K)
            row[name] = f"failed: {type(failure).__name__}: {str(failure)[:300]}"
            print(f"{case:>6} {name:>32} {row[name]}", flush=True)
            continue
        entry = {"ms": ms, "tokens_per_s": num_tokens / ms * 1e3,
                 "fraction_of_copy_bw":
                     minimal_bytes(num_tokens, len(lengths)) / (ms * 1e-3) / limits["copy"],
                 "fraction_of_matmul_rate": chunked_flops(num_tokens) / (ms * 1e-3)
                 / limits["matmul"]}
        if FLA in row and isinstance(row[FLA], dict):
            entry["speedup_vs_fla"] = row[FLA]["ms"] / ms
            entry["o_error_vs_fla"] = relative_error(o, reference)
        elif name == FLA:
            reference = o
        if breakdown:
            entry["kernels_ms"] = kernel_breakdown(fn)
        row[name] = entry
        print_entry(case, name, entry)
        del o
    del x, reference
    torch.cuda.empty_cache()
    return row


HEADER = (f"{'case':>6} {'variant':>32} {'ms':>7} {'x fla':>6} {'Mtok/s':>6} {'copyBW':>6} "
          f"{'MMA':>5} {'vs fla':>7} | kernels (ms per call, L2 warm; sum)")


def print_entry(case: str, name: str, entry: dict) -> None:
    """One timed variant: ms, speed-up over fla, Mtokens/s, fractions of the copy bandwidth
    and the BF16 matrix rate, o's error against fla's, and its kernels."""
    speedup = f"{entry['speedup_vs_fla']:6.3f}" if "speedup_vs_fla" in entry else f"{'-':>6}"
    vs_fla = f"{entry['o_error_vs_fla']:7.1e}" if "o_error_vs_fla" in entry else f"{'-':>7}"
    kernels = entry.get("kernels_ms", {})
    parts = " ".join(f"{kernel} {ms:.3f}" for kernel, ms in list(kernels.items())[:8])
    total = f"; sum {sum(kernels.values()):.3f}" if kernels else ""
    print(f"{case:>6} {name:>32} {entry['ms']:7.3f} {speedup} {entry['tokens_per_s'] / 1e6:6.2f} "
          f"{entry['fraction_of_copy_bw']:6.3f} {entry['fraction_of_matmul_rate']:5.3f} "
          f"{vs_fla} | {parts}{total}  ({time.monotonic() - STARTED:.0f} s)", flush=True)


def over_budget(budget_s: float | None) -> bool:
    return budget_s is not None and time.monotonic() - STARTED > budget_s


def run(cases: dict[str, list[int]], out_dir: Path | None, budget_s: float | None) -> dict:
    fla_children = start_fla_compiles()     # their imports overlap the limits' measurement
    try:
        limits = {"copy": measure_copy_bandwidth(), "matmul": measure_matmul_rate()}
        print(f"copy {limits['copy'] / 1e12:.2f} TB/s, bf16 GEMM "
              f"{limits['matmul'] / 1e12:.0f} TFLOP/s; check case {CHECK_LENGTHS} tokens, "
              f"tolerance {CHECK_TOLERANCE}", flush=True)
        x, expected = check_inputs()
        check = check_case(x, expected, set(variants()), budget_s)
    finally:
        # Kills the children still compiling at the limit.
        has_fla = wait_for_fla_compiles(fla_children, FLA_WARMUP_LIMIT_S)
    if has_fla and not over_budget(budget_s) and tune_fla():
        check.update(check_case(x, expected, {FLA}, budget_s))
    del x, expected
    correct = {name for name, entry in check.items()
               if isinstance(entry, dict) and entry["correct"]}
    print(HEADER, flush=True)
    rows = [{"case": "check", "tokens": sum(CHECK_LENGTHS), **check}]
    for case, lengths in cases.items():
        rows.append(timed_case(case, lengths, limits, correct, budget_s,
                               breakdown=case == "1x8K"))
    payload = {"copy_bandwidth_bytes_per_s": limits["copy"],
               "matmul_flops_per_s": limits["matmul"], "heads": HEADS, "head_dim": HEAD_DIM,
               "rows": rows}
    path = write_result("kda_prefill", payload, out_dir)
    print(f"wrote {path} after {time.monotonic() - STARTED:.0f} s", flush=True)
    return payload


def fla_compile_shard(shard: int) -> None:
    """A child of start_fla_compiles: every fla autotuner keeps its configurations
    ``shard, shard + FLA_SHARDS, ...`` (at least one), then one fla call at 8K compiles them."""
    from triton.runtime.autotuner import Autotuner

    x = make_inputs([FLA_WARMUP_TOKENS])
    calls = callables(x)                                # imports fla's kernel modules
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("fla."):
            continue
        for value in list(vars(module).values()):
            while not isinstance(value, Autotuner) and hasattr(value, "fn"):
                value = value.fn                        # under @triton.heuristics
            if isinstance(value, Autotuner) and len(value.configs) > 1:
                share = value.configs[shard::FLA_SHARDS]
                value.configs = share or [value.configs[shard % len(value.configs)]]
    calls[FLA]()
    torch.cuda.synchronize()


def fla_choices() -> list[str]:
    """'kernel: config' for every autotuned kernel of fla's modules that has tuned a key."""
    from triton.runtime.autotuner import Autotuner

    choices, seen = [], set()
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("fla."):
            continue
        for name, value in vars(module).items():
            while not isinstance(value, Autotuner) and hasattr(value, "fn"):
                value = value.fn                        # under @triton.heuristics
            if isinstance(value, Autotuner) and value.cache and name not in seen:
                seen.add(name)
                config = next(iter(value.cache.values()))
                choices.append(f"{short_kernel_name(name)}: {config}")
    return choices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1x8K and 1x32K only")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip what would start this many seconds after the process "
                             "started (80 with --quick)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="run only these cases (names as printed, e.g. 1x8K)")
    parser.add_argument("--fla-shard", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fla_shard is not None:
        fla_compile_shard(args.fla_shard)
        return
    cases = {"1x8K": [8192], "1x32K": [32768]}
    if not args.quick:
        cases.update({"4x8K": [8192] * 4, "1x64K": [65536]})
    if args.cases:
        unknown = sorted(set(args.cases) - set(cases))
        if unknown:
            parser.error(f"unknown cases {unknown}; choose from {sorted(cases)}")
        cases = {name: lengths for name, lengths in cases.items() if name in args.cases}
    budget_s = args.budget_s if args.budget_s is not None else (80.0 if args.quick else None)
    run(cases, args.out, budget_s)


if __name__ == "__main__":
    main()
