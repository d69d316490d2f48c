"""`atomk31 serve`: its flags and the function that runs the server (uvicorn).

`add_serve_arguments(parser)` registers every flag in `--kebab-case` and `--snake_case`; it is
cheap, since this module imports no torch until `serve` runs. `serve(args)` turns the flags into
an EngineConfig (validated once, every problem listed), builds the app and runs uvicorn until
interrupted. Without `--model` it serves the built-in model: the trained demo checkpoint shipped
in the package, or while there is none the random tiny checkpoint, generated into the cache
directory on first use; so it runs on any machine.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from atomk31.config import (
    DEQUANTIZE_EXPERTS, DTYPES, INDEX_CACHE_DTYPES, KERNEL_BACKENDS, KV_CACHE_DTYPES, ConfigError,
    EngineConfig,
)
from atomk31.distributed.flags import add_parallel_arguments, parallel_options
from server.limits import ServerLimits

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MODEL_NAME = "atomk31-tiny"   # the name of the built-in tiny checkpoint
DEMO_MODEL_NAME = "atomk31-demo"      # the name of the shipped trained checkpoint
DEFAULTS = EngineConfig(model="")     # the engine's own defaults, written once, in config.py
LIMITS = ServerLimits()               # the server's, in server/limits.py
K3_PARSER = "kimi_k3"                 # vLLM's name for K3's tool-call and reasoning parsers
LOAD_FORMATS = ("auto", "safetensors")


def _add_flag(parser: argparse.ArgumentParser, name: str, help: str, default: Any,
              value_type: Callable[[str], Any] | None = None,
              choices: Sequence[str] | None = None) -> None:
    """Register `--kebab-case` and `--snake_case` spellings of one option."""
    kebab, snake = "--" + name.replace("_", "-"), "--" + name.replace("-", "_")
    flags = [kebab] if kebab == snake else [kebab, snake]
    parser.add_argument(*flags, dest=name.replace("-", "_"), help=help, default=default,
                        type=value_type, choices=choices)


def add_vllm_compatible_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM flags that mean nothing here, so that `vllm serve` command lines run unchanged:
    accepted (with the one value that fits K3) and logged once at start-up as ignored."""
    for name, help in (("trust_remote_code", "accepted for vLLM compatibility; no remote code "
                        "runs (K3's tokenizer and chat format are built in)"),
                       ("enable_auto_tool_choice", "accepted for vLLM compatibility; tool calls "
                        "are always parsed")):
        parser.add_argument("--" + name.replace("_", "-"), "--" + name, dest=name,
                            action="store_true", default=False, help=help)
    _add_flag(parser, "load_format", "accepted for vLLM compatibility: checkpoints load from "
              "safetensors", default=None, value_type=_only_of(LOAD_FORMATS, "--load-format",
                                                               "checkpoints load from safetensors"))
    for name in ("tool_call_parser", "reasoning_parser"):
        _add_flag(parser, name, f"accepted for vLLM compatibility: K3's own parser always runs "
                  f"(only {K3_PARSER} is accepted)", default=None,
                  value_type=_only_of((K3_PARSER,), "--" + name.replace("_", "-"),
                                      "this server parses Kimi K3's own format"))


def _only_of(accepted: Sequence[str], flag: str, why: str) -> Callable[[str], str]:
    """An argparse type accepting only `accepted`: a vLLM flag whose meaning is fixed here."""
    def check(value: str) -> str:
        if value not in accepted:
            raise argparse.ArgumentTypeError(f"{value!r} is not supported: {why}; pass {flag} "
                                             f"{' or '.join(accepted)} or leave the flag out")
        return value
    return check


def ignored_vllm_flags(args: argparse.Namespace) -> list[str]:
    """The vLLM-compatibility flags given, as `--flag value`, for the start-up log."""
    given = []
    for name in ("trust_remote_code", "enable_auto_tool_choice"):
        if getattr(args, name, False):
            given.append("--" + name.replace("_", "-"))
    for name in ("load_format", "tool_call_parser", "reasoning_parser"):
        if getattr(args, name, None) is not None:
            given.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    return given


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request may cost before it reaches the engine (server/limits.py)."""
    _add_flag(parser, "max_request_body_bytes", "largest request body; beyond, 413 (default "
              f"{LIMITS.max_request_body_bytes})", value_type=int,
              default=LIMITS.max_request_body_bytes)
    _add_flag(parser, "max_chat_messages", "most messages in one chat request (default "
              f"{LIMITS.max_chat_messages})", value_type=int, default=LIMITS.max_chat_messages)
    _add_flag(parser, "max_content_parts", "most content parts and blocks in one chat request "
              f"(default {LIMITS.max_content_parts})", value_type=int,
              default=LIMITS.max_content_parts)


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """ServerLimits from parsed flags; raises ConfigError naming each bad value."""
    try:
        return ServerLimits(max_request_body_bytes=args.max_request_body_bytes,
                            max_chat_messages=args.max_chat_messages,
                            max_content_parts=args.max_content_parts)
    except ValueError as exc:
        raise ConfigError([str(exc)], source="serve flags") from exc


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `atomk31 serve`: the server's own, then the engine's."""
    _add_flag(parser, "host", f"address to listen on (default {DEFAULT_HOST})",
              default=DEFAULT_HOST)
    _add_flag(parser, "port", f"port to listen on (default {DEFAULT_PORT})", value_type=int,
              default=DEFAULT_PORT)
    _add_flag(parser, "served_model_name", "the model name clients send (default: the --model "
              f"path, or {DEFAULT_MODEL_NAME!r} for the built-in checkpoint)", default=None)
    _add_flag(parser, "api_key", "require 'Authorization: Bearer KEY' on /v1 routes",
              default=None)
    add_engine_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's flags (EngineConfig's fields), shared by `atomk31 serve` and the offline
    benchmarks (`atomk31 bench latency | throughput`); `engine_config_from_args` reads them."""
    _add_flag(parser, "model", "checkpoint directory (default: the built-in model)",
              default=None)
    _add_flag(parser, "block_size", "KV-cache block size in tokens, a power of two",
              value_type=int, default=DEFAULTS.block_size)
    _add_flag(parser, "kernel_backend", "kernels: auto picks amd on ROCm, hopper on sm_90, "
              "triton on other CUDA GPUs, torch on CPU (`atomk31 info` prints the tables)",
              choices=KERNEL_BACKENDS, default=DEFAULTS.kernel_backend)
    _add_flag(parser, "dtype", "compute dtype", choices=DTYPES, default=DEFAULTS.dtype)
    _add_flag(parser, "max_model_len", "context length (default: the checkpoint's)",
              value_type=int, default=DEFAULTS.max_model_len)
    _add_flag(parser, "max_num_seqs", "sequences per batch at most", value_type=int,
              default=DEFAULTS.max_num_seqs)
    _add_flag(parser, "max_num_batched_tokens", "tokens per step at most", value_type=int,
              default=DEFAULTS.max_num_batched_tokens)
    _add_flag(parser, "max_num_waiting", "waiting requests at most; beyond, the server "
              "answers 503", value_type=int, default=DEFAULTS.max_num_waiting)
    _add_flag(parser, "kv_cache_dtype", "MLA latent cache dtype", choices=KV_CACHE_DTYPES,
              default=DEFAULTS.kv_cache_dtype)
    _add_flag(parser, "index_cache_dtype", "indexer key cache format",
              choices=INDEX_CACHE_DTYPES, default=DEFAULTS.index_cache_dtype)
    _add_flag(parser, "gpu_memory_utilization", "share of GPU memory the engine may use",
              value_type=float, default=DEFAULTS.gpu_memory_utilization)
    _add_flag(parser, "kv_cache_memory", "bytes for the KV cache and KDA states (overrides "
              "--gpu-memory-utilization)", value_type=int, default=DEFAULTS.kv_cache_memory)
    _add_flag(parser, "device", "torch device (default: cuda if available, else cpu)",
              default=DEFAULTS.device)
    _add_flag(parser, "online_quant_config", "PTPC-FP8 online quantization of the BF16 "
              "linears at load: ATOM's JSON ({\"global_quant_config\": \"ptpc_fp8\", "
              "\"exclude_layer\": [...]}), inline or a path to a .json file", default=None)
    _add_flag(parser, "kda_snapshot_interval", "KDA prefix-cache snapshots every this many "
              "tokens (a multiple of --block-size; 0: only at prompt ends)", value_type=int,
              default=DEFAULTS.kda_snapshot_interval)
    _add_flag(parser, "dequantize_experts", "decode the MXFP4 routed experts once at load "
              "(auto: with torch kernels on CPU, where the expert op would decode them at "
              "every step)", choices=DEQUANTIZE_EXPERTS, default=DEFAULTS.dequantize_experts)
    _add_flag(parser, "speculative_config", "DSpark speculative decoding: JSON {\"model\": "
              "DRAFT_DIR or \"builtin\", \"num_speculative_tokens\": 5, \"method\": \"dspark\", "
              "\"draft_sample_method\": \"probabilistic\" or \"greedy\"}, inline or a path to a "
              ".json file", default=None)
    parser.add_argument("--enable-prefix-caching", "--enable_prefix_caching",
                        dest="enable_prefix_caching", action="store_true",
                        default=DEFAULTS.enable_prefix_caching,
                        help="reuse cached prompt prefixes (default: on)")
    parser.add_argument("--no-enable-prefix-caching", "--no_enable_prefix_caching",
                        dest="enable_prefix_caching", action="store_false",
                        help="turn prefix caching off")
    parser.add_argument("--enforce-eager", "--enforce_eager", dest="enforce_eager",
                        action="store_true", default=DEFAULTS.enforce_eager,
                        help="run decode steps eagerly, never from CUDA graphs (debugging, "
                             "profiling)")
    add_parallel_arguments(parser)
    add_limit_arguments(parser)
    add_vllm_compatible_arguments(parser)


def engine_config_from_args(args: argparse.Namespace, model: str) -> EngineConfig:
    """EngineConfig from parsed flags; raises ConfigError listing every bad value."""
    return EngineConfig(
        model=model, block_size=args.block_size, kernel_backend=args.kernel_backend,
        dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching, kv_cache_dtype=args.kv_cache_dtype,
        index_cache_dtype=args.index_cache_dtype, device=args.device,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory=args.kv_cache_memory, max_num_waiting=args.max_num_waiting,
        kda_snapshot_interval=args.kda_snapshot_interval,
        enforce_eager=args.enforce_eager, dequantize_experts=args.dequantize_experts,
        online_quant_config=_json_object(args.online_quant_config, "--online-quant-config"),
        speculative_config=_json_object(args.speculative_config, "--speculative-config"),
        **parallel_options(args))


def _json_object(value: str | None, flag: str) -> dict | None:
    """A flag's JSON object, given inline or as a path to a .json file."""
    if value is None:
        return None
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as e:
            raise ConfigError([f"{flag}: neither inline JSON nor a readable file: {e}"],
                              source="serve flags") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"{flag}: not valid JSON: {e}"], source="serve flags") from e


def serve(args: argparse.Namespace, default_model: Callable[[], Path] | None = None) -> int:
    """Run the server until interrupted; -> the process exit code (2: bad flags, 1: the
    engine failed to start or stopped: see server/engine_watchdog.py). ``default_model()``: the
    built-in checkpoint's directory, for when no --model is given (cli.py owns where it lives);
    without it --model is required. Under torchrun, ranks other than 0 serve no HTTP: they
    run the engine's steps."""
    # Imported here, as cli.py does, so that building the CLI parser stays light (no torch).
    import uvicorn

    from atomk31.config import torchrun_rank
    from server.app import create_app
    from server.engine_watchdog import EngineWatchdog

    if args.model is None and default_model is None:
        logger.error("no --model given; pass a checkpoint directory")
        return 2
    if args.model is None:
        from atomk31.demo.shipped import shipped_checkpoint

        default = default_model()
        model = str(default)
        name = args.served_model_name or (DEMO_MODEL_NAME if default == shipped_checkpoint()
                                          else DEFAULT_MODEL_NAME)
    else:
        model = str(args.model)
        name = args.served_model_name or model
    if args.api_key is not None and not args.api_key:
        logger.error("--api-key is empty; give a key or leave the flag out")
        return 2
    try:
        options = engine_config_from_args(args, model)
        limits = limits_from_args(args)
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    launched = torchrun_rank()
    if launched is not None and launched.rank != 0:
        from atomk31.engine.worker import run_torchrun_worker

        return run_torchrun_worker(options, launched)
    ignored = ignored_vllm_flags(args)
    if ignored:
        logger.info("accepted for vLLM compatibility and ignored: %s", ", ".join(ignored))
    app = create_app(options, served_model_name=name, api_key=args.api_key, limits=limits)
    # log_config=None: keep the process's logging set-up (cli.py's) instead of uvicorn's own.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                                           timeout_graceful_shutdown=5))
    watchdog = EngineWatchdog(server, app)
    watchdog.start()
    try:
        server.run()
    except KeyboardInterrupt:   # uvicorn re-raises Ctrl-C once its graceful shutdown is done
        logger.info("stopped")
    if watchdog.failure is not None:
        logger.error("exiting: the engine stopped: %s", watchdog.failure)
        return 1
    return 0 if server.started else 1
