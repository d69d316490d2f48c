"""Anthropic Messages requests as the chat renderer's (OpenAI-shaped) messages and options.

The same conversation must give the same prompt tokens on /v1/messages as on
/v1/chat/completions (CHAT_FORMAT.md; the prefix cache keys on prompt tokens), so each
Anthropic construct maps onto the OpenAI construct the renderer already handles:

- `system` (a string or text blocks) -> a first system message; text blocks stay one part
  each (§2.1: one segment per part), like an OpenAI content list.
- user `text` blocks -> a user message's text parts; each `tool_result` block -> a tool message
  (`tool_call_id` = its `tool_use_id`, content = its text), in block order.
- assistant `thinking` blocks -> `reasoning_content` (joined; `redacted_thinking` is
  dropped: there is no text to render), `text` blocks -> content parts, `tool_use` blocks ->
  `tool_calls` (`arguments` = the `input` object, keys in the client's order, §2.2).
- `tools` -> OpenAI function tools (`input_schema` is `parameters`); `tool_choice` auto | any |
  tool | none -> auto | required | the named function | none; `thinking.type: disabled` ->
  K3's non-thinking prompt (reasoning_effort "none").
Images and documents are refused: this engine serves K3.1 as a text model.
Every error names the path at fault and is a ChatTemplateError (answered 400).
"""

from __future__ import annotations

from typing import Any

from server.anthropic_protocol import CountTokensRequest
from server.system_notes import short_repr
from server.xtml import ChatTemplateError

NOT_TEXT_BLOCKS = ("image", "document", "search_result", "container_upload")
SERVER_TOOL_HINT = ("server tools (web search, code execution, ...) run on Anthropic's "
                    "platform; declare client tools with name, description and input_schema")


def to_chat_options(body: CountTokensRequest) -> dict[str, Any]:
    """`messages`, `tools`, `tool_choice`, `reasoning_effort` for `render_chat`."""
    messages: list[dict] = []
    if body.system:
        messages.append({"role": "system", "content": _text_parts(body.system, "system")})
    for i, message in enumerate(body.messages):
        messages += _convert_message(message, f"messages[{i}]")
    return {"messages": messages, "tools": _tools(body.tools),
            "tool_choice": _tool_choice(body.tool_choice),
            "reasoning_effort": "none" if body.thinking and body.thinking.type == "disabled"
            else None}


def _convert_message(message: Any, place: str) -> list[dict]:
    role = message.get("role") if isinstance(message, dict) else None
    if role not in ("user", "assistant"):
        raise ChatTemplateError(f"{place}.role must be 'user' or 'assistant', got "
                                f"{short_repr(role if isinstance(message, dict) else message)}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    if not isinstance(content, list):
        raise ChatTemplateError(f"{place}.content must be a string or a list of content "
                                f"blocks, got {type(content).__name__}")
    if message["role"] == "assistant":
        return [_assistant_message(content, f"{place}.content")]
    return _user_messages(content, f"{place}.content")


def _user_messages(blocks: list, place: str) -> list[dict]:
    """User blocks in order: runs of text blocks become user messages, tool results become
    tool messages."""
    messages: list[dict] = []
    parts: list[dict] = []
    for j, block in enumerate(blocks):
        kind = _block_type(block, f"{place}[{j}]")
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, f"{place}[{j}]")})
        elif kind == "tool_result":
            if parts:
                messages.append({"role": "user", "content": parts})
                parts = []
            messages.append(_tool_message(block, f"{place}[{j}]"))
        else:
            raise _unsupported_block(kind, f"{place}[{j}]", "user")
    if parts or not messages:
        messages.append({"role": "user", "content": parts})
    return messages


def _tool_message(block: dict, place: str) -> dict:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise ChatTemplateError(f"{place}.tool_use_id must name the tool_use block this "
                                f"result answers, got {short_repr(tool_use_id)}")
    content = block.get("content")
    parts = "" if content is None else _text_parts(content, f"{place}.content")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": parts}


def _assistant_message(blocks: list, place: str) -> dict:
    reasoning: list[str] = []
    parts: list[dict] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        where = f"{place}[{j}]"
        kind = _block_type(block, where)
        if kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ChatTemplateError(f"{where}.thinking must be a string, got "
                                        f"{short_repr(block.get('thinking'))}")
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "text":
            parts.append({"type": "text", "text": _text_of(block, where)})
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        else:
            raise _unsupported_block(kind, where, "assistant")
    message: dict = {"role": "assistant", "content": parts}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: dict, place: str) -> dict:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not name or not isinstance(call_id, str):
        raise ChatTemplateError(f'{place} must be {{"type": "tool_use", "id": "...", "name": '
                                f'"...", "input": {{...}}}}, got {short_repr(block)}')
    if not isinstance(arguments, dict):
        raise ChatTemplateError(f"{place}.input must be an object, got "
                                f"{type(arguments).__name__}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _text_parts(content: Any, place: str) -> str | list[dict]:
    """A string, or text blocks as OpenAI text parts (one segment each)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"{place} must be a string or a list of text blocks, got "
                                f"{type(content).__name__}")
    parts = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{place}[{j}]")
        if kind != "text":
            raise _unsupported_block(kind, f"{place}[{j}]", "text-only")
        parts.append({"type": "text", "text": _text_of(block, f"{place}[{j}]")})
    return parts


def _tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type", "custom") if isinstance(tool, dict) else tool
        if kind != "custom":
            raise ChatTemplateError(f"tools[{i}] has type {short_repr(kind)}: {SERVER_TOOL_HINT}")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise ChatTemplateError(f'tools[{i}] must be {{"name": "...", "input_schema": '
                                    f"{{...}}}}, got {short_repr(tool)}")
        function = {"name": name, "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: dict | None) -> str | dict | None:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ChatTemplateError(f"tool_choice must be {{\"type\": \"auto\" | \"any\" | \"none\"}} or "
                            f"{{\"type\": \"tool\", \"name\": \"...\"}}, got {short_repr(choice)}")


def _block_type(block: Any, place: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise ChatTemplateError(f'{place} must be a content block {{"type": ..., ...}}, got '
                                f"{short_repr(block)}")
    return block["type"]


def _text_of(block: dict, place: str) -> str:
    if not isinstance(block.get("text"), str):
        raise ChatTemplateError(f"{place}.text must be a string, got "
                                f"{short_repr(block.get('text'))}")
    return block["text"]


def _unsupported_block(kind: str, place: str, role: str) -> ChatTemplateError:
    if kind in NOT_TEXT_BLOCKS:
        return ChatTemplateError(f"{place} is a {kind} block; this engine serves K3.1 as a text "
                                 "model (MODEL_SPEC: vision_config is ignored); send text only")
    return ChatTemplateError(f"{place} has type {kind!r}, which a {role} message cannot carry "
                             "here; use text, tool_use/tool_result or thinking blocks")

