"""Speculative decoding counters (atomk31/engine/spec_stats.py), the API benchmarks read."""

import pytest

from atomk31.engine.spec_stats import SpeculationStats


def test_counts_rates_and_differences():
    stats = SpeculationStats(5)
    assert stats.mean_acceptance_length == 0.0 and stats.acceptance_rate == 0.0
    stats.record(5, 2)
    before = stats.copy()
    stats.record(5, 5)
    stats.record(4, 0)
    window = stats.since(before)
    assert (window.num_verify_steps, window.num_draft_tokens, window.num_accepted_tokens) == (
        2, 9, 5)
    assert window.num_accepted_by_count == [1, 0, 0, 0, 0, 1]
    assert window.mean_acceptance_length == 3.5 and window.acceptance_rate == 5 / 9
    assert before.num_verify_steps == 1          # copies do not move with the engine's


def test_record_refuses_impossible_counts():
    with pytest.raises(ValueError, match="a verify step accepts 0..3 of its 3 drafts"):
        SpeculationStats(5).record(3, 4)
