"""server/anthropic_messages.py: Anthropic requests as the renderer's messages (issue 19)."""

from __future__ import annotations

import pytest

from server.anthropic_messages import to_chat_options
from server.anthropic_protocol import CountTokensRequest
from server.xtml import ChatTemplateError

USER = {"role": "user", "content": "x"}


def options(**fields) -> dict:
    return to_chat_options(CountTokensRequest.model_validate({"model": "m", **fields}))


def test_blocks_map_to_openai_messages_in_order():
    converted = options(system="Be brief.", messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t1", "signature": "s"},
            {"type": "redacted_thinking", "data": "..."}, {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"k": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text",
                                                                       "text": "r"}]},
            {"type": "text", "text": "next"}]}],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any"}, thinking={"type": "disabled"})
    assert converted["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}],
         "reasoning_content": "t1", "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"k": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
        {"role": "user", "content": [{"type": "text", "text": "next"}]}]
    assert converted["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]
    assert (converted["tool_choice"], converted["reasoning_effort"]) == ("required", "none")


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
])
def test_tool_choice(choice, expected):
    assert options(messages=[USER], tool_choice=choice)["tool_choice"] == expected


@pytest.mark.parametrize("fields, message", [
    ({"messages": [{"role": "user", "content": 3}]},
     r"messages\[0\]\.content must be a string or a list of content blocks, got int"),
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 1}]}]},
     r"messages\[0\]\.content\[0\]\.thinking must be a string"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
     r'messages\[0\]\.content\[0\] must be \{"type": "tool_use", "id"'),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "c", "name": "f", "input": [1]}]}]},
     r"messages\[0\]\.content\[0\]\.input must be an object, got list"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
     r"messages\[0\]\.content\[0\]\.text must be a string"),
    ({"messages": [{"role": "user", "content": ["plain"]}]},
     r"messages\[0\]\.content\[0\] must be a content block"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "c", "name": "f"}]}]},
     r"has type 'tool_use', which a user message cannot carry here"),
    ({"messages": [USER], "system": [{"type": "image"}]},
     r"system\[0\] is a image block; this engine serves K3.1 as a text model"),
    ({"messages": [USER], "tools": [{"name": "f"}]},
     r'tools\[0\] must be \{"name": "...", "input_schema"'),
    ({"messages": [USER], "tool_choice": {"type": "sometimes"}},
     r"tool_choice must be \{\"type\": \"auto\""),
])
def test_bad_shapes_name_the_path(fields, message):
    with pytest.raises(ChatTemplateError, match=message):
        options(**fields)
