"""`atomk31 bench serve` against the tiny server on loopback (issue 17): the JSON's fields and
counts, both endpoints, failures counted rather than raised, and an unreachable server."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from atomk31.bench.random_tokens import sample_lengths
from atomk31.bench.serve import (
    ServeBenchError, ServeOptions, build_requests, first_model, prompt_format, resolve_tokenizer,
)
from atomk31.checkpoint import Tokenizer
from atomk31.cli import main
from atomk31.config import EngineConfig
from server.app import create_app
from live_server import LiveServer

VLLM_FIELDS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_throughput", "request_goodput", "output_throughput",
               "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
               "latencies", "errors", "generated_texts", "max_concurrent_requests",
               "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
               "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
               "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "model_id", "num_prompts",
               "request_rate", "max_concurrency", "endpoint_type", "date")


@pytest.fixture(scope="module")
def tiny_server(tiny_checkpoint) -> Iterator[LiveServer]:
    """The tiny checkpoint served under its directory's path (so the client finds the
    tokenizer from the model id)."""
    options = EngineConfig(model=str(tiny_checkpoint), block_size=16, kernel_backend="torch")
    server = LiveServer(create_app(options, str(tiny_checkpoint)))
    yield server
    server.stop()


def bench_serve(server: LiveServer, out: Path, *flags: str) -> tuple[int, dict]:
    code = main(["bench", "serve", "--base-url", server.base_url, "--disable-tqdm",
                 "--result-file", str(out), *flags])
    return code, json.loads(out.read_text()) if out.exists() else {}


def assert_pools_free(server: LiveServer) -> None:
    engine = server.engine.engine
    deadline = time.monotonic() + 10
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.has_unfinished_requests()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_completions_at_concurrency_two_report_vllms_fields_and_counts(tiny_server, tmp_path):
    code, result = bench_serve(tiny_server, tmp_path / "r.json", "--num-prompts", "4",
                               "--max-concurrency", "2", "--input-len", "12", "--output-len",
                               "5", "--ignore-eos", "--metric-percentiles", "50,99",
                               "--goodput", "ttft:600000", "tpot:600000")
    assert code == 0
    assert set(VLLM_FIELDS) <= set(result) and "p50_e2el_ms" in result
    assert (result["completed"], result["failed"], result["num_prompts"]) == (4, 0, 4)
    assert result["input_lens"] == [12] * 4 and result["output_lens"] == [5] * 4
    assert result["total_input_tokens"] == 48 and result["total_output_tokens"] == 20
    assert result["endpoint_type"] == "openai" and result["max_concurrency"] == 2
    assert result["request_rate"] == "inf"                   # vLLM's spelling
    assert 1 <= result["max_concurrent_requests"] <= 2
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    tpots = []
    for ttft, itl, latency in zip(result["ttfts"], result["itls"], result["latencies"]):
        # A loaded server may send several tokens in one chunk (all five, even), so a request
        # has at most four gaps between chunks, and its chunks' times add up to its latency.
        assert 0 < ttft <= latency and len(itl) <= 4
        assert ttft + sum(itl) == pytest.approx(latency)
        tpots.append((latency - ttft) / 4 * 1e3)
    assert result["mean_tpot_ms"] == pytest.approx(np.mean(tpots))
    assert result["errors"] == [""] * 4
    assert result["spec_decode"] is None             # no speculation counters on this server
    assert_pools_free(tiny_server)


def generation_tokens(server: LiveServer) -> float:
    """The server's generated-token counter (its /metrics)."""
    text = httpx.get(server.base_url + "/metrics").text
    return float(re.search(r"^atomk31_generation_tokens_total (\S+)$", text, re.M).group(1))


def test_warm_ups_reach_the_server_and_are_not_counted(tiny_server, tmp_path):
    before = generation_tokens(tiny_server)
    code, result = bench_serve(tiny_server, tmp_path / "r.json", "--num-prompts", "2",
                               "--num-warmups", "3", "--max-concurrency", "2", "--input-len",
                               "12", "--output-len", "4", "--ignore-eos")
    assert code == 0 and result["num_warmups"] == 3
    assert (result["completed"], result["total_output_tokens"]) == (2, 8)
    assert generation_tokens(tiny_server) - before == 4 * (2 + 3)
    assert_pools_free(tiny_server)


def test_chat_with_poisson_arrivals_counts_the_templates_tokens(tiny_server, tmp_path):
    code, result = bench_serve(tiny_server, tmp_path / "r.json", "--endpoint",
                               "/v1/chat/completions", "--num-prompts", "2", "--input-len", "12",
                               "--output-len", "3", "--ignore-eos", "--request-rate", "20")
    assert code == 0 and result["completed"] == 2 and result["endpoint_type"] == "openai-chat"
    assert result["output_lens"] == [3, 3]
    assert all(n > 12 for n in result["input_lens"])   # the server's count: template included
    assert result["request_rate"] == 20
    assert_pools_free(tiny_server)


def test_text_prompts_encode_to_exactly_the_input_length_on_the_server(tiny_server, tmp_path):
    code, result = bench_serve(tiny_server, tmp_path / "r.json", "--prompt-format", "text",
                               "--num-prompts", "3", "--input-len", "12", "--range-ratio", "0.5",
                               "--output-len", "2", "--seed", "5")
    assert code == 0 and result["prompt_format"] == "text"
    expected = sample_lengths(3, 12, 0.5, np.random.default_rng(5))
    assert result["input_lens"] == expected          # the server's own count of each prompt


def test_a_wrong_model_name_fails_every_request_with_its_error(tiny_server, tiny_checkpoint,
                                                               tmp_path, capsys):
    code, result = bench_serve(tiny_server, tmp_path / "r.json", "--model", "no-such-model",
                               "--tokenizer", str(tiny_checkpoint), "--num-prompts", "2",
                               "--input-len", "4", "--output-len", "2")
    assert code == 1
    assert (result["completed"], result["failed"]) == (0, 2)
    assert all(e.startswith("HTTP 404") for e in result["errors"])
    assert "2 request(s) failed: HTTP 404" in capsys.readouterr().out


def test_an_unreachable_server_is_a_setup_error(tmp_path, caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # closed again: nothing listens there
    with caplog.at_level(logging.ERROR):
        code = main(["bench", "serve", "--port", str(port), "--disable-tqdm"])
    assert code == 2
    assert f"could not list the models at http://127.0.0.1:{port}/v1/models" in caplog.text


def test_chat_prompts_cannot_be_token_ids():
    options = ServeOptions(base_url="http://x", endpoint="/v1/chat/completions", model="m",
                           tokenizer=None, input_len=4, output_len=4, num_prompts=1,
                           range_ratio=0.0, seed=0, max_concurrency=None,
                           request_rate=float("inf"), ignore_eos=False, temperature=None,
                           prompt_format="token-ids", request_timeout=1.0, api_key=None,
                           disable_tqdm=True)
    with pytest.raises(ServeBenchError, match="chat messages carry text: --prompt-format "
                                              "token-ids works with --endpoint /v1/completions"):
        prompt_format(options)


def test_a_model_name_without_a_tokenizer_asks_for_one():
    with pytest.raises(ServeBenchError, match=r"cannot tell which tokenizer the model "
                                              r"'remote-model' uses; pass --tokenizer DIR"):
        resolve_tokenizer(None, "remote-model")



def test_a_server_listing_no_model_asks_for_one():
    def no_models(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": []})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(no_models)) as client:
            return await first_model(client, "http://server", {})

    with pytest.raises(ServeBenchError, match=r"http://server/v1/models lists no model; pass "
                                              r"--model NAME"):
        asyncio.run(go())


def test_a_tokenizer_directory_without_a_tokenizer_is_refused(tmp_path):
    with pytest.raises(ServeBenchError, match=r"--tokenizer: no tiktoken.model in .*; pass the "
                                              r"checkpoint directory"):
        resolve_tokenizer(tmp_path, "m")


def test_a_vocabulary_without_word_tokens_cannot_make_text_prompts():
    byte_level = Tokenizer({bytes([i]): i for i in range(256)}, {})
    options = ServeOptions(base_url="http://x", endpoint="/v1/chat/completions", model="m",
                           tokenizer=None, input_len=4, output_len=4, num_prompts=1,
                           range_ratio=0.0, seed=0, max_concurrency=None,
                           request_rate=float("inf"), ignore_eos=False, temperature=None,
                           prompt_format=None, request_timeout=1.0, api_key=None,
                           disable_tqdm=True)
    with pytest.raises(ServeBenchError, match=r"the tokenizer has no word tokens .* use "
                                              r"--endpoint /v1/completions"):
        build_requests(options, byte_level)
