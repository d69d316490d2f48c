"""The training schedule: learning rate, the indexer's dense warm-up then sparse training, and
quantization-aware training (MXFP4 experts, FP8 latents), all as fractions of one step count.

The step count is either given (`--steps`, an exact rerun) or fitted to the time budget once,
from step times measured early in the run (`fit_total_steps`), and then fixed: the schedule is a
function of the step alone, and the result file records the count so `--steps N` reproduces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPARSE_FROM = 0.4     # DSA: dense warm-up of the indexer, then top-k attention
QUANTIZE_FROM = 0.55  # quantization-aware training: MXFP4 experts, FP8 MLA latents
FINAL_LR_FRACTION = 0.1


@dataclass
class Schedule:
    peak_lr: float
    warmup_steps: int
    total_steps: int | None = None      # None until fitted

    def _progress(self, step: int) -> float:
        return 0.0 if self.total_steps is None else min(1.0, step / self.total_steps)

    def lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return self.peak_lr
        span = max(1, self.total_steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / span)))
        return self.peak_lr * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * cosine)

    def is_sparse(self, step: int) -> bool:
        return self.total_steps is not None and self._progress(step) >= SPARSE_FROM

    def quantizes(self, step: int) -> bool:
        return self.total_steps is not None and self._progress(step) >= QUANTIZE_FROM

    def is_done(self, step: int) -> bool:
        return self.total_steps is not None and step >= self.total_steps


def fit_total_steps(step: int, seconds_left: float, dense_step_s: float, sparse_step_s: float
                    ) -> int:
    """The total step count that spends `seconds_left` from `step` on: dense steps until
    SPARSE_FROM of the total, sparse ones after (each at its measured time)."""
    # seconds_left = (SPARSE_FROM * N - step) * dense + (1 - SPARSE_FROM) * N * sparse
    per_step = SPARSE_FROM * dense_step_s + (1 - SPARSE_FROM) * sparse_step_s
    total = (seconds_left + step * dense_step_s) / per_step
    return max(step + 1, int(total))
