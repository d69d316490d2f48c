"""Render OpenAI chat requests into K3 prompt segments (CHAT_FORMAT.md §1-§2, "XTML").

K3 ships no Jinja template; this follows the release's `encoding_k3.py` (via vLLM's copy,
CHAT_FORMAT key VLLM-ENC), rewritten here. `render_chat` returns `(text, allow_special)`
segments; the caller tokenizes them with `Tokenizer.encode_segments`, so user text never becomes
special tokens.

Order (§2): tool declaration, thinking-effort note, the messages (tool results re-ordered, §2.2),
tool-choice note, response-format note, generation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from server.system_notes import effort_note, resolve_tool_choice, response_format_note, \
    system_note, thinking_effort, tool_declaration, validate_tools
from server.xtml import ChatTemplateError, Segment, close_tag, end_of_message, open_tag, \
    text_segments

__all__ = ["ChatTemplateError", "prompt_starts_in_reasoning", "render_chat"]

ROLES = ("system", "developer", "user", "assistant", "tool")
IMAGE_PART_TYPES = ("image", "image_url", "input_image")

THINK_PROMPT = open_tag("think")


def render_chat(messages: list[dict], *, tools: list[dict] | None = None,
                tool_choice: str | dict | None = None, reasoning_effort: str | None = None,
                response_format: dict | None = None,
                add_generation_prompt: bool = True) -> list[Segment]:
    """OpenAI chat messages -> K3 prompt segments `(text, allow_special)`.

    messages: plain dicts as clients send them (role, content: str | list of text parts | None,
        name, tool_calls, tool_call_id, reasoning_content); `developer` is treated as `system`.
    tools / tool_choice / response_format: the request's fields; they add the §2.3 notes.
    reasoning_effort: `low` | `high` | `max`; OpenAI's `minimal` | `medium` | `xhigh` (mapped,
        §2.5); `none` for K3's non-thinking mode; None for the default `max` (§2.3).
    Raises ChatTemplateError (a ValueError) for input it cannot render.
    """
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError(f"messages must be a non-empty list of message objects, got "
                                f"{messages!r:.80}")
    effort = thinking_effort(reasoning_effort)
    is_thinking = effort is not None
    if tools is not None:
        validate_tools(tools, "tools")
    declared_tools, choice_note = resolve_tool_choice(tool_choice, tools)
    format_note = response_format_note(response_format)
    checked = [_checked_message(message, i) for i, message in enumerate(messages)]

    segments: list[Segment] = []
    if declared_tools:
        segments += tool_declaration(declared_tools)
    if is_thinking:
        segments += effort_note(effort)
    segments += _render_messages(sort_tool_results(checked), is_thinking)
    if choice_note is not None:
        segments += system_note("tool-choice", choice_note)
    if format_note is not None:
        segments += system_note("response-format", format_note)
    if add_generation_prompt:
        # §2.4: the thinking prompt leaves the model inside the think channel.
        segments += open_tag("message", [("role", "assistant")])
        segments += THINK_PROMPT if is_thinking else open_tag("response")
    return segments


def prompt_starts_in_reasoning(segments: Sequence[Segment]) -> bool:
    """Whether the prompt ends with the thinking generation prompt's `<|open|>think<|sep|>`, so
    the first generated tokens are reasoning (§2.4; ATOM-RS seeds its filter the same way)."""
    return list(segments[-len(THINK_PROMPT):]) == THINK_PROMPT


# ---- input checks --------------------------------------------------------------------------------
def _checked_message(message: Any, i: int) -> dict:
    """A shallow copy of message `i` with its shape checked and `developer` renamed `system`."""
    place = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ChatTemplateError(f"{place} must be an object with a 'role', got "
                                f"{type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ChatTemplateError(f"{place}.role must be one of {list(ROLES)}, got {role!r}")
    checked = dict(message, role="system" if role == "developer" else role)
    _check_content(checked.get("content"), f"{place}.content")
    for key in ("name", "reasoning_content", "reasoning", "tool"):
        if checked.get(key) is not None and not isinstance(checked[key], str):
            raise ChatTemplateError(f"{place}.{key} must be a string, got "
                                    f"{type(checked[key]).__name__}")
    if role == "assistant" and checked.get("tool_calls") is not None:
        _check_tool_calls(checked["tool_calls"], f"{place}.tool_calls")
    if role == "tool" and not isinstance(checked.get("tool_call_id"), str):
        raise ChatTemplateError(f"{place} (role 'tool') needs a 'tool_call_id' string naming the "
                                f"assistant tool call it answers, got "
                                f"{checked.get('tool_call_id')!r}")
    if checked["role"] == "system" and checked.get("tools") is not None:
        validate_tools(checked["tools"], f"{place}.tools")
    return checked


def _check_content(content: Any, place: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ChatTemplateError(f"{place} must be a string, a list of text parts or null, got "
                                f"{type(content).__name__}")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in IMAGE_PART_TYPES:
            raise ChatTemplateError(f"{place}[{j}] is an image part; this engine serves K3.1 as "
                                    f"a text model (MODEL_SPEC: vision_config is ignored); send "
                                    f"text parts only")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ChatTemplateError(f'{place}[{j}] must be {{"type": "text", "text": "..."}}, got '
                                    f"{part!r:.80}")


def _check_tool_calls(tool_calls: Any, place: str) -> None:
    if not isinstance(tool_calls, list):
        raise ChatTemplateError(f"{place} must be a list, got {type(tool_calls).__name__}")
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise ChatTemplateError(f'{place}[{j}] must be {{"id": ..., "type": "function", '
                                    f'"function": {{"name": "...", "arguments": "{{...}}"}}}}, '
                                    f"got {call!r:.80}")
        _call_arguments(function.get("arguments"), f"{place}[{j}].function.arguments")


def _call_arguments(arguments: Any, place: str) -> dict | str:
    """§2.2: a JSON object string (or an already decoded object) -> dict; empty/absent -> {};
    text that is not JSON -> the raw string (rendered as a `json` child); JSON that is not an
    object -> error."""
    if arguments is None or isinstance(arguments, dict):
        return arguments or {}
    if not isinstance(arguments, str):
        raise ChatTemplateError(f"{place} must be a JSON object string, got "
                                f"{type(arguments).__name__}")
    if not arguments.strip():
        return {}
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if not isinstance(decoded, dict):
        raise ChatTemplateError(f"{place} must encode a JSON object (K3 renders one element per "
                                f"key), got {type(decoded).__name__} {arguments!r:.60}")
    return decoded


# ---- tool results (§2.2) -------------------------------------------------------------------------
def sort_tool_results(messages: list[dict]) -> list[dict]:
    """Sort each run of consecutive tool messages into the call order of the preceding
    assistant's `tool_calls`, when every `tool_call_id` of the run matches one of its call ids;
    the matched call's function name becomes the message's `tool`. Runs with an unmatched id stay
    as sent. Input messages are not mutated."""
    output: list[dict] = []
    call_positions: dict[str, tuple[int, str]] = {}
    i = 0
    while i < len(messages):
        message = messages[i]
        if message["role"] != "tool":
            if message["role"] == "assistant":
                call_positions = _call_positions(message.get("tool_calls") or [])
            output.append(message)
            i += 1
            continue
        end = i
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        run = messages[i:end]
        matches = [call_positions.get(m["tool_call_id"]) for m in run]
        if all(match is not None for match in matches):
            order = sorted(range(len(run)), key=lambda k: (matches[k][0], k))
            run = [dict(run[k], tool=matches[k][1]) for k in order]
        output += run
        i = end
    return output


def _call_positions(tool_calls: list[dict]) -> dict[str, tuple[int, str]]:
    """Call id -> (1-based position, function name); a repeated id keeps its first call."""
    positions: dict[str, tuple[int, str]] = {}
    for position, call in enumerate(tool_calls, start=1):
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id not in positions:
            positions[call_id] = (position, call["function"]["name"])
    return positions


# ---- messages ------------------------------------------------------------------------------------
def _render_messages(messages: list[dict], is_thinking: bool) -> list[Segment]:
    segments: list[Segment] = []
    previous_calls: list[dict] = []  # tool_calls of the last assistant message
    tool_index = 0  # §2.2: tool messages since the last assistant message, from 1
    for message in messages:
        role = message["role"]
        if role == "system" and message.get("tools"):
            # §2.1: a system message carrying tools is only a mid-conversation declaration.
            segments += tool_declaration(message["tools"], is_added=True)
            continue
        if role == "assistant":
            previous_calls, tool_index = message.get("tool_calls") or [], 0
        if role == "tool":
            tool_index += 1
            attributes: list[tuple[str, str | int]] = [
                ("role", "tool"), ("tool", _tool_name(message, tool_index, previous_calls)),
                ("index", tool_index)]
        else:
            attributes = [("role", role)]
            if message.get("name"):
                attributes.append(("name", message["name"]))
        body = (_assistant_body(message, is_thinking) if role == "assistant"
                else content_segments(message.get("content")))
        segments += open_tag("message", attributes) + body + close_tag("message")
        segments += end_of_message()
    return segments


def _tool_name(message: dict, tool_index: int, previous_calls: list[dict]) -> str:
    """§2.2: the message's `tool`, else `name`, else the name of the preceding assistant's
    `tool_index`-th call."""
    name = message.get("tool") or message.get("name")
    if name:
        return name
    if tool_index <= len(previous_calls):
        return previous_calls[tool_index - 1]["function"]["name"]
    raise ChatTemplateError(f"the tool message with tool_call_id {message['tool_call_id']!r} "
                            f"names no tool: it matches no call of the preceding assistant "
                            f"message and has no 'name'; send the assistant message with its "
                            f"tool_calls (and their ids) before the tool results")


def content_segments(content: str | list[dict] | None) -> list[Segment]:
    """§1, §2.1: a string is one text segment; a list of text parts is one text segment per
    part, in order, with no separator (as the K3 renderer does); empty ones are left out."""
    if content is None:
        return []
    if isinstance(content, str):
        return text_segments(content)
    return [segment for part in content for segment in text_segments(part["text"])]


def _assistant_body(message: dict, is_thinking: bool) -> list[Segment]:
    """§2.2: think channel (thinking mode only), response channel, tools channel if calls."""
    segments: list[Segment] = []
    if is_thinking:
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        # The pair is always written; blank reasoning leaves its body out.
        segments += open_tag("think") + text_segments(reasoning if reasoning.strip() else "")
        segments += close_tag("think")
    segments += open_tag("response") + content_segments(message.get("content"))
    segments += close_tag("response")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        segments += open_tag("tools")
        for index, call in enumerate(tool_calls, start=1):
            segments += _render_call(call["function"], index)
        segments += close_tag("tools")
    return segments


def _render_call(function: dict, index: int) -> list[Segment]:
    segments = open_tag("call", [("tool", function["name"]), ("index", index)])
    arguments = _call_arguments(function.get("arguments"), "function.arguments")
    if isinstance(arguments, str):
        # §2.2: arguments that are not JSON travel raw inside a `json` child.
        segments += open_tag("json", [("type", "object")]) + text_segments(arguments)
        segments += close_tag("json")
    else:
        for key, value in arguments.items():
            segments += open_tag("argument", [("key", key), ("type", _xtml_type(value))])
            segments += text_segments(value if isinstance(value, str)
                                      else json.dumps(value, ensure_ascii=False))
            segments += close_tag("argument")
    return segments + close_tag("call")


def _xtml_type(value: Any) -> str:
    """§2.2: string | number | boolean | null | object | array (ints and floats are `number`)."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array"
