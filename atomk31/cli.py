"""The `atomk31` command line: make-checkpoint, generate.

This is the one place (with config.py) that reads the environment: the default model directory
lives under $XDG_CACHE_HOME (or ~/.cache), so `atomk31 generate` runs on a fresh machine with no
arguments by generating the built-in tiny checkpoint on first use.
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
    """Generate the built-in tiny checkpoint into the cache directory if it is absent."""
    from atomk31.checkpoint import make_checkpoint

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
    _add_flag(make, "preset", choices=["tiny", "proxy"], default="tiny")
    _add_flag(make, "seed", type=int, default=0)
    _add_flag(make, "out", type=Path, required=True, help="output directory")
    _add_flag(make, "max_shard_bytes", type=int, default=2 << 30)

    gen = sub.add_parser("generate", help="greedy continuation of a prompt")
    _add_flag(gen, "model", type=Path, default=None,
              help="checkpoint directory (default: the built-in tiny checkpoint)")
    _add_flag(gen, "prompt", action="append", default=None,
              help="prompt text (repeat for several prompts)")
    _add_flag(gen, "max_tokens", type=int, default=16)
    return parser


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from atomk31.checkpoint import make_checkpoint

    make_checkpoint(args.preset, seed=args.seed, out=args.out, max_shard_bytes=args.max_shard_bytes)
    print(f"wrote the {args.preset} checkpoint (seed {args.seed}) to {args.out}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from atomk31.checkpoint import Tokenizer
    from atomk31.reference import ReferenceModel

    if args.max_tokens < 1:
        raise SystemExit(f"--max-tokens must be >= 1, got {args.max_tokens}")
    model_dir = args.model or ensure_default_model()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = ReferenceModel.from_pretrained(model_dir)
    for prompt in args.prompt or ["The quick brown fox"]:
        ids = tokenizer.encode(prompt)
        if not ids:
            raise SystemExit("--prompt is empty: give at least one character")
        with torch.inference_mode():
            new = model.greedy(torch.tensor(ids), args.max_tokens)
        print(f"prompt: {prompt!r} ({len(ids)} tokens)")
        print(f"output: {tokenizer.decode(new)!r}")
        print(f"tokens: {new}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    commands = {"make-checkpoint": _cmd_make_checkpoint, "generate": _cmd_generate}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
