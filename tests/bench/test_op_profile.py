"""atomk31/bench/op_profile.py (`bench latency --profile`): the per-op breakdown of one decode
step and one prefill chunk, and the Chrome traces beside it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atomk31.bench.op_profile import profile_steps, trace_path


@pytest.mark.slow   # the profiler's own parsing of every torch op event: ~7 s on 2 cores
def test_profile_breaks_one_decode_step_and_one_prefill_chunk_down_by_op(engine, tmp_path,
                                                                        monkeypatch):
    class StandInGraphs:      # a CPU engine has no decode graphs; a replay that declines runs
        replays = 0           # the step eagerly, so the "graph" profile still profiles a step

        def run(self, requests):
            StandInGraphs.replays += 1
            return None

    monkeypatch.setattr(engine.runner, "graphs", StandInGraphs())
    path = tmp_path / "profile.json"
    result = profile_steps(engine, batch_size=1, context=80, prefill_tokens=4, path=path,
                           rng=np.random.default_rng(0))
    # the eager profile detached the graphs; the graph profile (and its warm-up step) used them
    assert StandInGraphs.replays == 2 and isinstance(engine.runner.graphs, StandInGraphs)
    graphed = result["decode_graph"]
    assert graphed["mode"] == "graph" and graphed["ops"] == []
    assert 0 < graphed["step_ms"] and graphed["step_wall_ms"] > 0
    assert graphed["outside_ops_ms"] == pytest.approx(graphed["step_ms"])
    assert json.loads(path.read_text()) == json.loads(json.dumps(result))
    decode, prefill = result["decode"], result["prefill"]
    calls = {row["op"]: row["calls"] for row in decode["ops"]}
    # tiny: 7 MoE layers, 6 KDA layers, 2 MLA layers past top-k 64 (indexer, sparse attention);
    # on CPU the MXFP4 experts are dequantized at load (EngineConfig.dequantize_experts)
    assert calls["moe_route"] == 7 and calls["moe_experts_dense"] == 7
    assert calls["kda_decode"] == 6 and calls["sparse_mla"] == 2 and "dense_mla" not in calls
    assert calls["indexer_score"] == 2 and calls["topk_slots"] == 2
    assert {row["op"]: row["calls"] for row in prefill["ops"]}["kda_prefill"] == 6
    for step in (decode, prefill):
        assert step["time"] == "cpu" and step["mode"] == "eager" and step["step_ms"] > 0
        assert step["outside_ops_ms"] >= 0
        assert sum(row["ms"] for row in step["ops"]) + step["outside_ops_ms"] == \
            pytest.approx(step["step_ms"])
        assert step["top_torch_ops"] and step["top_torch_ops"][0]["self_ms"] > 0
    assert prefill["num_tokens"] == 4 and prefill["chunk_tokens"] == 4
    for step in ("decode", "prefill"):
        assert result[step]["step_wall_ms"] > 0
        trace = json.loads(trace_path(path, step).read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "op:moe_route" in names and f"step:{step}" in names


def test_gpu_breakdown_reads_each_range_once_from_its_host_side():
    """On a GPU the profiler lists every record_function range twice: the host-side range
    (device time = the kernels launched inside it) and its device-side annotation (a span that
    queueing inflates; eager spans overlap). The breakdown takes the host-side ranges only, so
    each op appears once and the ops never add up to more than the step."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from atomk31.bench.op_profile import op_breakdown

    def event(key, device_ms, device_type, calls=1):
        us = device_ms * 1e3
        return SimpleNamespace(key=key, count=calls, device_type=device_type, cpu_time_total=0.0,
                               self_cpu_time_total=0.0, device_time_total=us,
                               self_device_time_total=us)

    events = [event("step:decode", 6.0, DeviceType.CUDA),
              event("step:decode", 4.0, DeviceType.CPU),
              event("op:moe_experts_mxfp4", 1.5, DeviceType.CPU, 7),
              event("op:moe_experts_mxfp4", 3.9, DeviceType.CUDA, 7),
              event("op:rms_norm", 0.5, DeviceType.CPU, 11),
              event("op:rms_norm", 2.8, DeviceType.CUDA, 11),
              event("gemv_kernel", 1.5, DeviceType.CUDA, 7)]
    breakdown = op_breakdown(events, "step:decode", on_gpu=True)
    assert breakdown["step_ms"] == 4.0
    assert [(row["op"], row["calls"], row["ms"]) for row in breakdown["ops"]] == \
        [("moe_experts_mxfp4", 7, 1.5), ("rms_norm", 11, 0.5)]
    assert breakdown["outside_ops_ms"] == 2.0
    assert [k["name"] for k in breakdown["top_kernels"]] == ["gemv_kernel"]
