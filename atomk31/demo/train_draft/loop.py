"""The distillation run: target batches into a pool, draft steps on blocks cut from the pool.

Each step trains on a random batch of the pool (the last `pool_size` target batches) with fresh
anchors and a block width drawn from `block_rows` (the engine runs 1..16 drafts; the trained
range covers the usual 3..7), so one target forward, the expensive part on a CPU, feeds
`steps_per_target_batch` steps. Loss: cross-entropy of the Markov head's logits
`U_j + W1[x_{j-1}] W2ᵀ` against the target's greedy token, every row weighted alike. The
learning rate follows the wall clock (warm-up, then cosine to a tenth), so a run fills
`--max-minutes`. The held-out set (the tasks' eval split) is scored every `eval_every_s` and at
the end by greedy acceptance length; the best weights are written.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from atomk31.checkpoint import Tokenizer
from atomk31.checkpoint.dspark_writer import write_draft
from atomk31.checkpoint.shards import SINGLE_FILE
from atomk31.demo.tasks import FAMILIES
from atomk31.demo.train.data import IGNORE
from atomk31.demo.train_draft.data import (Blocks, TargetBatch, anchors_of, cut_blocks,
                                           draw_examples, run_target)
from atomk31.demo.train_draft.draft_config import draft_config, mask_token_of
from atomk31.demo.train_draft.draft_model import TrainableDraft
from atomk31.demo.train_draft.target import FrozenTarget
from atomk31.speculative_config import DraftConfig

logger = logging.getLogger(__name__)

EVAL_BLOCK_ROWS = (3, 5, 7)


@dataclass(frozen=True)
class DraftRunOptions:
    target: Path
    out: Path
    seed: int = 0
    max_minutes: float = 30.0
    steps: int | None = None           # exact step count (else until the deadline)
    size: str = "demo"
    device: str = "cpu"
    sequences_per_batch: int = 8
    blocks_per_sequence: int = 16
    block_rows: tuple[int, int] = (2, 8)
    steps_per_target_batch: int = 4
    pool_size: int = 16
    peak_lr: float = 3e-3
    warmup_steps: int = 15
    eval_per_family: int = 8
    eval_families: tuple[str, ...] = FAMILIES
    eval_every_s: float = 600.0
    family_weights: tuple[float, ...] = (0.35, 0.1, 0.35, 0.2)   # FAMILIES order
    passkey_tokens: tuple[int, int] = (120, 300)
    init_from: Path | None = None      # a draft written by this trainer, to train further


def draft_loss(draft: TrainableDraft, batch: TargetBatch, blocks: Blocks,
               target: FrozenTarget) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean CE over labelled rows, the Markov head's greedy picks [B, Q])."""
    device = target.embed.device
    base = draft.block_logits(batch.aux.to(device), blocks.ids.to(device),
                              blocks.positions.to(device), blocks.visible.to(device),
                              target.embed, target.lm_head)
    logits = base + draft.markov_head(blocks.previous.to(device))
    labels = blocks.labels.to(device)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    return loss, logits.argmax(dim=-1)


@torch.no_grad()
def acceptance_lengths(draft: TrainableDraft, batches: list[TargetBatch], target: FrozenTarget,
                       block_rows: int, seed: int) -> dict[str, float]:
    """Per family, the mean greedy acceptance length (1 + leading drafts equal to the target's
    greedy tokens) of blocks at 8 random completion anchors per sequence. With the Markov input
    teacher-forced, the leading matches are exactly those of the draft's own chain."""
    generator = torch.Generator().manual_seed(seed)
    sums, counts = torch.zeros(len(FAMILIES)), torch.zeros(len(FAMILIES))
    for batch in batches:
        blocks = cut_blocks(batch, anchors_of(batch, 8, generator), block_rows,
                            draft.config.mask_token_id)
        _, picks = draft_loss(draft, batch, blocks, target)
        match = (picks.cpu() == blocks.labels).view(*blocks.labels.shape[:1], -1, block_rows)
        accepted = match.long().cumprod(dim=-1).sum(dim=-1).float() + 1     # [B, K]
        sums.index_add_(0, batch.families, accepted.sum(dim=1))
        counts.index_add_(0, batch.families, torch.full((len(batch.families),), 8.0))
    return {f: round(float(s / c), 4) for f, s, c in zip(FAMILIES, sums, counts) if c}


class DraftTrainer:
    def __init__(self, options: DraftRunOptions) -> None:
        self.options = options
        self.started = time.monotonic()
        self.deadline = self.started + options.max_minutes * 60
        torch.manual_seed(options.seed)
        self.rng = random.Random(f"atomk31-demo/draft/{options.seed}")
        self.generator = torch.Generator().manual_seed(options.seed)
        self.target = FrozenTarget(options.target, torch.device(options.device))
        self.tokenizer = Tokenizer.from_pretrained(options.target)
        self.pad_id = self.tokenizer.token_id("[PAD]")
        mask = mask_token_of(self.tokenizer, self.target.config.vocab_size)
        self.config_json = draft_config(options.size, self.target.config_json, mask)
        self.config = DraftConfig.from_dict(self.config_json, source="the draft to train")
        problems = self.config.problems_against(self.target.config,
                                               self.target.config.max_position_embeddings)
        if problems:
            raise ValueError("the draft config does not fit the target: " + "; ".join(problems))
        self.draft = TrainableDraft(self.config).to(options.device)
        if options.init_from is not None:
            self._load_draft(Path(options.init_from))
        else:
            with torch.no_grad():
                self.draft.final_norm.weight.copy_(self.target.final_norm)
        self.optimizer = torch.optim.AdamW(self.draft.parameters(), lr=options.peak_lr,
                                           betas=(0.9, 0.95), weight_decay=0.01)
        self.pool: list[TargetBatch] = []
        self.next_index = 0
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, dict[str, torch.Tensor], dict[str, Any]] | None = None

    def _load_draft(self, path: Path) -> None:
        written = json.loads((path / "config.json").read_text())
        if written != self.config_json:
            raise ValueError(f"{path} holds a draft of another config than this run's "
                             f"--size {self.options.size} for this target; pass a draft this "
                             "trainer wrote for the same target and size")
        tensors = load_file(path / SINGLE_FILE)
        self.draft.load_state_dict({k: v.float() for k, v in tensors.items()})
        logger.info("starting from the draft in %s", path)

    def _target_batch(self, split: str, count: int, start: int) -> TargetBatch:
        examples = draw_examples(self.rng, split, self.options.seed, count,
                                 self.options.family_weights, self.options.passkey_tokens,
                                 self.tokenizer, start)
        return run_target(self.target, examples, self.pad_id, self.config.target_layer_ids)

    def _eval_set(self) -> list[TargetBatch]:
        """One batch per family of `eval_families`: the first instances of the eval split."""
        batches = []
        for family in self.options.eval_families:
            weights = tuple(float(f == family) for f in FAMILIES)
            examples = draw_examples(random.Random(f"eval/{family}"), "eval", self.options.seed,
                                     self.options.eval_per_family, weights,
                                     self.options.passkey_tokens, self.tokenizer, 0)
            batches.append(run_target(self.target, examples, self.pad_id,
                                      self.config.target_layer_ids))
        return batches

    def _learning_rate(self, step: int) -> float:
        o = self.options
        if o.steps is not None:
            progress = step / max(1, o.steps)
        else:
            progress = (time.monotonic() - self.started) / max(1.0, self.deadline - self.started)
        warm = min(1.0, (step + 1) / max(1, o.warmup_steps))
        return o.peak_lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))

    def _step(self, step: int) -> float:
        o = self.options
        if step % o.steps_per_target_batch == 0 or not self.pool:
            self.pool.append(self._target_batch("train", o.sequences_per_batch, self.next_index))
            self.next_index += o.sequences_per_batch
            self.pool = self.pool[-o.pool_size:]
        batch = self.pool[self.rng.randrange(len(self.pool))]
        rows = self.rng.randint(*o.block_rows)
        blocks = cut_blocks(batch, anchors_of(batch, o.blocks_per_sequence, self.generator),
                            rows, self.config.mask_token_id)
        for group in self.optimizer.param_groups:
            group["lr"] = self._learning_rate(step)
        loss, _ = draft_loss(self.draft, batch, blocks, self.target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 1.0)
        self.optimizer.step()
        return loss.item()

    def _evaluate(self, eval_set: list[TargetBatch], step: int, loss: float) -> None:
        scores = {str(rows): acceptance_lengths(self.draft, eval_set, self.target, rows,
                                                self.options.seed)
                  for rows in EVAL_BLOCK_ROWS}
        mean5 = sum(scores["5"].values()) / len(scores["5"])
        entry = {"step": step, "minutes": round((time.monotonic() - self.started) / 60, 2),
                 "train_loss": round(loss, 4), "acceptance_length": scores,
                 "mean_acceptance_length_at_5": round(mean5, 4)}
        self.history.append(entry)
        logger.info("eval at step %d: %s", step, json.dumps(entry))
        if self.best is None or mean5 > self.best[0]:
            state = {k: v.detach().clone() for k, v in self.draft.state_dict().items()}
            self.best = (mean5, state, entry)

    def run(self) -> dict[str, Any]:
        o = self.options
        eval_set = self._eval_set()
        step, loss, last_eval, losses = 0, float("nan"), time.monotonic(), []
        reserve = 60.0 if o.steps is None else 0.0
        while (step < o.steps) if o.steps is not None else time.monotonic() < self.deadline - reserve:
            losses.append(self._step(step))
            step += 1
            if step % 20 == 0:
                loss = sum(losses) / len(losses)
                losses = []
                logger.info("step %d loss %.4f lr %.2e", step, loss, self._learning_rate(step))
            if time.monotonic() - last_eval > o.eval_every_s:
                self._evaluate(eval_set, step, loss)
                last_eval = time.monotonic()
        if losses:
            loss = sum(losses) / len(losses)
        self._evaluate(eval_set, step, loss)
        return self._write(step)

    def _write(self, steps: int) -> dict[str, Any]:
        _, state, best = self.best
        result = {
            "steps": steps, "best": best, "history": self.history,
            "options": {k: str(v) for k, v in vars(self.options).items()},
            "parameters": sum(p.numel() for p in self.draft.parameters()),
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "command": " ".join(sys.argv),
            "data": "teacher-forced task text (train split), labels = the target's greedy "
                    "next tokens; eval on the eval split",
        }
        out = Path(self.options.out)
        write_draft(self.config_json, state, out, metadata={"trainer": "atomk31.demo.train_draft"})
        (out / "train_result.json").write_text(json.dumps(result, indent=2) + "\n")
        logger.info("wrote the draft (best mean acceptance at 5: %.3f) to %s",
                    best["mean_acceptance_length_at_5"], out)
        return result
