"""The `atomk31` command line: serve, generate, bench, eval, info, make-checkpoint.

This is the one place (with config.py) that reads the environment. The default model is the
trained demo checkpoint shipped in the package (atomk31/demo/weights/) when it is there; else
the random tiny checkpoint, generated under $XDG_CACHE_HOME (or ~/.cache) on first use, so
`atomk31 generate` runs on a fresh machine with no arguments either way.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("atomk31")

DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 0


def default_model_dir() -> Path:
    """Where the built-in tiny checkpoint is generated on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "atomk31" / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}"


def ensure_default_model() -> Path:
    """The shipped demo checkpoint if the package has one, else the built-in tiny checkpoint
    (generated into the cache directory if it is absent)."""
    from atomk31.checkpoint import make_checkpoint
    from atomk31.demo.shipped import shipped_checkpoint

    shipped = shipped_checkpoint()
    if shipped is not None:
        return shipped
    path = default_model_dir()
    if not (path / "config.json").is_file():
        logger.info("generating the built-in tiny checkpoint into %s", path)
        make_checkpoint(DEFAULT_PRESET, seed=DEFAULT_SEED, out=path)
    return path


def _add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Register `--kebab-case` and its `--snake_case` spelling for one option."""
    kebab = "--" + name.replace("_", "-")
    snake = "--" + name.replace("-", "_")
    flags = [kebab] if kebab == snake else [kebab, snake]
    parser.add_argument(*flags, **kwargs)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atomk31", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    make = sub.add_parser("make-checkpoint", help="write a random checkpoint of a preset")
    _add_flag(make, "preset", choices=["tiny", "proxy", "proxy-mini", "tiny-dspark"],
              default="tiny", help="tiny-dspark: the DSpark draft of tiny (MODEL_SPEC §5.8)")
    _add_flag(make, "seed", type=int, default=0)
    _add_flag(make, "out", type=Path, required=True, help="output directory")
    _add_flag(make, "max_shard_bytes", type=int, default=2 << 30)
    _add_flag(make, "device", default="cpu",
              help="where to draw the weights: cuda draws a real-width preset in seconds")

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    from server.launch import add_serve_arguments

    add_serve_arguments(serve)

    bench = sub.add_parser("bench", help="benchmarks: serve (an HTTP client), latency and "
                           "throughput (offline)")
    from atomk31.bench.commands import add_bench_arguments

    add_bench_arguments(bench)

    gen = sub.add_parser("generate", help="greedy continuation of prompts (offline engine)")
    _add_flag(gen, "model", type=Path, default=None,
              help="checkpoint directory (default: the built-in model)")
    _add_flag(gen, "prompt", action="append", default=None,
              help="prompt text (repeat for several prompts)")
    _add_flag(gen, "max_tokens", type=int, default=16)
    _add_flag(gen, "block_size", type=int, default=128)
    _add_flag(gen, "kernel_backend", default="auto",
              choices=["auto", "torch", "triton", "hopper", "amd"])
    _add_flag(gen, "reference", action="store_true",
              help="compute with the float32 reference model (the oracle) instead of the engine")
    from atomk31.distributed.flags import add_parallel_arguments

    add_parallel_arguments(gen)

    evaluate = sub.add_parser("eval", help="score the demo task families through a server's "
                              "OpenAI API")
    from atomk31.demo.evaluate import add_eval_arguments

    add_eval_arguments(evaluate)

    info = sub.add_parser("info", help="the platform and the kernel chosen for every op")
    from atomk31.info import add_info_arguments

    add_info_arguments(info, _add_flag)
    return parser


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from atomk31.checkpoint import make_checkpoint

    make_checkpoint(args.preset, seed=args.seed, out=args.out, max_shard_bytes=args.max_shard_bytes,
                    device=args.device)
    print(f"wrote the {args.preset} checkpoint (seed {args.seed}) to {args.out}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise SystemExit(f"--max-tokens must be >= 1, got {args.max_tokens}")
    model_dir = args.model or ensure_default_model()
    prompts = args.prompt or ["The quick brown fox"]
    if any(not p for p in prompts):
        raise SystemExit("--prompt is empty: give at least one character")
    if args.reference:
        outputs = _generate_with_reference(model_dir, prompts, args.max_tokens)
    else:
        from atomk31.distributed.flags import parallel_options
        from atomk31.engine.worker import run_torchrun_worker_if_not_first

        options = dict(block_size=args.block_size, kernel_backend=args.kernel_backend,
                       **parallel_options(args))
        if run_torchrun_worker_if_not_first(str(model_dir), options):
            return 0
        from atomk31 import LLM, SamplingParams

        with LLM(model_dir, **options) as llm:
            params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
            outputs = [(o.prompt_token_ids, o.outputs[0].token_ids, o.outputs[0].text)
                       for o in llm.generate(prompts, params)]
    for prompt, (prompt_ids, new_ids, text) in zip(prompts, outputs):
        print(f"prompt: {prompt!r} ({len(prompt_ids)} tokens)")
        print(f"output: {text!r}")
        print(f"tokens: {new_ids}")
    return 0


def _generate_with_reference(model_dir: Path, prompts: list[str],
                             max_tokens: int) -> list[tuple[list[int], list[int], str]]:
    import torch

    from atomk31.checkpoint import Tokenizer
    from atomk31.reference import ReferenceModel

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = ReferenceModel.from_pretrained(model_dir, index_key_format="fp8")
    results = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        with torch.inference_mode():
            new = model.greedy(torch.tensor(ids), max_tokens)
        results.append((ids, new, tokenizer.decode(new, skip_special_tokens=True)))
    return results


def _cmd_info(args: argparse.Namespace) -> int:
    from atomk31.info import run_info

    return run_info(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from atomk31.demo.evaluate import cmd_eval

    return cmd_eval(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from server.launch import serve

    return serve(args, ensure_default_model)


def _cmd_bench(args: argparse.Namespace) -> int:
    from atomk31.bench.commands import run_bench

    return run_bench(args, ensure_default_model)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    commands = {"make-checkpoint": _cmd_make_checkpoint, "generate": _cmd_generate,
                "info": _cmd_info, "serve": _cmd_serve, "bench": _cmd_bench, "eval": _cmd_eval}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
