"""server/serving_chat.py over real HTTP with the official openai client (issue #4).

Two engines: the tiny checkpoint (`live_server`; random weights, so the tests compare the server
against itself: streaming against non-streaming, seed against seed), and `ScriptedEngine`
(`scripted_server`), which generates a fixed K3 turn so that reasoning, content, tool calls and
stop strings can be checked to the byte (CHAT_FORMAT.md §2.6, §3).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from server.chat_template import render_chat

from chat_format_example import ANSWER_TURN, TOOL_CALL_TURN, WEATHER_TOOLS
from chat_format_example import WEATHER_MESSAGES as WEATHER_HISTORY

MODEL = "tiny-test"
USER_HI = [{"role": "user", "content": "Hi"}]


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@dataclass
class StreamedChoice:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    roles: list[str] = field(default_factory=list)


def collect(chunks) -> tuple[dict[int, StreamedChoice], object]:
    """Fold a stream into per-choice results; -> (choices, usage of the final chunk)."""
    choices: dict[int, StreamedChoice] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for c in chunk.choices:
            got = choices.setdefault(c.index, StreamedChoice())
            assert got.finish_reason is None, "a chunk arrived after the choice finished"
            delta = c.delta
            got.roles += [delta.role] if delta.role else []
            got.reasoning += getattr(delta, "reasoning_content", None) or ""
            got.content += delta.content or ""
            got.tool_calls += [call.model_dump() for call in delta.tool_calls or []]
            got.tokens += [t.token for t in (c.logprobs.content if c.logprobs else [])]
            got.finish_reason = c.finish_reason
    return choices, usage


def script(tokenizer, turn: list[tuple[str, bool]]) -> list[int]:
    return tokenizer.encode_segments(turn)


# ---- the tiny checkpoint -----------------------------------------------------------------------
def test_chat_answers_in_openai_shape(live_server):
    response = client_for(live_server).chat.completions.create(
        model=MODEL, messages=USER_HI, max_tokens=6, seed=1, logprobs=True, top_logprobs=2)
    assert response.object == "chat.completion" and response.model == MODEL
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.completion_tokens == len(choice.logprobs.content) <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)


def test_chat_stream_delivers_what_non_stream_returns(live_server):
    client = client_for(live_server)
    request = dict(model=MODEL, messages=USER_HI, max_tokens=12, seed=7, logprobs=True, n=2)
    whole = client.chat.completions.create(**request)
    streamed, usage = collect(client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}))
    assert sorted(streamed) == [0, 1]
    for choice in whole.choices:
        got = streamed[choice.index]
        assert got.roles == ["assistant"]
        assert got.reasoning == (getattr(choice.message, "reasoning_content", None) or "")
        assert got.content == (choice.message.content or "")
        assert got.tokens == [t.token for t in choice.logprobs.content]
        assert got.finish_reason == choice.finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_same_seed_same_answer(live_server):
    client = client_for(live_server)

    def tokens(seed: int) -> list[str]:
        response = client.chat.completions.create(model=MODEL, messages=USER_HI, max_tokens=8,
                                                  seed=seed, temperature=1.0, logprobs=True)
        return [t.token for t in response.choices[0].logprobs.content]

    first = tokens(11)
    assert tokens(11) == first
    assert tokens(12) != first


def test_chat_32_concurrent_streams_each_deliver_every_token_once(live_server):
    """32 streams at once, each compared with the same request (same seed) not streamed; the
    non-streamed twins run in the same batch. Non-thinking prompts, whose ~50 tokens keep the
    64-request prefill affordable on 2 CPU cores (the thinking prompt's effort note is ~200);
    thinking streams are compared in test_chat_stream_delivers_what_non_stream_returns."""
    def request(i: int) -> dict:
        return dict(model=MODEL, max_tokens=3 + i % 5, seed=i, logprobs=True,
                    reasoning_effort="none", messages=[{"role": "user", "content": f"go {i}"}])

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=live_server.base_url + "/v1", api_key="unused",
                                    max_retries=0, timeout=120)

        async def streamed(i: int) -> StreamedChoice:
            chunks = [c async for c in await client.chat.completions.create(**request(i),
                                                                             stream=True)]
            return collect(chunks)[0][0]

        results = await asyncio.gather(*(streamed(i) for i in range(32)),
                                       *(client.chat.completions.create(**request(i))
                                         for i in range(32)))
        await client.close()
        for i, (got, whole) in enumerate(zip(results[:32], results[32:])):
            choice = whole.choices[0]
            assert got.tokens == [t.token for t in choice.logprobs.content], f"request {i}"
            assert got.reasoning == (getattr(choice.message, "reasoning_content", None) or "")
            assert got.content == (choice.message.content or ""), f"request {i}"
            assert got.finish_reason == choice.finish_reason, f"request {i}"
            assert len(got.tokens) == whole.usage.completion_tokens, f"request {i}"

    asyncio.run(run())


def test_chat_client_leaving_mid_stream_aborts_the_request(live_server, pools_free):
    body = {"model": MODEL, "messages": USER_HI, "max_tokens": 3000, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client, \
            client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = []
        for line in response.iter_lines():
            events += [line] if line.startswith("data:") else []
            if len(events) == 3:
                break
        assert len(events) == 3
    pools_free(live_server.engine.engine)   # well before 3000 tokens could have been generated


def test_chat_client_leaving_before_a_whole_answer_aborts_the_request(live_server, pools_free):
    body = {"model": MODEL, "messages": USER_HI, "max_tokens": 3000, "ignore_eos": True}
    with httpx.Client(base_url=live_server.base_url, timeout=httpx.Timeout(30, read=1.0)) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/chat/completions", json=body)
    pools_free(live_server.engine.engine)


# ---- scripted K3 turns ---------------------------------------------------------------------------
@pytest.fixture
def scripted(scripted_server):
    server, engine = scripted_server
    engine.prompts.clear()
    yield server, engine
    assert engine.num_open == 0, "a scripted request was left open"


def test_reasoning_and_content_come_back_separately(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    response = client_for(server).chat.completions.create(
        model=MODEL, messages=WEATHER_HISTORY, tools=WEATHER_TOOLS, reasoning_effort="high")
    message = response.choices[0].message
    assert message.reasoning_content == "Tool says 18 C."
    assert message.content == "About 18 °C in Paris."
    assert message.tool_calls is None
    assert response.choices[0].finish_reason == "stop"


def test_history_with_reasoning_and_tool_calls_is_rendered_faithfully(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    client_for(server).chat.completions.create(
        model=MODEL, messages=WEATHER_HISTORY, tools=WEATHER_TOOLS, reasoning_effort="high")
    expected = engine.tokenizer.encode_segments(render_chat(
        WEATHER_HISTORY, tools=WEATHER_TOOLS, reasoning_effort="high"))
    assert engine.prompts == [expected]
    text = engine.tokenizer.decode(expected)
    assert "Need live data." in text and "thinking_effort=high" in text


@pytest.mark.parametrize("extra, expected_note", [
    ({"reasoning_effort": "low"}, "thinking_effort=low"),
    ({"reasoning_effort": "medium"}, "thinking_effort=high"),
    ({}, "thinking_effort=max"),
    ({"extra_body": {"thinking": {"effort": "high"}}, "reasoning_effort": "low"},
     "thinking_effort=high"),
], ids=["low", "medium-maps-to-high", "default-max", "thinking-effort-wins"])
def test_reasoning_effort_reaches_the_template(scripted, extra, expected_note):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    client_for(server).chat.completions.create(model=MODEL, messages=USER_HI, **extra)
    assert expected_note in engine.tokenizer.decode(engine.prompts[-1])


@pytest.mark.parametrize("extra", [
    {"reasoning_effort": "none"}, {"extra_body": {"thinking": {"type": "disabled"}}},
    {"extra_body": {"chat_template_kwargs": {"thinking": False}}},
], ids=["effort-none", "thinking-disabled", "template-kwarg"])
def test_thinking_can_be_switched_off(scripted, extra):
    server, engine = scripted
    engine.script = script(engine.tokenizer, [("Hello.", False), (
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", True)])
    response = client_for(server).chat.completions.create(model=MODEL, messages=USER_HI, **extra)
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert prompt.endswith('<|open|>response<|sep|>') and "thinking_effort" not in prompt
    assert response.choices[0].message.content == "Hello."
    assert getattr(response.choices[0].message, "reasoning_content", None) is None


def test_tool_call_comes_back_as_openai_tool_calls(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, TOOL_CALL_TURN)
    response = client_for(server).chat.completions.create(
        model=MODEL, messages=WEATHER_HISTORY[:4], tools=WEATHER_TOOLS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.reasoning_content == "Need live data."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}


def test_tool_call_is_streamed_whole_once_when_it_closes(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, TOOL_CALL_TURN)
    chunks = list(client_for(server).chat.completions.create(
        model=MODEL, messages=WEATHER_HISTORY[:4], tools=WEATHER_TOOLS, stream=True))
    with_calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(with_calls) == 1
    [call] = with_calls[0].choices[0].delta.tool_calls
    assert call.index == 0 and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    streamed = collect(chunks)[0][0]
    assert streamed.reasoning == "Need live data." and streamed.content == ""
    assert streamed.finish_reason == "tool_calls"


def test_tool_choice_none_drops_generated_calls(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, TOOL_CALL_TURN)
    response = client_for(server).chat.completions.create(
        model=MODEL, messages=WEATHER_HISTORY[:4], tools=WEATHER_TOOLS, tool_choice="none")
    choice = response.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"


@pytest.mark.parametrize("stop, expected", [
    ("°C", "About 18 "), (["nothing", "18 °"], "About "), ("C in", "About 18 °"),
    ("Paris.", "About 18 °C in "), ("absent", "About 18 °C in Paris."),
], ids=["one-string", "list", "spans-tokens", "at-the-end", "no-match"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_string_cuts_the_response_channel_only(scripted, stop, expected, stream):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    request = dict(model=MODEL, messages=USER_HI, stop=stop)
    if stream:
        got = collect(client_for(server).chat.completions.create(**request, stream=True))[0][0]
        content, reasoning, reason = got.content, got.reasoning, got.finish_reason
    else:
        choice = client_for(server).chat.completions.create(**request).choices[0]
        content, reasoning = choice.message.content, choice.message.reasoning_content
        reason = choice.finish_reason
    # "C" also occurs in the reasoning ("18 C."): stop strings never look there (§4)
    assert (reasoning, content, reason) == ("Tool says 18 C.", expected, "stop")
    assert engine.num_open == 0


def test_token_limit_inside_thinking_gives_reasoning_only(scripted):
    server, engine = scripted
    engine.script = script(engine.tokenizer, ANSWER_TURN)
    response = client_for(server).chat.completions.create(model=MODEL, messages=USER_HI,
                                                          max_tokens=2)
    choice = response.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    assert choice.message.reasoning_content
