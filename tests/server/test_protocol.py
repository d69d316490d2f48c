"""server/protocol.py: request models (strict known fields, unknown ones ignored)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.protocol import ChatCompletionRequest, CompletionRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def test_unknown_openai_fields_are_ignored():
    request = ChatCompletionRequest.model_validate(
        {**CHAT, "user": "u1", "store": True, "metadata": {"a": "b"}, "service_tier": "auto"})
    assert request.model == "m" and not hasattr(request, "store")


@pytest.mark.parametrize("field, value", [
    ("max_tokens", "10"), ("stream", 1), ("temperature", "0.5"), ("n", True), ("seed", 1.0),
], ids=["max-tokens-str", "stream-int", "temperature-str", "n-bool", "seed-float"])
def test_known_fields_are_not_coerced(field, value):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({**CHAT, field: value})


def test_integer_temperature_is_a_number():
    assert ChatCompletionRequest.model_validate({**CHAT, "temperature": 1}).temperature == 1.0


def test_max_completion_tokens_wins_over_max_tokens():
    request = ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 5,
                                                    "max_completion_tokens": 9})
    assert request.max_output_tokens == 9
    assert ChatCompletionRequest.model_validate(CHAT).max_output_tokens is None


@pytest.mark.parametrize("extra, effort", [
    ({}, None), ({"reasoning_effort": "low"}, "low"),
    ({"reasoning_effort": "low", "thinking": {"effort": "max"}}, "max"),
    ({"reasoning_effort": "high", "thinking": {"type": "disabled"}}, "none"),
    ({"chat_template_kwargs": {"thinking": False}}, "none"),
    ({"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "high"}, "high"),
], ids=["default", "top-level", "thinking-effort-wins", "thinking-disabled",
        "template-kwarg-off", "template-kwarg-on"])
def test_effective_reasoning_effort(extra, effort):
    assert ChatCompletionRequest.model_validate({**CHAT, **extra}).effective_reasoning_effort \
        == effort


def test_logprobs_settings():
    assert ChatCompletionRequest.model_validate(CHAT).num_logprobs is None
    assert ChatCompletionRequest.model_validate({**CHAT, "logprobs": True}).num_logprobs == 0
    assert ChatCompletionRequest.model_validate(
        {**CHAT, "logprobs": True, "top_logprobs": 3}).num_logprobs == 3


@pytest.mark.parametrize("stop, expected", [(None, []), ("a", ["a"]), (["a", "bc"], ["a", "bc"])])
def test_stop_strings(stop, expected):
    assert ChatCompletionRequest.model_validate({**CHAT, "stop": stop}).stop_strings == expected


@pytest.mark.parametrize("prompt, prompts", [
    ("text", ["text"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]),
    ([[1], [2, 3]], [[1], [2, 3]]),
], ids=["text", "texts", "ids", "id-lists"])
def test_completion_prompts(prompt, prompts):
    request = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert request.prompts == prompts and request.max_tokens == 16


@pytest.mark.parametrize("prompt", ["", [], [[]], ["a", ""]],
                         ids=["empty-text", "empty-list", "empty-id-list", "one-empty-text"])
def test_empty_completion_prompt_is_refused(prompt):
    with pytest.raises(ValidationError, match="prompt must not be empty"):
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})


def test_tool_names_are_checked():
    tool = {"type": "function", "function": {"name": "mcp.get-weather_2"}}
    ChatCompletionRequest.model_validate({**CHAT, "tools": [tool]})
    with pytest.raises(ValidationError, match="declared twice"):
        ChatCompletionRequest.model_validate({**CHAT, "tools": [tool, tool]})
    with pytest.raises(ValidationError, match="must be 1-64 letters"):
        ChatCompletionRequest.model_validate(
            {**CHAT, "tools": [{"type": "function", "function": {"name": "x" * 65}}]})
