"""`atomk31 bench serve` against a speculative server: the acceptance over the run, from the
server's /metrics before and after (atomk31/bench/serve_spec.py), issue 21 item 5."""

import json

import pytest

from atomk31.bench.serve_spec import (
    format_spec_decode, parse_spec_counters, spec_decode_figures,
)
from atomk31.cli import main
from atomk31.config import EngineConfig
from live_server import LiveServer
from server.app import create_app

# as prometheus-client writes them (server/metrics.py; vLLM's server uses the same library)
OURS = """# TYPE atomk31_spec_decode_num_draft_tokens_total counter
atomk31_spec_decode_num_draft_tokens_total 40.0
# TYPE atomk31_spec_decode_num_accepted_tokens_total counter
atomk31_spec_decode_num_accepted_tokens_total 18.0
# TYPE atomk31_spec_decode_num_verify_steps_total counter
atomk31_spec_decode_num_verify_steps_total 10.0
"""
VLLMS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 1.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 21.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 9.0
"""


def test_counters_are_read_from_ours_and_vllms_expositions():
    assert parse_spec_counters(OURS) == {"draft_tokens": 40, "accepted_tokens": 18,
                                         "verify_steps": 10}
    assert parse_spec_counters(VLLMS) == {"draft_tokens": 21, "accepted_tokens": 9,
                                          "verify_steps": 8}      # summed over engines
    assert parse_spec_counters("# TYPE atomk31_requests counter\natomk31_requests_total 3\n") \
        is None


def test_figures_are_the_growth_over_the_run():
    before = {"draft_tokens": 40, "accepted_tokens": 18, "verify_steps": 10}
    after = {"draft_tokens": 70, "accepted_tokens": 30, "verify_steps": 16}
    figures = spec_decode_figures(before, after)
    assert figures == {"draft_tokens": 30, "accepted_tokens": 12, "verify_steps": 6,
                       "acceptance_rate": 0.4, "mean_acceptance_length": 3.0}
    assert "Acceptance rate (%):                     40.00" in format_spec_decode(figures)
    assert spec_decode_figures(before, before) is None            # nothing drafted meanwhile
    assert spec_decode_figures(None, after) is None


@pytest.fixture(scope="module")
def speculative_server(tiny_checkpoint, tiny_draft):
    options = EngineConfig(model=str(tiny_checkpoint), block_size=16, kernel_backend="torch",
                           speculative_config={"model": str(tiny_draft),
                                               "num_speculative_tokens": 3})
    server = LiveServer(create_app(options, str(tiny_checkpoint)))
    yield server
    server.stop()


def test_a_speculative_servers_acceptance_is_reported(speculative_server, tmp_path, capsys):
    def counters():
        stats = speculative_server.engine.engine.speculation_stats()
        return stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_verify_steps
    before = counters()
    out = tmp_path / "r.json"
    code = main(["bench", "serve", "--base-url", speculative_server.base_url, "--disable-tqdm",
                 "--num-prompts", "3", "--input-len", "10", "--output-len", "8",
                 "--ignore-eos", "--temperature", "0", "--result-file", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())["spec_decode"]
    grown = [b - a for a, b in zip(before, counters())]
    assert [figures[k] for k in ("draft_tokens", "accepted_tokens", "verify_steps")] == grown
    assert figures["verify_steps"] > 0
    assert figures["mean_acceptance_length"] == pytest.approx(
        1 + figures["accepted_tokens"] / figures["verify_steps"])
    assert "Speculative Decoding" in capsys.readouterr().out
