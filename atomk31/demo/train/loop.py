"""The training run: model, data, optimiser, schedule, evaluations and the best checkpoint.

Robust to being cut off: every `eval_every_s` seconds the held-out exact match is measured, the
weights are written to `OUT/checkpoint` when they are the best so far, and `OUT/train_result.json`
is rewritten, so a run killed at any moment leaves the best weights and a record of it. The run
stops at the step count or `max_minutes` after start-up, whichever comes first, keeping
`final_reserve_s` for the last evaluation and export.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from atomk31.checkpoint import Tokenizer
from atomk31.config import ModelConfig
from atomk31.demo.model_config import demo_config
from atomk31.demo.tasks import FAMILIES
from atomk31.demo.tokenizer import write_demo_tokenizer
from atomk31.demo.train.data import IGNORE, Batch, StepBatches
from atomk31.demo.train.evaluation import build_eval_set, evaluate
from atomk31.demo.train.export import read_checkpoint, write_checkpoint
from atomk31.demo.train.kda_backend import choose_kda_backend
from atomk31.demo.train.model import DemoModel, ForwardOptions
from atomk31.demo.train.schedule import Schedule, fit_total_steps
from atomk31.demo.train.settings import PROFILES, TrainSettings

logger = logging.getLogger(__name__)

RESULT_FILE = "train_result.json"
CHECKPOINT_DIR = "checkpoint"
TOKENIZER_DIR = "tokenizer"
KL_WEIGHT = 1.0
CALIBRATION_MARGIN = 0.92


@dataclass
class RunOptions:
    seed: int
    out: Path
    profile: str = "gpu"
    device: str | None = None
    max_minutes: float = 7.0
    steps: int | None = None
    kda_backend: str = "torch"
    init_from: Path | None = None     # start from a checkpoint's weights instead of the init
    # the mixed batch's family weights (tasks.FAMILIES order) instead of the profile's
    family_weights: tuple[float, ...] | None = None
    peak_lr: float | None = None      # instead of the profile's (a continuation wants less)


@dataclass
class RunState:
    """What the result file reports, updated as the run goes."""

    options: dict[str, Any]
    started: float
    total_steps: int | None = None
    step: int = 0
    stopped_by: str | None = None
    best: dict[str, Any] | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _parameter_groups(model: DemoModel, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (not on norms, gates' vectors, embeddings' rows alike)."""
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


class FamilyLoss:
    """Running sums of per-family CE on the device (no host sync until read)."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(len(FAMILIES), device=device)
        self.counts = torch.zeros(len(FAMILIES), device=device)

    def add(self, token_losses: torch.Tensor, token_families: torch.Tensor) -> None:
        self.sums.index_add_(0, token_families, token_losses.detach().float())
        self.counts.index_add_(0, token_families, torch.ones_like(token_losses, dtype=torch.float))

    def read_and_reset(self) -> dict[str, float]:
        means = (self.sums / self.counts.clamp_min(1)).tolist()
        counts = self.counts.tolist()
        self.sums.zero_()
        self.counts.zero_()
        return {f: round(m, 4) for f, m, c in zip(FAMILIES, means, counts) if c}


def _batch_loss(model: DemoModel, batch: Batch, sparse: bool, autocast: bool,
                family_loss: FamilyLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE over the completion tokens + KL_WEIGHT * indexer KL, the CE alone) of one micro-batch,
    each scaled to its part of its set's mean."""
    options = ForwardOptions(sparse=sparse, kl_rows=batch.kl_rows, kl_valid=batch.kl_valid,
                             token_mask=batch.token_mask)
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden, kl_losses = model(batch.input_ids, options)
        supervised = batch.targets != IGNORE
        logits = model.logits(hidden[supervised])
    token_losses = F.cross_entropy(logits, batch.targets[supervised], reduction="none")
    family_loss.add(token_losses, batch.families[supervised.nonzero()[:, 0]])
    ce = token_losses.sum() / max(1, batch.ce_denominator)       # this group's part of the mean
    kl = torch.stack(kl_losses).mean() * batch.share if kl_losses else ce.new_zeros(())
    return ce + KL_WEIGHT * kl, ce


def _train_step(model: DemoModel, optimizer: torch.optim.Optimizer, batches: list[Batch],
                sparse: bool, lr: float, settings: TrainSettings, autocast: bool,
                family_loss: FamilyLoss, device: torch.device, max_positions: int
                ) -> torch.Tensor:
    """One optimiser step over every micro-batch of the step (each cut to `max_positions`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=device)
    for batch in (piece for b in batches for piece in b.split(max_positions)):
        loss, ce = _batch_loss(model, batch.to(device), sparse, autocast, family_loss)
        loss.backward()
        total = total + ce.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for moe in model.moe_layers():
        moe.update_bias()
    return total


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _write_result(state: RunState, out: Path) -> None:
    result = {**asdict(state), "elapsed_s": round(state.elapsed(), 1)}
    result.pop("started")
    text = json.dumps(result, indent=2) + "\n"
    (out / RESULT_FILE).write_text(text)
    if (out / CHECKPOINT_DIR).is_dir():
        (out / CHECKPOINT_DIR / RESULT_FILE).write_text(text)


class Trainer:
    """One run; `run()` trains until the step count or the deadline and returns the result."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.settings = PROFILES[options.profile]
        if options.family_weights is not None:
            self.settings = self.settings.replace(data=dataclasses.replace(
                self.settings.data, family_weights=tuple(options.family_weights)))
        if options.peak_lr is not None:
            self.settings = self.settings.replace(peak_lr=options.peak_lr)
        self.state = RunState(options={k: str(v) for k, v in asdict(options).items()},
                              started=time.monotonic())
        self.deadline = self.state.started + options.max_minutes * 60
        self.device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.autocast = self.device.type == "cuda"
        self.out = Path(options.out)
        self.out.mkdir(parents=True, exist_ok=True)
        random.seed(options.seed)
        torch.manual_seed(options.seed)
        self.config_json = demo_config(self.settings.size)
        self.config = ModelConfig.from_dict(self.config_json)
        self.tokenizer_dir = self.out / TOKENIZER_DIR
        self.tokenizer_dir.mkdir(exist_ok=True)
        write_demo_tokenizer(self.tokenizer_dir, self.config.vocab_size)
        self.tokenizer = Tokenizer.from_pretrained(self.tokenizer_dir)
        self.pad_id = self.tokenizer.token_id("[PAD]")
        self.model = DemoModel(self.config)
        if options.init_from is not None:
            read_checkpoint(self.model, Path(options.init_from))
            logger.info("starting from the weights of %s", options.init_from)
        self.model.to(self.device)
        self.state.info.update(self._describe())
        self.state.info["kda_backend"] = choose_kda_backend(self.model, options.kda_backend,
                                                            self.device)
        self.optimizer = torch.optim.AdamW(
            _parameter_groups(self.model, self.settings.weight_decay), lr=self.settings.peak_lr,
            betas=(0.9, 0.95), fused=self.device.type == "cuda")
        self.schedule = Schedule(self.settings.peak_lr, self.settings.warmup_steps, options.steps)
        self.state.total_steps = options.steps
        self.eval_set = build_eval_set(self.tokenizer, self.settings.eval_per_family,
                                       self.settings.eval_passkey_lengths,
                                       self.settings.eval_per_length)
        self.family_loss = FamilyLoss(self.device)
        self.max_positions = 1 << 30      # micro-batch cap, lowered after running out of memory

    def _describe(self) -> dict[str, Any]:
        return {"device": str(self.device), "torch": torch.__version__,
                "python": platform.python_version(), "command": " ".join(sys.argv),
                "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "size": self.settings.size}

    def _loader(self):
        settings = self.settings
        dataset = StepBatches(settings.data, self.options.seed, str(self.tokenizer_dir), self.pad_id)
        workers = settings.num_workers if self.device.type == "cuda" else 0
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=workers, pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None, persistent_workers=bool(workers))
        return iter(loader)

    def _evaluate_and_keep_best(self) -> float:
        started = time.monotonic()
        accuracy = evaluate(self.model, self.eval_set, self.pad_id, self.device,
                            self.settings.eval_batch_tokens, self.autocast)
        record = {"step": self.state.step, "elapsed_s": round(self.state.elapsed(), 1),
                  "accuracy": {k: round(v, 4) for k, v in accuracy.items()}}
        self.state.evals.append(record)
        logger.info("eval at step %d: %s", self.state.step,
                    "  ".join(f"{k} {v:.3f}" for k, v in accuracy.items()))
        if self.state.best is None or accuracy["score"] >= self.state.best["accuracy"]["score"]:
            self.state.best = record
            write_checkpoint(self.model, self.config_json, self.tokenizer_dir,
                             self.out / CHECKPOINT_DIR, metadata={"step": str(self.state.step)})
            logger.info("wrote the best weights so far (step %d) to %s", self.state.step,
                        self.out / CHECKPOINT_DIR)
        _write_result(self.state, self.out)
        return time.monotonic() - started

    def _fit_schedule(self, step_times: dict[str, list[float]], eval_seconds: float) -> None:
        """Fix the step count from the measured step and evaluation times (no --steps)."""
        dense = sum(step_times["dense"]) / max(1, len(step_times["dense"]))
        sparse = sum(step_times["sparse"]) / max(1, len(step_times["sparse"]))
        available = self.deadline - time.monotonic() - self.settings.final_reserve_s
        num_evals = available / (self.settings.eval_every_s + eval_seconds)
        train_seconds = max(0.0, (available - num_evals * eval_seconds) * CALIBRATION_MARGIN)
        total = fit_total_steps(self.state.step, train_seconds, dense, sparse)
        self.schedule.total_steps = self.state.total_steps = total
        self.state.info["step_seconds"] = {"dense": round(dense, 4), "sparse": round(sparse, 4),
                                           "eval": round(eval_seconds, 2)}
        logger.info("step times: dense %.3f s, sparse %.3f s, eval %.1f s -> %d steps in all",
                    dense, sparse, eval_seconds, total)

    def _guarded_step(self, batches: list[Batch], sparse: bool) -> torch.Tensor | None:
        """A training step; on running out of GPU memory the step is dropped and later steps
        cut their micro-batches in halves (None is returned)."""
        try:
            return _train_step(self.model, self.optimizer, batches, sparse,
                               self.schedule.lr(self.state.step), self.settings, self.autocast,
                               self.family_loss, self.device, self.max_positions)
        except torch.cuda.OutOfMemoryError:
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            longest = max(b.input_ids.numel() for b in batches)
            self.max_positions = max(1, min(self.max_positions, longest) // 2)
            self.state.info["out_of_memory_steps"] = self.state.info.get("out_of_memory_steps", 0) + 1
            logger.warning("out of GPU memory at step %d: micro-batches now hold at most %d "
                           "positions", self.state.step, self.max_positions)
            return None

    def _phase(self, step: int) -> bool:
        """Set quantization-aware training for `step`; return whether MLA runs sparse."""
        calibrating = self.schedule.total_steps is None
        first, middle, _ = self.settings.calibrate_steps
        self.model.set_quantized(self.schedule.quantizes(step))
        return step >= middle if calibrating and step >= first else self.schedule.is_sparse(step)

    def run(self) -> dict[str, Any]:
        settings, state = self.settings, self.state
        loader = self._loader()
        first, middle, last = settings.calibrate_steps
        step_times: dict[str, list[float]] = {"dense": [], "sparse": []}
        last_eval, last_log, tokens = time.monotonic(), time.monotonic(), 0
        logger.info("training the %s model (%d parameters) on %s", settings.size,
                    state.info["parameters"], self.device)
        while not self.schedule.is_done(state.step):
            if time.monotonic() > self.deadline - settings.final_reserve_s:
                state.stopped_by = "time"
                break
            sparse = self._phase(state.step)
            batches = next(loader)
            tokens += sum(b.num_tokens for b in batches)
            timing = self.schedule.total_steps is None and first <= state.step < last
            if timing:
                _synchronize(self.device)
                started = time.monotonic()
            loss = self._guarded_step(batches, sparse)
            if loss is None:
                continue
            if timing:
                _synchronize(self.device)
                step_times["sparse" if sparse else "dense"].append(time.monotonic() - started)
            state.step += 1
            if self.schedule.total_steps is None and state.step == last:
                self._fit_schedule(step_times, self._evaluate_and_keep_best())
                last_eval = time.monotonic()
            if state.step % settings.log_every == 0:
                now = time.monotonic()
                entry = {"step": state.step, "elapsed_s": round(state.elapsed(), 1),
                         "loss": round(float(loss), 4), "lr": self.schedule.lr(state.step),
                         "sparse": sparse, "tokens_per_s": round(tokens / (now - last_log)),
                         "family_loss": self.family_loss.read_and_reset()}
                state.log.append(entry)
                logger.info("step %d/%s  loss %.4f  %s  %d tok/s", state.step,
                            self.schedule.total_steps or "?", entry["loss"],
                            entry["family_loss"], entry["tokens_per_s"])
                last_log, tokens = now, 0
            if time.monotonic() - last_eval >= settings.eval_every_s:
                self._evaluate_and_keep_best()
                last_eval = time.monotonic()
        state.stopped_by = state.stopped_by or "steps"
        self._evaluate_and_keep_best()
        logger.info("done: %d steps in %.0f s, best score %.3f at step %d", state.step,
                    state.elapsed(), state.best["accuracy"]["score"], state.best["step"])
        _write_result(state, self.out)
        shutil.copy(self.out / RESULT_FILE, self.out / CHECKPOINT_DIR / RESULT_FILE)
        return json.loads((self.out / RESULT_FILE).read_text())
