"""Speculative decoding over a `bench serve` run, read from the server's Prometheus counters.

A speculative server's speed depends on how many drafted tokens it accepts, which the client
cannot see in the streams. So, as `vllm bench serve` does, the run reads the server's
``/metrics`` before and after and reports the growth of its speculation counters: ours
(server/metrics.py: ``atomk31_spec_decode_num_draft_tokens``, ``..._num_accepted_tokens``,
``..._num_verify_steps``) or vLLM's (``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens``, ``vllm:spec_decode_num_drafts``). Other clients of
the same server during the run are counted too. A server without such counters (no
speculation, no ``/metrics``) gives None, and the report has no speculation section.

Figures: acceptance rate = accepted / drafted tokens; mean acceptance length = tokens a
verification emits = 1 + accepted / verifications (MODEL_SPEC §5.6).
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRICS_TIMEOUT_S = 10.0
# what we read -> the counter family names that hold it (ours, then vLLM's)
COUNTERS = {
    "draft_tokens": ("atomk31_spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens"),
    "accepted_tokens": ("atomk31_spec_decode_num_accepted_tokens",
                        "vllm:spec_decode_num_accepted_tokens"),
    "verify_steps": ("atomk31_spec_decode_num_verify_steps", "vllm:spec_decode_num_drafts"),
}


def parse_spec_counters(text: str) -> dict[str, float] | None:
    """The speculation counters of a Prometheus text exposition (summed over label sets);
    None unless all three are there."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removesuffix("_total")     # "# TYPE x_total counter" or "x"
        for key, names in COUNTERS.items():
            if name in names:
                totals[key] = sum(s.value for s in family.samples
                                  if s.name.removesuffix("_total") == name)
    return totals if totals.keys() == COUNTERS.keys() else None


async def read_spec_counters(client: httpx.AsyncClient, base_url: str,
                             headers: dict[str, str]) -> dict[str, float] | None:
    """The server's speculation counters now; None when it has none or no /metrics."""
    try:
        response = await client.get(f"{base_url}/metrics", headers=headers,
                                    timeout=METRICS_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_spec_counters(response.text)
    except ValueError:          # not a Prometheus exposition
        return None


def spec_decode_figures(before: dict[str, float] | None,
                        after: dict[str, float] | None) -> dict | None:
    """The run's speculation (the counters' growth), or None without counters or drafts."""
    if before is None or after is None:
        return None
    grown = {key: int(after[key] - before[key]) for key in COUNTERS}
    if grown["verify_steps"] <= 0 or grown["draft_tokens"] <= 0:
        return None
    return {**grown,
            "acceptance_rate": grown["accepted_tokens"] / grown["draft_tokens"],
            "mean_acceptance_length": 1 + grown["accepted_tokens"] / grown["verify_steps"]}


def format_spec_decode(figures: dict) -> str:
    """The report's speculation section (the table's style)."""
    rows = [("Acceptance rate (%):", f"{100 * figures['acceptance_rate']:.2f}"),
            ("Mean acceptance length:", f"{figures['mean_acceptance_length']:.2f}"),
            ("Verifications:", str(figures["verify_steps"])),
            ("Drafted tokens:", str(figures["draft_tokens"])),
            ("Accepted tokens:", str(figures["accepted_tokens"]))]
    return "\n".join(["{:-^50}".format("Speculative Decoding")]
                     + [f"{label:<40} {value:<10}" for label, value in rows] + ["=" * 50])
