"""`atomk31 bench latency` and `atomk31 bench throughput` end to end on the tiny checkpoint (CPU):
the printed tables say how each figure was measured, and the result files hold the figures,
the engine's resolved settings, the ceilings and the environment."""

from __future__ import annotations

import json

import pytest

from atomk31.bench import offline_report
from atomk31.cli import main

ENGINE_FLAGS = ["--block-size", "16", "--kernel-backend", "torch", "--max-num-seqs", "4",
                "--kv-cache-memory", str(64 << 20)]


def test_bench_latency_writes_prefill_decode_and_profile_figures(tiny_checkpoint, tmp_path,
                                                                capsys, monkeypatch):
    out, profile = tmp_path / "latency.json", tmp_path / "profile.json"
    profiled = []

    def profile_steps(engine, batch_size, context, prefill_tokens, path, rng):
        # op_profile.py has its own test; here: which steps the command asks it to profile
        profiled.append((batch_size, context, prefill_tokens, path))
        return {"decode": {"mode": "eager", "time": "cpu", "step_ms": 2.0,
                           "outside_ops_ms": 1.0, "ops": []}}

    monkeypatch.setattr(offline_report, "profile_steps", profile_steps)
    code = main(["bench", "latency", "--model", str(tiny_checkpoint), *ENGINE_FLAGS,
                 "--batch-sizes", "1,2", "--context-lens", "80", "--prefill-lens", "8",
                 "--num-steps", "2", "--warmup-steps", "1", "--profile", str(profile),
                 "--result-file", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ceilings measured now on CPU" in printed and "float32 512^3 matmul" in printed
    assert "prefill: measured for real" in printed
    assert "decode: contexts placed synthetically" in printed
    assert "profile of one decode step (eager, cpu time)" in printed
    result = json.loads(out.read_text())
    assert result["bench"] == "latency" and result["environment"]["device"] == "CPU"
    assert result["ceilings"]["device"] == "CPU"
    assert result["engine"]["kernel_backend"] == "torch" and not result["engine"]["decode_graphs"]
    assert result["engine"]["why_eager"] == "no GPU"
    assert [p["num_tokens"] for p in result["prefill"]] == [8]
    assert [(d["batch_size"], d["context"]) for d in result["decode"]] == [(1, 80), (2, 80)]
    for d in result["decode"]:
        # past the tiny model's top-k (64): the indexer and sparse MLA run
        assert d["mode"] == "eager" and d["context_source"] == "synthetic"
        assert d["bytes"]["total"] > 0 and 0 < d["mbu"]
    assert profiled == [(1, 80, 8, profile)]      # the first decode figure, the first prefill
    assert result["profile"]["decode"]["step_ms"] == 2.0


def test_bench_throughput_writes_its_rates(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "throughput.json"
    code = main(["bench", "throughput", "--model", str(tiny_checkpoint), *ENGINE_FLAGS,
                 "--num-prompts", "3", "--input-len", "6", "--output-len", "2",
                 "--result-file", str(out)])
    assert code == 0
    assert "Throughput: " in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["bench"] == "throughput" and result["total_output_tokens"] == 6
    assert result["settings"]["num_prompts"] == 3 and result["engine"]["block_size"] == 16


@pytest.mark.gpu
def test_bench_latency_on_a_gpu_times_graph_replays_and_profiles_kernels(tiny_checkpoint,
                                                                        tmp_path):
    """The default GPU path (triton kernels, CUDA-graph decode): every timed step is a replay;
    the ceilings are the BF16 8192^3 matmul and the 2 GiB copy; the profile has device times."""
    out, profile = tmp_path / "latency.json", tmp_path / "profile.json"
    code = main(["bench", "latency", "--model", str(tiny_checkpoint), "--block-size", "16",
                 "--kv-cache-memory", str(1 << 30), "--max-num-seqs", "8",
                 "--batch-sizes", "1,5", "--context-lens", "60,300", "--prefill-lens", "100",
                 "--num-steps", "4", "--warmup-steps", "2", "--profile", str(profile),
                 "--result-file", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["engine"]["decode_graphs"] and result["engine"]["kernel_backend"] != "torch"
    assert result["ceilings"]["label"] == "2048 MiB device copy; bfloat16 8192^3 matmul"
    assert result["environment"]["device"] != "CPU"
    assert [d["mode"] for d in result["decode"]] == ["cuda-graph"] * 4
    assert all(0 < d["mbu"] < 1.5 for d in result["decode"])
    decode, replay = result["profile"]["decode"], result["profile"]["decode_graph"]
    assert decode["time"] == "device" and decode["top_kernels"] and decode["step_ms"] > 0
    # the replay's kernels are found (their device time adds up to less than its wall time)
    assert replay["mode"] == "graph" and replay["num_kernels"] > 0
    assert 0 < replay["step_ms"] <= replay["step_wall_ms"]
