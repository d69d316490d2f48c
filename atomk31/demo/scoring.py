"""Scoring one server reply against its task instance.

`score_reply(example, message)` takes the instance and the reply's `choices[0].message` as the
OpenAI API returns it (`content`, `reasoning_content`, `tool_calls`) and says whether it is
right, with the family's sub-checks:
* arithmetic: the last integer in `content` equals the answer (commas and spaces inside a
  number are allowed: "1,998");
* passkey: the first five-digit number in `content` is the key;
* tools, `call`: `schema_valid` (at least one call; every call names an offered tool and its
  arguments are a JSON object that satisfies the tool's JSON schema) and `right_call` (exactly
  one call, the expected tool, the expected arguments: numbers equal, strings equal ignoring case
  and surrounding spaces); right = right_call. `result`: `uses_result` (no call, every fact of
  the tool result in `content`). `no_tool`: `text_answer` (no call, non-empty content);
* chat: a capital reply names the capital; a greeting reply greets or offers help; no calls.
Malformed replies (missing fields, arguments that are not JSON) score as wrong, never raise.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from atomk31.demo.json_schema import schema_problems
from atomk31.demo.tasks import Example

_INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+")
_FIVE_DIGITS = re.compile(r"(?<!\d)\d{5}(?!\d)")
_GREETING = re.compile(r"\b(hello|hi|hey|greetings|good (morning|afternoon|evening)|help)\b",
                       re.IGNORECASE)


@dataclass
class Score:
    correct: bool
    checks: dict[str, bool] = field(default_factory=dict)
    note: str = ""


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def last_integer(text: str) -> int | None:
    found = _INTEGER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def _score_arithmetic(example: Example, message: dict[str, Any]) -> Score:
    value = last_integer(_content(message))
    return Score(value == example.expected["answer"], note=f"got {value}")


def _score_passkey(example: Example, message: dict[str, Any]) -> Score:
    found = _FIVE_DIGITS.search(_content(message))
    value = found.group(0) if found else None
    return Score(value == example.expected["passkey"], note=f"got {value}")


def _arguments(call: dict[str, Any]) -> tuple[str | None, Any]:
    """(name, decoded arguments or None when they are not a JSON object)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return None, None
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        return function.get("name"), None
    return function.get("name"), arguments if isinstance(arguments, dict) else None


def _same_value(got: Any, expected: Any) -> bool:
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return isinstance(got, (int, float)) and not isinstance(got, bool) \
            and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, str):
        return isinstance(got, str) and got.strip().lower() == expected.strip().lower()
    return got == expected


def _score_call(example: Example, message: dict[str, Any]) -> Score:
    calls = _calls(message)
    schemas = {t["function"]["name"]: t["function"].get("parameters", {})
               for t in example.tools or []}
    decoded = [_arguments(call) for call in calls]
    valid = bool(calls) and all(
        name in schemas and arguments is not None and not schema_problems(arguments, schemas[name])
        for name, arguments in decoded)
    expected_args = example.expected["arguments"]
    right = len(decoded) == 1 and decoded[0][0] == example.expected["tool"] \
        and decoded[0][1] is not None and set(decoded[0][1]) == set(expected_args) \
        and all(_same_value(decoded[0][1][k], v) for k, v in expected_args.items())
    return Score(right, {"schema_valid": valid, "right_call": right},
                 note=f"calls {[(n, a) for n, a in decoded]}")


def _score_tools(example: Example, message: dict[str, Any]) -> Score:
    if example.kind == "call":
        return _score_call(example, message)
    content, calls = _content(message), _calls(message)
    if example.kind == "result":
        uses = not calls and all(fact in content for fact in example.expected["evidence"])
        return Score(uses, {"uses_result": uses}, note=content[:80])
    text = not calls and bool(content.strip())
    return Score(text, {"text_answer": text}, note=content[:80])


def _score_chat(example: Example, message: dict[str, Any]) -> Score:
    content, calls = _content(message), _calls(message)
    if example.kind == "capital":
        right = not calls and example.expected["capital"].lower() in content.lower()
    else:
        right = not calls and bool(_GREETING.search(content))
    return Score(right, note=content[:80])


def score_reply(example: Example, message: dict[str, Any]) -> Score:
    """Whether `message` (an OpenAI chat `message` object) answers `example` correctly."""
    if not isinstance(message, dict):
        return Score(False, note=f"no message object: {message!r:.60}")
    scorer = {"arithmetic": _score_arithmetic, "passkey": _score_passkey, "tools": _score_tools,
              "chat": _score_chat}[example.family]
    return scorer(example, message)
