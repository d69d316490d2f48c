"""The figures of `atomk31 bench serve`, defined as `vllm bench serve` defines them, with its JSON
field names (so scripts that read vLLM's result files read ours).

Over the successful requests, with `duration` the wall time of the whole run:
- request_throughput = completed / duration; output_throughput = output tokens / duration;
  total_token_throughput = (prompt + output tokens) / duration.
- TTFT, ITL (every gap between output chunks, pooled over requests) and E2EL per request
  (serve_client.py); TPOT = (E2EL - TTFT) / (output tokens - 1), for requests of 2+ tokens.
- for each: mean_*_ms, median_*_ms, std_*_ms and p<P>_*_ms for each requested percentile P
  (numpy's linear interpolation; 0 where there is no value).
- goodput (DistServe): requests per second that met every SLO of `--goodput ttft:MS tpot:MS
  e2el:MS` (a one-token request has TPOT 0); None without SLOs.
- max_concurrent_requests: the most requests in flight at once (client side).
"""

from __future__ import annotations

import numpy as np

from atomk31.bench.errors import BenchmarkError
from atomk31.bench.serve_client import RequestResult

METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {"ttft": ("TTFT", "Time to First Token"),
                 "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                 "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """["ttft:200", "tpot:50"] -> {"ttft": 200.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        try:
            slos[name] = float(value)
        except ValueError:
            slos[name] = -1.0
        if name not in ("ttft", "tpot", "e2el") or not slos[name] >= 0:
            raise BenchmarkError(f"--goodput takes KEY:MILLISECONDS pairs with KEY one of ttft, "
                             f"tpot, e2el and a non-negative number, got {pair!r}")
    return slos


def parse_percentiles(text: str) -> list[float]:
    """"50,90,99" -> [50.0, 90.0, 99.0]."""
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < p <= 100 for p in values):
        raise BenchmarkError(f"--metric-percentiles takes comma-separated numbers in (0, 100], "
                         f"e.g. 50,90,99; got {text!r}")
    return values


def tpot_seconds(result: RequestResult) -> float | None:
    """(E2EL - TTFT) / (output tokens - 1); None below two output tokens."""
    if not result.output_tokens or result.output_tokens < 2:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def compute_metrics(results: list[RequestResult], duration: float, percentiles: list[float],
                    goodput: dict[str, float]) -> dict:
    """The result's figures (module docstring); `results` must have output_tokens set."""
    done = [r for r in results if r.success]
    samples = {"ttft": [r.ttft for r in done], "e2el": [r.latency for r in done],
               "itl": [gap for r in done for gap in r.itl],
               "tpot": [t for t in map(tpot_seconds, done) if t is not None]}
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_tokens or 0 for r in done)
    metrics = {
        "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": len(done) / duration,
        "request_goodput": _good_requests(done, goodput) / duration if goodput else None,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "max_concurrent_requests": _peak_concurrency(done),
    }
    for name in METRICS:
        values_ms = np.asarray(samples[name] or [0.0]) * 1e3
        metrics[f"mean_{name}_ms"] = float(values_ms.mean())
        metrics[f"median_{name}_ms"] = float(np.median(values_ms))
        metrics[f"std_{name}_ms"] = float(values_ms.std())
        for p in percentiles:
            metrics[f"p{_percentile_name(p)}_{name}_ms"] = float(np.percentile(values_ms, p))
    return metrics


def format_report(metrics: dict, duration: float, max_concurrency: int | None,
                  request_rate: float, selected: list[str], percentiles: list[float]) -> str:
    """The table printed at the end of a run (vLLM's layout)."""
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]

    def row(label: str, value: object) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<40} {text:<10}")

    row("Successful requests:", metrics["completed"])
    row("Failed requests:", metrics["failed"])
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if request_rate != float("inf"):
        row("Request rate configured (RPS):", float(request_rate))
    row("Benchmark duration (s):", float(duration))
    row("Total input tokens:", metrics["total_input_tokens"])
    row("Total generated tokens:", metrics["total_output_tokens"])
    row("Request throughput (req/s):", metrics["request_throughput"])
    if metrics["request_goodput"] is not None:
        row("Request goodput (req/s):", metrics["request_goodput"])
    row("Output token throughput (tok/s):", metrics["output_throughput"])
    row("Total token throughput (tok/s):", metrics["total_token_throughput"])
    row("Peak concurrent requests:", metrics["max_concurrent_requests"])
    for name in selected:
        short, title = METRIC_TITLES[name]
        lines.append("{:-^50}".format(title))
        row(f"Mean {short} (ms):", metrics[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", metrics[f"median_{name}_ms"])
        for p in map(_percentile_name, percentiles):
            row(f"P{p} {short} (ms):", metrics[f"p{p}_{name}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


def _percentile_name(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _good_requests(done: list[RequestResult], slos: dict[str, float]) -> int:
    good = 0
    for r in done:
        values_ms = {"ttft": r.ttft * 1e3, "e2el": r.latency * 1e3,
                     "tpot": (tpot_seconds(r) or 0.0) * 1e3}
        good += all(values_ms[name] <= limit for name, limit in slos.items())
    return good


def _peak_concurrency(done: list[RequestResult]) -> int:
    """Most requests in flight at once: a sweep over [start, start + E2EL) intervals."""
    events = sorted([(r.start_time, 1) for r in done] +
                    [(r.start_time + r.latency, -1) for r in done])
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak
