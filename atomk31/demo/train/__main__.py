"""`python -m atomk31.demo.train --seed 0 --out DIR [--device cuda] [--max-minutes M]`.

Writes DIR/checkpoint (the best weights: config.json, tokenizer files, model.safetensors,
train_result.json), DIR/train_result.json and DIR/tokenizer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from atomk31.demo.train.kda_backend import KDA_BACKENDS
from atomk31.demo.train.loop import RunOptions, Trainer
from atomk31.demo.train.run_setup import start_run
from atomk31.demo.tasks import FAMILIES
from atomk31.demo.train.settings import FAMILY_WEIGHTS, PROFILES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m atomk31.demo.train",
                                     description="train the built-in K3.1 demo model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="gpu | cpu | toy (default: gpu on a GPU, else cpu)")
    parser.add_argument("--max-minutes", type=float, default=7.0,
                        help="wall-clock budget from start-up; the best weights are kept")
    parser.add_argument("--steps", type=int, default=None,
                        help="exact step count (default: fitted to --max-minutes)")
    parser.add_argument("--kda-backend", choices=KDA_BACKENDS, default="torch",
                        help="KDA scan: torch (default), fla (fla's chunk_kda on a GPU), auto (fla if "
                        "it agrees with torch on a random batch)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start from this checkpoint's weights (e.g. a previous run's "
                        "DIR/checkpoint) instead of a random init")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--family-weights", type=_family_weights, default=None,
                        metavar="A,P,T,C", help="the mixed batch's weights of arithmetic, "
                        "passkey, tools, chat (default: the profile's, "
                        f"{','.join(map(str, FAMILY_WEIGHTS))})")
    parser.add_argument("--peak-lr", type=float, default=None,
                        help="peak learning rate (default: the profile's; a run from "
                        "--init-from wants less)")
    return parser


def _family_weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        weights = ()
    if len(weights) != len(FAMILIES) or min(weights) < 0 or not sum(weights) > 0:
        raise argparse.ArgumentTypeError(
            f"expected {len(FAMILIES)} non-negative weights, not all 0, for "
            f"{', '.join(FAMILIES)}; got {text!r}")
    return weights


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.peak_lr is not None and not args.peak_lr > 0:
        raise SystemExit(f"--peak-lr must be > 0, got {args.peak_lr}")
    start_run(args.threads, args.steps)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    profile = args.profile or ("gpu" if device.startswith("cuda") else "cpu")
    options = RunOptions(seed=args.seed, out=args.out, profile=profile, device=device,
                         max_minutes=args.max_minutes, steps=args.steps,
                         kda_backend=args.kda_backend, init_from=args.init_from,
                         family_weights=args.family_weights, peak_lr=args.peak_lr)
    Trainer(options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
