"""Prometheus metrics for GET /metrics (prometheus-client).

Each app owns its registry (no process-global state, so two apps in one test process do not
collide). Counters and histograms are updated when a request finishes; the engine's gauges
(running and waiting requests, KV and KDA-state pool usage, prefix-cache hit rate) and, with
speculative decoding, its drafted / accepted tokens and acceptance-length histogram are read
from `AsyncEngine.stats()` at scrape time by a collector, so they are never stale.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.registry import Collector

from atomk31.engine.async_engine import AsyncEngine
from atomk31.engine.outputs import RequestOutput
from atomk31.engine.spec_stats import SpeculationStats

PREFIX = "atomk31"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class EngineStatsCollector(Collector):
    """Gauges read from the engine at each scrape."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()
        for name, doc, value in (
            ("num_requests_running", "Sequences in the running batch.", stats.num_running),
            ("num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("kv_cache_usage_ratio", "Share of KV-cache blocks in use (0-1).", stats.kv_usage),
            ("kda_state_usage_ratio", "Share of KDA state slots in use (0-1).",
             stats.state_usage),
            ("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache (0-1).",
             stats.prefix_hit_rate),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        if stats.speculation is not None:
            yield from speculation_metrics(stats.speculation)


def speculation_metrics(spec: SpeculationStats) -> Iterator[Metric]:
    """Speculative decoding's counters and its acceptance-length histogram (tokens emitted per
    verify step: accepted drafts + 1, MODEL_SPEC §5.6)."""
    for name, doc, value in (
        ("spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens),
        ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens),
        ("spec_decode_num_verify_steps", "Verifications (one request in one step).",
         spec.num_verify_steps),
    ):
        yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
    cumulative, buckets = 0, []
    for accepted, count in enumerate(spec.num_accepted_by_count):
        cumulative += count
        buckets.append((str(float(accepted + 1)), cumulative))
    buckets.append(("+Inf", cumulative))
    yield HistogramMetricFamily(
        f"{PREFIX}_spec_decode_acceptance_length", "Tokens emitted per verification "
        "(accepted drafts + 1).", buckets=buckets,
        sum_value=spec.num_accepted_tokens + spec.num_verify_steps)


class ServerMetrics:
    """The server's counters and histograms in its own registry."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineStatsCollector(engine))
        self.requests = Counter(f"{PREFIX}_requests", "Finished requests by endpoint and "
                                "finish reason.", ["endpoint", "finish_reason"],
                                registry=self.registry)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens processed.",
                                     registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.",
                                         registry=self.registry)
        self.time_to_first_token = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Arrival to first generated token.",
            buckets=TTFT_BUCKETS, registry=self.registry)
        self.time_per_output_token = Histogram(
            f"{PREFIX}_time_per_output_token_seconds", "Mean time between output tokens after "
            "the first, per request.", buckets=TPOT_BUCKETS, registry=self.registry)
        self.e2e_latency = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "Arrival to last token.",
            buckets=E2E_BUCKETS, registry=self.registry)

    def record(self, endpoint: str, finish_reason: str, output: RequestOutput | None,
               num_generated_tokens: int) -> None:
        """Account for one engine request that ended (finished, stopped by us, or cut off by
        a client that left). `output` is its last RequestOutput, None if it produced none."""
        self.requests.labels(endpoint=endpoint, finish_reason=finish_reason).inc()
        self.generation_tokens.inc(num_generated_tokens)
        if output is None:
            return
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        timing = output.metrics
        if timing is None or timing.first_token_time is None:
            return
        self.time_to_first_token.observe(timing.first_token_time - timing.arrival_time)
        end = timing.finished_time
        if end is None:
            return
        self.e2e_latency.observe(end - timing.arrival_time)
        num_tokens = max(len(c.token_ids) for c in output.outputs)
        if num_tokens > 1:
            self.time_per_output_token.observe((end - timing.first_token_time) / (num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
