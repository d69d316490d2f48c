"""What every task family shares: the instance type, seeded random streams, the train/eval split.

An `Example` is one conversation the model must continue: the request (`messages`, `tools`) as an
OpenAI client sends it, the assistant turn a perfect model writes (`target`: `reasoning_content`,
`content`, `tool_calls`), and what the evaluator checks (`expected`). Generators are endless and
seeded: instance `i` of (family, split, seed) is always the same, and different seeds, splits and
indices give independent instances.

Train and eval never share an instance key: each family names a key per instance (the operands of
a sum, a pass key, ...) and `is_held_out(key)` sends a fixed tenth of all keys to eval only, so a
score on eval instances measures generalisation, not memory. Families whose answers come from a
fixed table (capitals) share the table, not the phrasing draw.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "eval")
HELD_OUT_MODULUS = 10       # one key in ten is eval-only


@dataclass(frozen=True)
class Example:
    """One instance: the request, the reference assistant turn, and what the scorer needs.

    messages: OpenAI chat messages (dicts) up to the turn to generate.
    tools: the request's `tools` (OpenAI function objects) or None.
    target: the assistant message a perfect model writes: `reasoning_content`, `content`, and
        `tool_calls` (OpenAI shape, `arguments` a JSON string) when it calls a tool.
    expected: family-specific facts for scoring (see scoring.py), e.g. {"answer": 936}.
    kind: the instance kind within its family (e.g. "add", "call", "capital"), for per-kind
        reports.
    """

    family: str
    kind: str
    messages: list[dict[str, Any]]
    target: dict[str, Any]
    expected: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def instance_rng(family: str, split: str, seed: int, index: int) -> random.Random:
    """The random stream of one instance (Python's string seeding is stable across runs)."""
    return random.Random(f"atomk31-demo/{family}/{split}/{seed}/{index}")


def is_held_out(key: str) -> bool:
    """Whether an instance key belongs to eval only (a fixed tenth of all keys)."""
    return zlib.crc32(key.encode("utf-8")) % HELD_OUT_MODULUS == 0


def in_split(key: str, split: str) -> bool:
    return is_held_out(key) == (split == "eval")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(reasoning: str, content: str, tool_calls: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "reasoning_content": reasoning,
                               "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
