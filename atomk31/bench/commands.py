"""`atomk31 bench serve | latency | throughput`: their flags and what each runs.

`add_bench_arguments(parser)` registers the three subcommands (cheap: no torch import);
`run_bench(args)` runs the chosen one and returns the process exit code. The offline benchmarks
take the engine's own flags (server/launch.py's `add_engine_arguments`, validated by
EngineConfig), so `--kernel-backend`, `--block-size`, `--enforce-eager`,
`--online-quant-config`, `--kv-cache-dtype`, ... mean what they mean for `atomk31 serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from atomk31.bench.errors import BenchmarkError

logger = logging.getLogger(__name__)

SERVE_DEFAULT_URL = "http://127.0.0.1:8000"


def _int_list(text: str) -> tuple[int, ...]:
    """"1,16,64" -> (1, 16, 64): positive integers."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as "
                                         f"1,16,64; got {text!r}")
    return values


def _flag(parser: argparse.ArgumentParser, name: str, *aliases: str, **kwargs) -> None:
    """Register `--kebab-case`, its `--snake_case` spelling and any aliases."""
    kebab, snake = "--" + name.replace("_", "-"), "--" + name.replace("-", "_")
    flags = [kebab] + ([snake] if snake != kebab else []) + list(aliases)
    parser.add_argument(*flags, dest=name.replace("-", "_"), **kwargs)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench` command's subcommands and flags."""
    sub = parser.add_subparsers(dest="bench_command", required=True)
    _add_serve_arguments(sub.add_parser(
        "serve", help="load an OpenAI-compatible server (vllm bench serve's client)"))
    from server.launch import add_engine_arguments

    latency = sub.add_parser("latency", help="prefill time and decode step time, offline, "
                             "beside the measured memory and matrix rooflines")
    add_engine_arguments(latency)
    _flag(latency, "batch_sizes", type=_int_list, default=(1, 16, 64),
          help="decode batch sizes (default 1,16,64)")
    _flag(latency, "context_lens", type=_int_list, default=(2048,),
          help="decode contexts in tokens, placed without prefill (default 2048; the issue's "
               "sweep: 2048,32768,131072)")
    _flag(latency, "prefill_lens", type=_int_list, default=(2048,),
          help="prompt lengths whose prefill is timed for real (default 2048)")
    _flag(latency, "num_steps", type=int, default=20, help="timed decode steps per figure")
    _flag(latency, "warmup_steps", type=int, default=5,
          help="untimed decode steps first (CUDA-graph capture happens here)")
    _flag(latency, "num_prefill_runs", type=int, default=1,
          help="timed prefills per length (after one untimed)")
    _flag(latency, "seed", type=int, default=0, help="seed of the random prompts and cache")
    _flag(latency, "profile", type=Path, default=None,
          help="write a per-op breakdown of one decode step and one prefill chunk to this "
               "JSON file, with Chrome traces beside it")
    _flag(latency, "result_file", type=Path, default=None, help="write the results as JSON")

    throughput = sub.add_parser("throughput", help="offline requests/s and tokens/s on a "
                                "random workload")
    add_engine_arguments(throughput)
    _flag(throughput, "num_prompts", type=int, default=100)
    _flag(throughput, "input_len", type=int, default=512, help="prompt tokens")
    _flag(throughput, "output_len", type=int, default=128, help="tokens generated per prompt")
    _flag(throughput, "range_ratio", type=float, default=0.0,
          help="lengths uniform within ±this share of --input-len / --output-len")
    _flag(throughput, "seed", type=int, default=0)
    _flag(throughput, "result_file", type=Path, default=None, help="write the results as JSON")


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    _flag(parser, "base_url", default=None,
          help=f"the server's base URL (default http://HOST:PORT, i.e. {SERVE_DEFAULT_URL})")
    _flag(parser, "host", default="127.0.0.1")
    _flag(parser, "port", type=int, default=8000)
    _flag(parser, "endpoint", default="/v1/completions",
          help="/v1/completions (prompts as token ids) or /v1/chat/completions (text)")
    _flag(parser, "model", default=None, help="model name (default: the first of /v1/models)")
    _flag(parser, "tokenizer", type=Path, default=None,
          help="checkpoint directory holding the server's tokenizer (default: --model when it "
               "is a local directory, or the built-in checkpoint for its name)")
    _flag(parser, "prompt_format", choices=["token-ids", "text"], default=None,
          help="how prompts are sent (default: token ids on /v1/completions, text on chat)")
    _flag(parser, "dataset_name", choices=["random"], default="random")
    _flag(parser, "input_len", "--random-input-len", type=int, default=1024)
    _flag(parser, "output_len", "--random-output-len", type=int, default=128)
    _flag(parser, "range_ratio", "--random-range-ratio", type=float, default=0.0,
          help="lengths uniform within ±this share of the means")
    _flag(parser, "num_prompts", type=int, default=100)
    _flag(parser, "num_warmups", type=int, default=0,
          help="requests sent first, at the same concurrency, and not counted (other random "
               "prompts): a server's first steps of a shape may compile or capture graphs")
    _flag(parser, "seed", type=int, default=0)
    _flag(parser, "max_concurrency", type=int, default=None,
          help="requests in flight at most (default: no bound)")
    _flag(parser, "request_rate", type=float, default=float("inf"),
          help="requests/s of a Poisson process (default inf: all at once)")
    _flag(parser, "ignore_eos", action="store_true", help="send ignore_eos: every request "
          "generates its full --output-len")
    _flag(parser, "temperature", type=float, default=None,
          help="sampling temperature (default: the server's)")
    _flag(parser, "percentile_metrics", default="ttft,tpot,itl,e2el",
          help="metrics whose percentiles are printed")
    _flag(parser, "metric_percentiles", "--percentiles", default="99",
          help="percentiles to report, e.g. 50,90,99")
    _flag(parser, "goodput", nargs="+", default=None, metavar="KEY:MS",
          help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)")
    _flag(parser, "request_timeout", type=float, default=600.0,
          help="seconds a request may take before it counts as failed")
    _flag(parser, "api_key", default=None, help="sent as 'Authorization: Bearer KEY'")
    _flag(parser, "disable_tqdm", action="store_true", help="no progress bar")
    _flag(parser, "result_file", type=Path, default=None, help="write the results as JSON")


def run_bench(args: argparse.Namespace, builtin_checkpoint: Callable[[], Path]) -> int:
    """Run `atomk31 bench <command>`; -> the exit code (2: bad flags or setup).
    `builtin_checkpoint()` is the built-in tiny checkpoint's directory (made on first use):
    the offline benchmarks' default --model, and the tokenizer of a server serving it."""
    runners = {"serve": _run_serve, "latency": _run_latency, "throughput": _run_throughput}
    from atomk31.config import ConfigError
    from atomk31.engine.llm_engine import PromptTooLongError

    try:
        return runners[args.bench_command](args, builtin_checkpoint)
    except (ConfigError, BenchmarkError, PromptTooLongError) as exc:
        logger.error("%s", exc)
        return 2


def _run_serve(args: argparse.Namespace, builtin_checkpoint: Callable[[], Path]) -> int:
    from atomk31.bench.environment import write_result_file
    from atomk31.bench.serve import ServeOptions, benchmark, report
    from atomk31.bench.serve_metrics import METRICS, parse_goodput, parse_percentiles

    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = sorted(set(selected) - set(METRICS))
    if unknown:
        raise BenchmarkError(f"--percentile-metrics: unknown {unknown}; choose from "
                         f"{', '.join(METRICS)}")
    _check_positive(args, "input_len", "output_len", "num_prompts", "request_timeout")
    if args.num_warmups < 0:
        raise BenchmarkError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise BenchmarkError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if not args.request_rate > 0:
        raise BenchmarkError(f"--request-rate must be > 0 (inf: all at once), got "
                             f"{args.request_rate}")
    options = ServeOptions(
        base_url=args.base_url or f"http://{args.host}:{args.port}", endpoint=args.endpoint,
        model=args.model, tokenizer=args.tokenizer, input_len=args.input_len,
        output_len=args.output_len, num_prompts=args.num_prompts, range_ratio=args.range_ratio,
        seed=args.seed, max_concurrency=args.max_concurrency, request_rate=args.request_rate,
        ignore_eos=args.ignore_eos, temperature=args.temperature,
        prompt_format=args.prompt_format,
        request_timeout=args.request_timeout, api_key=args.api_key,
        disable_tqdm=args.disable_tqdm, num_warmups=args.num_warmups)
    result = asyncio.run(benchmark(options, parse_percentiles(args.metric_percentiles),
                                   parse_goodput(args.goodput), builtin_checkpoint))
    print(report(result, selected))
    if args.result_file is not None:
        write_result_file(args.result_file, result)
        print(f"wrote {args.result_file}")
    return 0 if result["completed"] else 1


def _run_latency(args: argparse.Namespace, builtin_checkpoint: Callable[[], Path]) -> int:
    from atomk31.bench.latency import LatencyOptions
    from atomk31.bench.offline_report import run_and_report_latency

    _check_positive(args, "num_steps", "num_prefill_runs")
    if args.warmup_steps < 0:
        raise BenchmarkError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    options = LatencyOptions(batch_sizes=args.batch_sizes, context_lens=args.context_lens,
                             prefill_lens=args.prefill_lens, num_steps=args.num_steps,
                             warmup_steps=args.warmup_steps,
                             num_prefill_runs=args.num_prefill_runs, seed=args.seed)
    return run_and_report_latency(_engine(args, builtin_checkpoint), options, args.profile,
                                  args.result_file,
                                  settings=_settings(args))


def _run_throughput(args: argparse.Namespace, builtin_checkpoint: Callable[[], Path]) -> int:
    from atomk31.bench.offline_report import run_and_report_throughput

    _check_positive(args, "num_prompts", "input_len", "output_len")
    return run_and_report_throughput(_engine(args, builtin_checkpoint), args.num_prompts,
                                     args.input_len,
                                     args.output_len, args.range_ratio, args.seed,
                                     args.result_file, settings=_settings(args))


def _engine(args: argparse.Namespace, builtin_checkpoint: Callable[[], Path]):
    from atomk31.engine.llm_engine import LLMEngine
    from server.launch import engine_config_from_args

    model = str(args.model) if args.model is not None else str(builtin_checkpoint())
    return LLMEngine(engine_config_from_args(args, model))


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if not getattr(args, name) > 0:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be > 0, got "
                                 f"{getattr(args, name)}")


def _settings(args: argparse.Namespace) -> dict:
    """The command line's values, for the result file."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("command", "bench_command", "log_level")}
