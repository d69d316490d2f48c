"""The trainer's settings: one dataclass, with the profiles the command line picks from.

`gpu`: the real run on one large GPU (an H200: about 8 minutes in all), long passkey sequences
up to 8K tokens. `cpu`: the same model and tasks at CPU pace (short passkeys, small batches).
`cpu-toy`: the toy-size model on the same tasks, to watch them being learned on a shared CPU.
`toy`: the toy model for a few steps, what the test runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from atomk31.demo.train.data import DataPlan

# arithmetic, passkey, tools, chat (the order of tasks.FAMILIES): tool calls, the slowest
# family to learn (arguments copied from the request or recalled from a table), get the most
FAMILY_WEIGHTS = (0.3, 0.1, 0.45, 0.15)


@dataclass(frozen=True)
class TrainSettings:
    size: str                         # model_config.SIZES: demo | toy
    data: DataPlan
    peak_lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_steps: int = 100
    grad_clip: float = 1.0
    eval_every_s: float = 60.0
    eval_per_family: int = 64
    eval_passkey_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    eval_per_length: int = 16
    eval_batch_tokens: int = 65536
    log_every: int = 25
    calibrate_steps: tuple[int, int, int] = (10, 25, 40)  # dense from a to b, sparse from b to c
    final_reserve_s: float = 40.0     # kept for the last eval, export and result file
    num_workers: int = 6

    def replace(self, **changes) -> "TrainSettings":
        return dataclasses.replace(self, **changes)


_CPU = TrainSettings(
    size="demo",
    data=DataPlan(short_batch=8, family_weights=FAMILY_WEIGHTS, short_passkey_tokens=(200, 700),
                  long_tokens=0, long_passkey_tokens=(700, 1024)),
    warmup_steps=30, eval_every_s=600.0, eval_per_family=24, eval_passkey_lengths=(512, 1024),
    eval_per_length=8, eval_batch_tokens=8192, log_every=10, calibrate_steps=(3, 8, 12),
    final_reserve_s=120.0, num_workers=0)

PROFILES: dict[str, TrainSettings] = {
    "gpu": TrainSettings(
        size="demo",
        data=DataPlan(short_batch=128, family_weights=FAMILY_WEIGHTS,
                      short_passkey_tokens=(200, 800), long_tokens=32768,
                      long_passkey_tokens=(1024, 8400))),
    "cpu": _CPU,
    "cpu-toy": _CPU.replace(
        size="toy", data=dataclasses.replace(_CPU.data, short_passkey_tokens=(150, 400)),
        peak_lr=3e-3, eval_every_s=900.0, eval_per_family=32, eval_passkey_lengths=(256, 400),
        eval_per_length=16, log_every=20),
    "toy": _CPU.replace(
        size="toy",
        data=DataPlan(short_batch=4, family_weights=FAMILY_WEIGHTS,
                      short_passkey_tokens=(100, 200), long_tokens=400,
                      long_passkey_tokens=(150, 200)),
        peak_lr=3e-3, warmup_steps=2, eval_every_s=1e9, eval_per_family=2,
        eval_passkey_lengths=(120,), eval_per_length=2, eval_batch_tokens=4096, log_every=1,
        calibrate_steps=(1, 2, 3), final_reserve_s=0.0),
}
