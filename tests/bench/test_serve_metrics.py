"""atomk31/bench/serve_metrics.py: vLLM's serving metrics on hand-made request timings."""

from __future__ import annotations

import pytest

from atomk31.bench.serve_client import RequestResult
from atomk31.bench.serve_metrics import (
    compute_metrics, format_report, parse_goodput, parse_percentiles, tpot_seconds,
)


def result(start: float, ttft: float, itl: list[float], output_tokens: int,
           prompt_len: int = 10) -> RequestResult:
    return RequestResult(prompt_len=prompt_len, success=True, ttft=ttft, itl=itl,
                         latency=ttft + sum(itl), output_tokens=output_tokens, start_time=start)


@pytest.fixture
def results() -> list[RequestResult]:
    return [result(0.0, 0.100, [0.020, 0.030, 0.040], 4),      # TPOT (0.19 - 0.1) / 3 = 0.03
            result(0.05, 0.300, [0.050], 3, prompt_len=20),     # one chunk of 2 tokens: 0.025
            result(1.0, 0.200, [], 1),                          # one token: no TPOT
            RequestResult(prompt_len=30, error="HTTP 500: boom")]


def test_tpot_is_e2el_minus_ttft_over_output_tokens_minus_one(results):
    assert tpot_seconds(results[0]) == pytest.approx(0.03)
    assert tpot_seconds(results[1]) == pytest.approx(0.025)
    assert tpot_seconds(results[2]) is None


def test_metrics_count_only_successful_requests(results):
    m = compute_metrics(results, duration=2.0, percentiles=[50, 99], goodput={})
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_input_tokens"] == 40 and m["total_output_tokens"] == 8
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(4.0)
    assert m["total_token_throughput"] == pytest.approx(24.0)
    assert m["request_goodput"] is None
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx(27.5)
    assert m["mean_itl_ms"] == pytest.approx(35.0)            # 4 gaps pooled
    assert m["p50_itl_ms"] == pytest.approx(35.0)
    assert m["mean_e2el_ms"] == pytest.approx((190 + 350 + 200) / 3)
    # sorted 190, 200, 350: rank 0.99 * 2 = 1.98 -> 200 + 0.98 * 150 (linear interpolation)
    assert m["p99_e2el_ms"] == pytest.approx(347.0)
    assert m["max_concurrent_requests"] == 2


def test_goodput_counts_requests_within_every_slo(results):
    m = compute_metrics(results, duration=2.0, percentiles=[99],
                        goodput=parse_goodput(["ttft:250", "tpot:28"]))
    # request 0: ttft 100, tpot 30 (fails tpot); request 1: ttft 300 (fails); request 2: tpot 0
    assert m["request_goodput"] == pytest.approx(0.5)


def test_no_successful_request_gives_zeros_not_an_error():
    m = compute_metrics([RequestResult(prompt_len=3, error="x")], duration=1.0,
                        percentiles=[99], goodput={})
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0 and m["p99_tpot_ms"] == 0.0


def test_report_prints_vllm_rows_for_the_selected_metrics(results):
    m = compute_metrics(results, duration=2.0, percentiles=[50, 99.5], goodput={})
    table = format_report(m, 2.0, max_concurrency=2, request_rate=float("inf"),
                          selected=["ttft", "e2el"], percentiles=[50, 99.5])
    assert "Successful requests:                     3" in table
    assert "Maximum request concurrency:" in table and "Request rate configured" not in table
    assert "P99.5 TTFT (ms):" in table and "P50 E2EL (ms):" in table
    assert "TPOT" not in table


@pytest.mark.parametrize("pairs", [["ttft"], ["ttft:abc"], ["speed:10"], ["tpot:-1"]])
def test_bad_goodput_pairs_are_refused(pairs):
    with pytest.raises(ValueError, match="--goodput takes KEY:MILLISECONDS pairs"):
        parse_goodput(pairs)


def test_percentiles_parse_and_bad_ones_are_refused():
    assert parse_percentiles("50,90,99") == [50.0, 90.0, 99.0]
    with pytest.raises(ValueError, match=r"--metric-percentiles takes comma-separated numbers"):
        parse_percentiles("50,150")
