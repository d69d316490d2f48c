"""atomk31/bench/commands.py: the flags of `atomk31 bench` and the messages for bad ones."""

from __future__ import annotations

import argparse
import logging
import re
import sys

import pytest

from atomk31.bench.commands import _int_list, add_bench_arguments
from atomk31.cli import main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(argv)


def test_latency_takes_the_engine_flags_and_its_sweep():
    args = parse(["latency", "--kernel-backend", "triton", "--enforce-eager", "--block_size",
                  "64", "--batch-sizes", "1,16,64", "--context-lens", "2048,32768,131072",
                  "--kv-cache-dtype", "bf16", "--index-cache-dtype", "mxfp4"])
    assert args.batch_sizes == (1, 16, 64) and args.context_lens == (2048, 32768, 131072)
    assert args.kernel_backend == "triton" and args.enforce_eager and args.block_size == 64
    assert args.kv_cache_dtype == "bf16" and args.index_cache_dtype == "mxfp4"


def test_serve_accepts_vllms_spellings():
    args = parse(["serve", "--random-input-len", "2048", "--random-output-len", "256",
                  "--percentiles", "50,90,99", "--max-concurrency", "16", "--ignore-eos",
                  "--goodput", "ttft:500", "tpot:50"])
    assert (args.input_len, args.output_len) == (2048, 256)
    assert args.metric_percentiles == "50,90,99" and args.goodput == ["ttft:500", "tpot:50"]
    assert args.request_rate == float("inf") and args.endpoint == "/v1/completions"


@pytest.mark.parametrize("text", ["", "1,x", "0,4", "-2"])
def test_int_lists_must_be_positive_integers(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated positive "
                                                         "integers such as 1,16,64"):
        _int_list(text)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--num-prompts", "0"], "--num-prompts must be > 0, got 0"),
    (["serve", "--max-concurrency", "0"], "--max-concurrency must be >= 1, got 0"),
    (["serve", "--request-rate", "0"], r"--request-rate must be > 0 \(inf: all at once\)"),
    (["serve", "--percentile-metrics", "ttft,speed"], r"--percentile-metrics: unknown \['speed'\]"),
    (["latency", "--num-steps", "0"], "--num-steps must be > 0, got 0"),
    (["latency", "--warmup-steps", "-1"], "--warmup-steps must be >= 0, got -1"),
    (["throughput", "--output-len", "0"], "--output-len must be > 0, got 0"),
    (["latency", "--block-size", "96", "--model", sys.prefix],
     "block_size must be a power of two, got 96"),
], ids=["prompts", "concurrency", "rate", "metrics", "steps", "warmup", "output", "engine"])
def test_bad_flags_exit_with_a_message(argv, message, caplog):
    with caplog.at_level(logging.ERROR):
        assert main(["bench", *argv]) == 2
    assert re.search(message, caplog.text), caplog.text
