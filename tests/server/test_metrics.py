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
