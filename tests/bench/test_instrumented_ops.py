"""atomk31/bench/instrumented_ops.py: watching the engine's op calls without changing the
engine: routes recorded per MoE layer, profiler ranges per op, the tables put back after."""

from __future__ import annotations

import contextlib

import torch

from atomk31.bench.instrumented_ops import OpWatcher, watched_eager_steps
from atomk31.engine.sampling_params import SamplingParams


def run_one_request(engine, num_prompt_tokens: int = 10, max_tokens: int = 2) -> None:
    engine.add_request(list(range(20, 20 + num_prompt_tokens)),
                       SamplingParams(temperature=0.0, max_tokens=max_tokens))
    while engine.has_unfinished_requests():
        engine.step()


def test_routes_are_recorded_once_per_moe_layer_and_step(engine):
    watcher = OpWatcher(record_routes=True)
    with watched_eager_steps(engine, watcher):
        run_one_request(engine, num_prompt_tokens=10, max_tokens=2)   # a prefill, a decode
    num_moe_layers = sum(engine.model_config.is_moe_layer(layer) for layer in range(8))
    assert len(watcher.routes) == 2 * num_moe_layers
    top_k = engine.model_config.num_experts_per_token
    assert watcher.routes[0].shape == (10, top_k) and watcher.routes[-1].shape == (1, top_k)
    distinct = [torch.unique(ids).numel() for ids in watcher.routes]
    assert watcher.distinct_experts() == sum(distinct)
    num_experts = engine.model_config.num_experts
    assert all(top_k <= n <= num_experts for n in distinct)
    assert distinct[num_moe_layers:] == [top_k] * num_moe_layers   # one token: k experts


def test_the_engines_tables_and_graphs_are_put_back_after_the_block(engine):
    watcher = OpWatcher(record_routes=True)
    runner = engine.runner
    kernels, graphs = runner.kernels, runner.graphs
    with watched_eager_steps(engine, watcher):
        assert runner.kernels.eager is not kernels.eager and runner.graphs is None
        assert runner.kernels.graph is kernels.graph
    assert runner.kernels is kernels and runner.graphs is graphs
    run_one_request(engine, num_prompt_tokens=2, max_tokens=1)
    assert watcher.routes == []                          # steps after the block run unwatched


def test_annotated_calls_run_inside_named_profiler_ranges(engine, monkeypatch):
    ranges = []

    @contextlib.contextmanager
    def record_function(name):       # stands in for torch.profiler's (whose start-up is slow)
        ranges.append(name)
        yield

    monkeypatch.setattr(torch.profiler, "record_function", record_function)
    with watched_eager_steps(engine, OpWatcher(annotate=True)):
        run_one_request(engine, num_prompt_tokens=2, max_tokens=1)
    assert {"op:moe_route", "op:kv_write", "op:kda_prefill", "op:attn_res"} <= set(ranges)
    assert ranges.count("op:moe_route") == 7


def test_a_watched_op_returns_what_the_op_returns():
    watcher = OpWatcher(record_routes=True)
    ids = torch.tensor([[3, 1], [1, 2]])
    route = watcher.wrap("moe_route", lambda x: (x, ids))
    weights, got = route(torch.ones(2))
    assert got is ids and torch.equal(weights, torch.ones(2))
    assert watcher.wrap("rms_norm", lambda x: x + 1)(1) == 2
    assert watcher.distinct_experts() == 3 and len(watcher.routes) == 1
