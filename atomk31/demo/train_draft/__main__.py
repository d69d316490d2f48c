"""`python -m atomk31.demo.train_draft --target DIR --out DIR [--seed S] [--max-minutes M]`.

Writes DIR/config.json, DIR/model.safetensors (the best draft on the held-out set) and
DIR/train_result.json. The shipped draft: `--target atomk31/demo/weights --threads 2
--max-minutes 30`, then its three files copied into atomk31/demo/weights/dspark/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atomk31.demo.train.run_setup import start_run
from atomk31.demo.train_draft.draft_config import DRAFT_SIZES
from atomk31.demo.train_draft.loop import DraftRunOptions, DraftTrainer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m atomk31.demo.train_draft",
                                     description="distill the built-in model into its DSpark draft")
    parser.add_argument("--target", type=Path, required=True,
                        help="the target checkpoint (the built-in model: atomk31/demo/weights)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=30.0,
                        help="wall-clock budget from start-up; the best draft is kept")
    parser.add_argument("--steps", type=int, default=None,
                        help="exact step count (default: until --max-minutes)")
    parser.add_argument("--size", choices=DRAFT_SIZES, default="demo")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="continue from a draft this trainer wrote (same target and size)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start_run(args.threads, args.steps)
    options = DraftRunOptions(target=args.target, out=args.out, seed=args.seed,
                              max_minutes=args.max_minutes, steps=args.steps, size=args.size,
                              device=args.device, init_from=args.init_from)
    DraftTrainer(options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
