"""atomk31/bench/latency.py on the tiny engine (CPU): the decode window, decode and prefill
figures against the roofline models, and the lengths it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atomk31.bench.ceilings import Ceilings
from atomk31.bench.latency import (
    LatencyOptions, _window_notes, decode_window, measure_decode, measure_prefill, run_latency,
    storage_format,
)
from atomk31.bench.roofline import decode_step_bytes, prefill_flops

CEILINGS = Ceilings("CPU", copy_bytes_per_s=2e9, matmul_flop_per_s=1e10, matmul_dtype="float32",
                    label="test")


def options(**changes) -> LatencyOptions:
    values = {"batch_sizes": (2,), "context_lens": (30,), "prefill_lens": (24,), "num_steps": 2,
              "warmup_steps": 1, "num_prefill_runs": 1, "seed": 0, **changes}
    return LatencyOptions(**values)


def test_the_decode_window_ends_one_key_short_of_the_context():
    # 5 warm-up, 1 counting, 20 timed steps: they attend 2022..2047 keys; timed from 2028
    assert decode_window(2048, num_steps=20, warmup_steps=5) == (2022, 2028)
    with pytest.raises(ValueError, match=r"context 20 is too short for 5 warm-up, one counting "
                                         r"and 20 timed steps; pass --context-lens of at least 27"):
        decode_window(20, num_steps=20, warmup_steps=5)


def test_decode_figures_follow_the_byte_model_and_the_measured_steps(engine):
    d = measure_decode(engine, 2, 30, options(), CEILINGS, np.random.default_rng(0))
    assert (d["batch_size"], d["context"], d["mode"]) == (2, 30, "eager")
    assert d["context_source"] == "synthetic"
    assert (d["first_context"], d["last_context"]) == (28, 29)
    assert len(d["step_ms_runs"]) == 2 and d["step_ms"]["median"] > 0
    top_k, num_moe_layers = engine.model_config.num_experts_per_token, 7
    assert num_moe_layers * top_k <= d["num_distinct_experts"] <= num_moe_layers * 2 * top_k
    expected = decode_step_bytes(engine.model_config, storage_format(engine), [29, 29],
                                 d["num_distinct_experts"])
    assert d["bytes"] == {**vars(expected), "total": expected.total}
    seconds = d["step_ms"]["median"] / 1e3
    assert d["mbu"] == pytest.approx(expected.total / seconds / 2e9)
    assert d["notes"] == []


def test_prefill_figures_follow_the_flop_model(engine):
    p = measure_prefill(engine, 24, num_runs=2, ceilings=CEILINGS, rng=np.random.default_rng(1))
    assert p["mode"] == "real prefill" and p["num_chunks"] == 1 and len(p["ttft_ms_runs"]) == 2
    flops = prefill_flops(engine.model_config, 24).total
    assert p["flops"] == flops
    assert p["mfu"] == pytest.approx(flops / (p["ttft_ms"] / 1e3) / 1e10)


def test_window_notes_name_snapshot_steps_inside_the_timed_window(engine, monkeypatch):
    # the default interval (2048 tokens, 128 blocks of 16): no snapshot near 32
    assert _window_notes(engine, first_context=31, num_steps=2) == []
    monkeypatch.setattr(engine.scheduler, "snapshot_interval_blocks", 2)
    assert _window_notes(engine, first_context=30, num_steps=2) == []
    assert _window_notes(engine, first_context=31, num_steps=2) == [
        "1 timed step(s) take a KDA prefix snapshot (--kda-snapshot-interval)"]


def test_lengths_past_the_context_length_are_refused(engine):
    with pytest.raises(ValueError, match=r"--prefill-lens / --context-lens \[4096, 5000\] do not "
                                         r"fit the context length of 4096 tokens"):
        run_latency(engine, options(prefill_lens=(4096,), context_lens=(5000,)), CEILINGS)


def test_storage_format_says_what_the_cpu_engine_stores(engine):
    fmt = storage_format(engine)
    assert fmt.compute_dtype == torch.float32 and fmt.latent_dtype == torch.float32
    assert fmt.index_format == "fp8" and fmt.online_quant_config is None
    assert not fmt.experts_mxfp4      # dequantized at load on CPU (EngineConfig.dequantize_experts)


class RefusingGraphs:
    """Stands in for DecodeGraphs (CPU has none): every shape refused, so steps run eagerly."""

    buckets = [32, 64, 4096]
    refused = {(2, 64): "replay differs from the eager step by 1e-1"}
    num_replays = 0

    def run(self, scheduled):
        return None


def test_eager_steps_under_graphs_and_crossed_buckets_are_noted(engine, monkeypatch):
    monkeypatch.setattr(engine.runner, "graphs", RefusingGraphs())
    monkeypatch.setattr(engine.scheduler, "snapshot_interval_blocks", 1)
    d = measure_decode(engine, 2, 34, options(), CEILINGS, np.random.default_rng(3))
    assert d["mode"] == "eager" and (d["first_context"], d["last_context"]) == (32, 33)
    assert d["notes"] == [
        "1 timed step(s) take a KDA prefix snapshot (--kda-snapshot-interval)",
        "the timed steps span graph context buckets [32, 64]",
        "CUDA graphs are on, but timed steps ran eagerly: replay differs from the eager step "
        "by 1e-1"]


def test_the_decode_window_leaves_room_for_every_verified_draft():
    # 3 drafts: up to 4 tokens a step; 26 steps of 4 end at 2047 keys at the latest
    assert decode_window(2048, num_steps=20, warmup_steps=5, tokens_per_step=4) == (1944, 1968)


def test_speculative_decode_reports_tokens_per_step_from_the_timed_window(engine_options,
                                                                          tiny_draft):
    from atomk31.engine.llm_engine import LLMEngine

    engine = LLMEngine(engine_options(
        kv_cache_memory=128 << 20,
        speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3}))
    d = measure_decode(engine, 2, 120, options(num_steps=3), CEILINGS, np.random.default_rng(4))
    counts = d["speculation"]
    # both requests verify 3 drafts in each of the 3 timed steps
    assert counts["verify_steps"] == 6 and counts["draft_tokens"] == 18
    assert d["tokens_per_step"] == pytest.approx(1 + counts["accepted_tokens"] / 6)
    assert d["tokens_per_s"] == pytest.approx(2 * d["tokens_per_step"]
                                              / (d["step_ms"]["median"] / 1e3))
    assert not engine.has_unfinished_requests()
