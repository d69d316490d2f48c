"""The four task families of the built-in model, each an endless seeded generator of instances.

`generate(family, split, seed, index, num_tokens=...)` returns instance `index` of a stream; the
same arguments always give the same instance. `split` is "train" or "eval" (disjoint instance
keys, see common.py). `num_tokens` is the approximate prompt length of a passkey instance (the
other families ignore it).

* arithmetic (arithmetic.py): "What is 347 + 589?", working in the reasoning, the number as content;
* passkey (passkey.py): a five-digit key hidden in filler of 1K-8K tokens;
* tools (tool_calls.py): calls in the K3 format, answers from tool results, text when no tool fits;
* chat (chat.py): greetings and the capitals of a fixed table of countries.
"""

from __future__ import annotations

from atomk31.demo.tasks import arithmetic, chat, passkey, tool_calls
from atomk31.demo.tasks.common import SPLITS, Example, check_split

FAMILIES = ("arithmetic", "passkey", "tools", "chat")
DEFAULT_PASSKEY_TOKENS = 1024

__all__ = ["FAMILIES", "SPLITS", "Example", "check_families", "generate"]


def check_families(families: list[str]) -> list[str]:
    """`families` unchanged, or a ValueError naming the unknown ones and the known ones."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown task families {unknown or families}; choose from "
                         f"{', '.join(FAMILIES)}")
    return families


def generate(family: str, split: str, seed: int, index: int,
             num_tokens: int = DEFAULT_PASSKEY_TOKENS) -> Example:
    """Instance `index` of the (family, split, seed) stream."""
    check_families([family])
    check_split(split)
    if index < 0:
        raise ValueError(f"instance index must be >= 0, got {index}")
    if family == "passkey":
        return passkey.generate(split, seed, index, num_tokens)
    module = {"arithmetic": arithmetic, "tools": tool_calls, "chat": chat}[family]
    return module.generate(split, seed, index)
