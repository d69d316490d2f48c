"""server/serving_messages.py: Anthropic's Messages API over real HTTP with the official
`anthropic` client (issue 19).

`scripted_server` generates fixed K3 turns (CHAT_FORMAT.md §2.6) so that thinking, text and
tool_use blocks, stop reasons and the prompt tokens can be checked exactly; `live_server` (the
tiny checkpoint) checks streaming against non-streaming on a real engine."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from server.app import create_app
from server.chat_template import render_chat

from chat_format_example import ANSWER_TURN, TOOL_CALL_TURN, WEATHER_MESSAGES, WEATHER_TOOLS

MODEL = "tiny-test"
KEY = "sk-ant-test"
WEATHER_TOOL = {"name": "get_weather", "description": "Current weather for a city",
                "input_schema": WEATHER_TOOLS[0]["function"]["parameters"],
                "cache_control": {"type": "ephemeral"}}
# CHAT_FORMAT.md §2.6's conversation in Anthropic's shape, up to the tool result
WEATHER_CONVERSATION = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "A greeting.",
                                       "signature": "sig"},
                                      {"type": "text", "text": "Hello! How can I help?"}]},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris for 2 days?",
                                  "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Need live data.", "signature": "sig"},
        {"type": "tool_use", "id": "call_7f3a", "name": "get_weather",
         "input": {"city": "Paris", "days": 2}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_7f3a",
                                  "content": '{"temp_c": 18}'}]},
]


def script(tokenizer, turn: list[tuple[str, bool]]) -> list[int]:
    return tokenizer.encode_segments(turn)


def client_for(server, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=api_key, max_retries=0)


@pytest.fixture
def scripted(scripted_server):
    server, engine = scripted_server
    engine.prompts.clear()
    return server, engine


# ---- exact turns (scripted engine) --------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tool_round_trip(scripted, stream):
    """A tool_use answer, then the conversation sent back with the tool_result and thinking
    blocks: the prompt is token for token the one /v1/chat/completions renders."""
    server, engine = scripted
    client = client_for(server)
    request = dict(model=MODEL, max_tokens=200, system="You are concise.",
                   tools=[WEATHER_TOOL], thinking={"type": "enabled", "budget_tokens": 1024})

    def send(messages):
        if not stream:
            return client.messages.create(messages=messages, **request)
        with client.messages.stream(messages=messages, **request) as events:
            return events.get_final_message()

    engine.script = script(engine.tokenizer, TOOL_CALL_TURN)
    first = send(WEATHER_CONVERSATION[:3])
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "Need live data." and first.content[0].signature
    call = first.content[1]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris", "days": 2})
    assert call.id.startswith("call_") and first.stop_reason == "tool_use"
    assert first.usage.input_tokens == len(engine.prompts[-1])
    assert first.usage.output_tokens == len(engine.script)

    engine.script = script(engine.tokenizer, ANSWER_TURN)
    answer = send(WEATHER_CONVERSATION)
    assert [(b.type, getattr(b, "text", None) or getattr(b, "thinking", None))
            for b in answer.content] == [("thinking", "Tool says 18 C."),
                                         ("text", "About 18 °C in Paris.")]
    assert answer.stop_reason == "end_turn" and answer.stop_sequence is None
    expected = engine.tokenizer.encode_segments(render_chat(WEATHER_MESSAGES,
                                                            tools=WEATHER_TOOLS))
    assert engine.prompts[-1] == expected


def test_stream_sends_the_documented_event_sequence(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, TOOL_CALL_TURN)
    events = list(client_for(server).messages.create(
        model=MODEL, max_tokens=200, messages=WEATHER_CONVERSATION[:3], tools=[WEATHER_TOOL],
        stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens == len(engine.prompts[-1])
    blocks = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    assert blocks == [(0, "thinking"), (1, "tool_use")]
    deltas = [(e.index, e.delta.type) for e in events if e.type == "content_block_delta"]
    assert deltas[-2:] == [(0, "signature_delta"), (1, "input_json_delta")]
    assert {d for d in deltas[:-2]} == {(0, "thinking_delta")}
    assert [e.index for e in events if e.type == "content_block_stop"] == [0, 1]
    tool_json = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
    assert json.loads("".join(tool_json)) == {"city": "Paris", "days": 2}
    assert events[-2].delta.stop_reason == "tool_use"
    assert events[-2].usage.output_tokens == len(engine.script)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_sequences_cut_the_text(scripted, stream):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    request = dict(model=MODEL, max_tokens=100, stop_sequences=["°C", "never"],
                   messages=WEATHER_CONVERSATION, tools=[WEATHER_TOOL])
    client = client_for(server)
    if stream:
        with client.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    assert message.content[-1].text == "About 18 "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "°C")


def test_system_blocks_and_disabled_thinking_render_like_the_chat_route(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, [("Hi.", False), (
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", True)])
    system = [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Be kind.",
                                                      "cache_control": {"type": "ephemeral"}}]
    message = client_for(server).messages.create(
        model=MODEL, max_tokens=20, system=system, thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "Hello"}])
    assert [(b.type, b.text) for b in message.content] == [("text", "Hi.")]
    openai_messages = [{"role": "system", "content": [{"type": "text", "text": "Be brief. "},
                                                      {"type": "text", "text": "Be kind."}]},
                       {"role": "user", "content": "Hello"}]
    assert engine.prompts[-1] == engine.tokenizer.encode_segments(
        render_chat(openai_messages, reasoning_effort="none"))


def test_count_tokens_is_the_rendered_prompt_length(scripted):
    server, engine = scripted
    count = client_for(server).messages.count_tokens(
        model=MODEL, system="You are concise.", messages=WEATHER_CONVERSATION,
        tools=[WEATHER_TOOL])
    expected = engine.tokenizer.encode_segments(render_chat(WEATHER_MESSAGES,
                                                            tools=WEATHER_TOOLS))
    assert count.input_tokens == len(expected)


# ---- errors and auth ----------------------------------------------------------------------------
def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind
    return body["error"]["message"]


@pytest.mark.parametrize("body, status, kind, message", [
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400,
     "invalid_request_error", "max_tokens is required"),
    ({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
     404, "not_found_error", "the model 'claude-x' does not exist"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, 400, "invalid_request_error",
     "messages[0].content[0] is a image block"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
     "invalid_request_error", "server tools"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]}, 400, "invalid_request_error",
     "messages[0].content[0].tool_use_id must name"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, 400,
     "invalid_request_error", "messages[0].role must be 'user' or 'assistant'"),
], ids=["no-max-tokens", "unknown-model", "image", "server-tool", "tool-result-without-id",
        "system-role"])
def test_errors_come_in_anthropics_shape(live_server, body, status, kind, message):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        text = anthropic_error(client.post("/v1/messages", json=body), status, kind)
    assert message in text


def test_unknown_model_is_the_clients_not_found_error(live_server):
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client_for(live_server).messages.create(model="claude-x", max_tokens=4,
                                                messages=[{"role": "user", "content": "x"}])


def test_x_api_key_auth(session_server, start_server):
    server = start_server(create_app(None, MODEL, api_key=KEY, engine=session_server.engine))
    with pytest.raises(anthropic.AuthenticationError):
        client_for(server, "wrong").messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "x"}])
    response = httpx.post(server.base_url + "/v1/messages", content=b"{broken", timeout=30)
    anthropic_error(response, 401, "authentication_error")
    count = client_for(server, KEY).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert count.input_tokens > 0


# ---- the tiny checkpoint ------------------------------------------------------------------------
def test_stream_delivers_what_create_returns(live_server):
    client = client_for(live_server)
    request = dict(model=MODEL, max_tokens=12, extra_body={"temperature": 0.0},
                   messages=[{"role": "user", "content": "Hello there"}])
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as events:
        streamed = events.get_final_message()
    assert whole.stop_reason in ("end_turn", "max_tokens")
    strip = [(b.type, getattr(b, "text", None), getattr(b, "thinking", None))
             for b in whole.content]
    assert strip == [(b.type, getattr(b, "text", None), getattr(b, "thinking", None))
                     for b in streamed.content]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason,
                                                                    whole.usage.output_tokens)
    assert whole.usage.input_tokens == streamed.usage.input_tokens > 0
