"""atomk31/bench/throughput.py on the tiny engine: every request runs to its output length and
the rates are the counts over the wall time."""

from __future__ import annotations

import pytest

from atomk31.bench.throughput import run_throughput


def test_throughput_counts_every_prompt_and_output_token(engine):
    r = run_throughput(engine, num_prompts=3, input_len=10, output_len=3, range_ratio=0.0,
                       seed=0)
    assert r["num_prompts"] == 3 and r["input_lens"] == [10] * 3 and r["output_lens"] == [3] * 3
    assert r["total_input_tokens"] == 30 and r["total_output_tokens"] == 9
    assert r["requests_per_second"] == pytest.approx(3 / r["elapsed_time"])
    assert r["output_tokens_per_second"] == pytest.approx(9 / r["elapsed_time"])
    assert r["tokens_per_second"] == pytest.approx(39 / r["elapsed_time"])


def test_a_range_ratio_spreads_the_lengths(engine):
    r = run_throughput(engine, num_prompts=4, input_len=8, output_len=2, range_ratio=0.5, seed=3)
    assert all(4 <= n <= 12 for n in r["input_lens"]) and len(set(r["input_lens"])) > 1
    assert r["total_output_tokens"] == sum(r["output_lens"])
