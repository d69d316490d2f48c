"""atomk31/bench/instrumented_ops.py: watching the engine's op calls without changing the
engine: routes recorded per MoE layer, profiler ranges per op, the table put back after."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from atomk31.bench.instrumented_ops import (
    InstrumentedOpTable, instrumented, watched_eager_steps,
)
from atomk31.engine.sampling_params import SamplingParams
from atomk31.ops import select_ops


def run_one_request(engine, num_prompt_tokens: int = 10, max_tokens: int = 2) -> None:
    engine.add_request(list(range(20, 20 + num_prompt_tokens)),
                       SamplingParams(temperature=0.0, max_tokens=max_tokens))
    while engine.has_unfinished_requests():
        engine.step()


def test_routes_are_recorded_once_per_moe_layer_and_step(engine):
    recorder = InstrumentedOpTable(engine.ops, record_routes=True)
    with watched_eager_steps(engine, recorder):
        run_one_request(engine, num_prompt_tokens=10, max_tokens=2)   # a prefill, a decode
    num_moe_layers = sum(engine.model_config.is_moe_layer(layer) for layer in range(8))
    assert len(recorder.routes) == 2 * num_moe_layers
    top_k = engine.model_config.num_experts_per_token
    assert recorder.routes[0].shape == (10, top_k) and recorder.routes[-1].shape == (1, top_k)
    distinct = [torch.unique(ids).numel() for ids in recorder.routes]
    assert recorder.distinct_experts() == sum(distinct)
    num_experts = engine.model_config.num_experts
    assert all(top_k <= n <= num_experts for n in distinct)
    assert distinct[num_moe_layers:] == [top_k] * num_moe_layers   # one token: k experts


def test_the_models_table_is_put_back_after_the_block(engine):
    recorder = InstrumentedOpTable(engine.ops, record_routes=True)
    graphs = engine.runner.graphs
    with watched_eager_steps(engine, recorder):
        assert engine.model.layers[1].ffn.ops is recorder
    assert engine.runner.graphs is graphs
    for layer in engine.model.layers:
        assert layer.ffn.ops is engine.ops and layer.mixer.ops is engine.ops
        assert layer.attn_site.ops is engine.ops and layer.mixer.o_proj.ops is engine.ops


def test_annotated_calls_run_inside_named_profiler_ranges(engine, monkeypatch):
    ranges = []

    @contextlib.contextmanager
    def record_function(name):       # stands in for torch.profiler's (whose start-up is slow)
        ranges.append(name)
        yield

    monkeypatch.setattr(torch.profiler, "record_function", record_function)
    wrapper = InstrumentedOpTable(engine.ops, annotate=True)
    with watched_eager_steps(engine, wrapper):
        run_one_request(engine, num_prompt_tokens=2, max_tokens=1)
    assert {"op:moe_route", "op:kv_write", "op:kda_prefill", "op:attn_res"} <= set(ranges)
    assert ranges.count("op:moe_route") == 7


def test_every_attribute_holding_the_table_is_swapped_and_restored():
    table = select_ops("torch", "cpu")
    holder = type("Holder", (), {})()
    holder.ops = table
    holder.children = [type("Child", (), {})(), {"key": type("Child", (), {})()}]
    holder.children[0].ops = holder.children[1]["key"].ops = table
    with instrumented(holder, table, InstrumentedOpTable(table)) as swapped:
        assert swapped == 3 and holder.children[1]["key"].ops is not table
    assert holder.ops is table and holder.children[0].ops is table
    assert holder.children[1]["key"].ops is table
    with instrumented(object(), table, InstrumentedOpTable(table)) as swapped:
        assert swapped == 0


def test_a_model_that_does_not_hold_the_table_cannot_be_watched():
    table = select_ops("torch", "cpu")
    engine = SimpleNamespace(runner=SimpleNamespace(graphs="graphs"), model=object(), ops=table)
    with pytest.raises(RuntimeError, match="the model holds no reference to the engine's op "
                                           "table, so its op calls cannot be watched"):
        with watched_eager_steps(engine, InstrumentedOpTable(table)):
            pass
    assert engine.runner.graphs == "graphs"
