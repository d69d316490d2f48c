"""server/launch.py: `atomk31 serve` flags, and the server it starts, end to end."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import server.launch as launch
from atomk31.config import ConfigError, EngineConfig

ROOT = Path(__file__).resolve().parents[2]
SERVE_SCRIPT = ("import argparse, sys; from server.launch import add_serve_arguments, serve; "
                "p = argparse.ArgumentParser(); add_serve_arguments(p); "
                "sys.exit(serve(p.parse_args()))")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch.add_serve_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("flag, value, attribute, expected", [
    ("block-size", "64", "block_size", 64), ("kernel-backend", "torch", "kernel_backend", "torch"),
    ("max-model-len", "2048", "max_model_len", 2048), ("max-num-seqs", "8", "max_num_seqs", 8),
    ("max-num-batched-tokens", "512", "max_num_batched_tokens", 512),
    ("kv-cache-dtype", "bf16", "kv_cache_dtype", "bf16"),
    ("gpu-memory-utilization", "0.5", "gpu_memory_utilization", 0.5),
    ("served-model-name", "kimi", "served_model_name", "kimi"),
    ("api-key", "k", "api_key", "k"), ("host", "0.0.0.0", "host", "0.0.0.0"),
    ("port", "9000", "port", 9000), ("model", "/m", "model", "/m"),
], ids=lambda v: v if isinstance(v, str) and v[0].isalpha() and "-" in v else None)
@pytest.mark.parametrize("spelling", ["kebab", "snake"])
def test_flags_accept_kebab_and_snake_case(flag, value, attribute, expected, spelling):
    name = flag if spelling == "kebab" else flag.replace("-", "_")
    assert getattr(parse([f"--{name}", value]), attribute) == expected


@pytest.mark.parametrize("argv, expected", [
    ([], True), (["--no-enable-prefix-caching"], False), (["--no_enable_prefix_caching"], False),
    (["--no-enable-prefix-caching", "--enable_prefix_caching"], True),
], ids=["default", "off-kebab", "off-snake", "last-wins"])
def test_prefix_caching_switch(argv, expected):
    assert parse(argv).enable_prefix_caching is expected


@pytest.mark.parametrize("argv, expected", [
    ([], False), (["--enforce-eager"], True), (["--enforce_eager"], True)])
def test_enforce_eager_flag_reaches_the_engine_options(argv, expected):
    assert launch.engine_config_from_args(parse(argv), "/m").enforce_eager is expected


def test_building_the_parser_imports_no_torch():
    code = ("import sys, argparse; from server.launch import add_serve_arguments; "
            "add_serve_arguments(argparse.ArgumentParser()); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_defaults_are_the_engine_defaults():
    args = parse([])
    options = launch.engine_config_from_args(args, "/m")
    assert options == EngineConfig(model="/m")
    assert (args.host, args.port, args.block_size) == ("127.0.0.1", 8000, 128)


def test_bad_flags_exit_2_listing_every_problem(tiny_checkpoint, caplog):
    args = parse(["--model", str(tiny_checkpoint), "--block-size", "96", "--max-num-seqs", "0"])
    with caplog.at_level(logging.ERROR, logger="server.launch"):
        assert launch.serve(args, default_model=lambda: tiny_checkpoint) == 2
    assert "block_size must be a power of two, got 96" in caplog.text
    assert "max_num_seqs must be >= 1, got 0" in caplog.text


def test_empty_api_key_exits_2(tiny_checkpoint):
    assert launch.serve(parse(["--model", str(tiny_checkpoint), "--api-key", ""]),
                        default_model=lambda: tiny_checkpoint) == 2


def test_without_model_serves_the_built_in_checkpoint(monkeypatch, tiny_checkpoint):
    import uvicorn

    started = {}

    class FakeServer:
        should_exit = True       # the engine watchdog stops at once

        def __init__(self, config):
            started["config"] = config
            self.started = True

        def run(self) -> None:
            started["app"] = started["config"].app

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    assert launch.serve(parse(["--port", "8123"]), lambda: tiny_checkpoint) == 0
    app = started["app"]
    assert app.state.served_model_name == launch.DEFAULT_MODEL_NAME
    assert started["config"].port == 8123 and started["config"].host == "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_end_to_end_with_the_openai_client(tiny_checkpoint):
    """What a new user does: start the server, chat with the official client, streaming too,
    then stop it with Ctrl-C."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, "--model", str(tiny_checkpoint), "--port", str(port),
         "--block_size", "16", "--kernel-backend", "torch", "--served-model-name", "tiny"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, f"the server exited: {process.stdout.read()}"
            assert time.monotonic() < deadline, "the server did not come up within 90 s"
            try:
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4)
        assert reply.choices[0].finish_reason in ("stop", "length")
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4,
            stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    assert process.returncode == 0, output


def test_online_quant_config_inline_or_from_a_file(tmp_path):
    config = {"global_quant_config": "ptpc_fp8", "exclude_layer": ["lm_head"]}
    inline = launch.engine_config_from_args(
        parse(["--online-quant-config", json.dumps(config)]), "/m")
    path = tmp_path / "ptpc.json"
    path.write_text(json.dumps(config))
    from_file = launch.engine_config_from_args(
        parse(["--online_quant_config", str(path)]), "/m")
    assert inline.online_quant_config == from_file.online_quant_config == config
    with pytest.raises(ConfigError, match="--online-quant-config: not valid JSON"):
        launch.engine_config_from_args(parse(["--online-quant-config", "{oops"]), "/m")
    with pytest.raises(ConfigError, match="neither inline JSON nor a readable file"):
        launch.engine_config_from_args(parse(["--online-quant-config", str(tmp_path / "no")]),
                                       "/m")


# ---- issue 19: vLLM's spellings and the request limits ----------------------------------------
VLLM_NO_OP_FLAGS = ["--trust-remote-code", "--load-format", "safetensors",
                    "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",
                    "--reasoning-parser", "kimi_k3"]


@pytest.mark.parametrize("spelling", ["kebab", "snake"])
def test_vllm_flags_that_mean_nothing_here_are_accepted(spelling):
    argv = [a if spelling == "kebab" or not a.startswith("--") else "--" + a[2:].replace("-", "_")
            for a in VLLM_NO_OP_FLAGS]
    args = parse(argv)
    assert launch.ignored_vllm_flags(args) == [
        "--trust-remote-code", "--enable-auto-tool-choice", "--load-format safetensors",
        "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3"]
    assert launch.engine_config_from_args(args, "/m") == EngineConfig(model="/m")


@pytest.mark.parametrize("flag, value, accepted", [
    ("--tool-call-parser", "hermes", "kimi_k3"), ("--reasoning_parser", "deepseek_r1", "kimi_k3"),
    ("--load-format", "gguf", "auto or safetensors"),
])
def test_a_wrong_vllm_flag_value_names_the_accepted_one(flag, value, accepted, capsys):
    with pytest.raises(SystemExit):
        parse([flag, value])
    assert f"{value!r} is not supported" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse([flag, value])
    assert f"pass {flag.replace('_', '-')} {accepted} or leave the flag out" in \
        capsys.readouterr().err


def test_ignored_vllm_flags_are_logged_once_at_start_up(monkeypatch, tiny_checkpoint, caplog):
    import uvicorn

    class FakeServer:
        started = True
        should_exit = True       # the engine watchdog stops at once

        def __init__(self, config):
            self.config = config

        def run(self) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    with caplog.at_level(logging.INFO, logger="server.launch"):
        assert launch.serve(parse(["--model", str(tiny_checkpoint), *VLLM_NO_OP_FLAGS])) == 0
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert lines == ["accepted for vLLM compatibility and ignored: --trust-remote-code, "
                     "--enable-auto-tool-choice, --load-format safetensors, --tool-call-parser "
                     "kimi_k3, --reasoning-parser kimi_k3"]


@pytest.mark.parametrize("spelling", ["kebab", "snake"])
def test_limit_flags_reach_the_app(spelling):
    names = ["max-request-body-bytes", "max-chat-messages", "max-content-parts"]
    argv = []
    for i, name in enumerate(names):
        argv += ["--" + (name if spelling == "kebab" else name.replace("-", "_")), str(10 + i)]
    assert launch.limits_from_args(parse(argv)) == launch.ServerLimits(10, 11, 12)
    assert launch.limits_from_args(parse([])) == launch.ServerLimits()


def test_a_bad_limit_exits_2_naming_it(tiny_checkpoint, caplog):
    with caplog.at_level(logging.ERROR, logger="server.launch"):
        assert launch.serve(parse(["--model", str(tiny_checkpoint),
                                   "--max-chat-messages", "0"])) == 2
    assert "max_chat_messages must be >= 1, got 0" in caplog.text
