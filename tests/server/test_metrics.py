"""server/metrics.py: GET /metrics in Prometheus text format, counting what was served."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

MODEL = "tiny-test"


def scrape(server) -> dict[str, float]:
    """{sample name with labels: value} from /metrics."""
    response = httpx.get(server.base_url + "/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_metrics_count_requests_tokens_and_latency(live_server):
    before = scrape(live_server)
    body = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        for _ in range(2):
            assert client.post("/v1/completions", json=body).status_code == 200
    after = scrape(live_server)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("atomk31_requests_total{endpoint=completions,finish_reason=length}") == 2
    assert grew("atomk31_prompt_tokens_total") == 6
    assert grew("atomk31_generation_tokens_total") == 8
    assert grew("atomk31_time_to_first_token_seconds_count") == 2
    assert grew("atomk31_time_per_output_token_seconds_count") == 2
    assert grew("atomk31_e2e_request_latency_seconds_count") == 2


def test_metrics_report_engine_gauges(live_server):
    samples = scrape(live_server)
    for name in ("atomk31_num_requests_running", "atomk31_num_requests_waiting",
                 "atomk31_kv_cache_usage_ratio", "atomk31_kda_state_usage_ratio",
                 "atomk31_prefix_cache_hit_rate"):
        assert 0 <= samples[name] <= 1 or name.startswith("atomk31_num"), name
    assert samples["atomk31_num_requests_running"] == 0
    assert samples["atomk31_kv_cache_usage_ratio"] == 0


def test_metrics_count_an_aborted_stream(live_server, pools_free):
    before = scrape(live_server)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3000,
            "ignore_eos": True, "stream": True, "reasoning_effort": "none"}
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client, \
            client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data:"):
            pass
    pools_free(live_server.engine.engine)
    key = "atomk31_requests_total{endpoint=chat,finish_reason=abort}"
    assert scrape(live_server).get(key, 0) - before.get(key, 0) == 1


def test_speculative_decoding_counters_and_acceptance_histogram():
    """Issue 21: drafted / accepted tokens and the acceptance-length histogram, read from the
    engine's stats at scrape time (a stand-in engine: the counters' rendering is the point)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from atomk31.engine.async_engine import EngineStats
    from atomk31.engine.spec_stats import SpeculationStats
    from server.metrics import EngineStatsCollector

    spec = SpeculationStats(3)
    for drafts, accepted in ((3, 0), (3, 3), (3, 1), (2, 2), (3, 1)):
        spec.record(drafts, accepted)
    stats = EngineStats(0, 0, 0.0, 0.0, 0.0, 10, 10, 4, speculation=spec)
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(type("Engine", (), {"stats": lambda self: stats})()))
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            le = sample.labels.get("le")
            samples[sample.name + (f"{{le={le}}}" if le else "")] = sample.value
    assert samples["atomk31_spec_decode_num_draft_tokens_total"] == 14
    assert samples["atomk31_spec_decode_num_accepted_tokens_total"] == 7
    assert samples["atomk31_spec_decode_num_verify_steps_total"] == 5
    assert [samples[f"atomk31_spec_decode_acceptance_length_bucket{{le={le}}}"]
            for le in ("1.0", "2.0", "3.0", "4.0", "+Inf")] == [1, 3, 4, 5, 5]
    assert samples["atomk31_spec_decode_acceptance_length_sum"] == 12
    assert spec.mean_acceptance_length == 12 / 5 and spec.acceptance_rate == 0.5
