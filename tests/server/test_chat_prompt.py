"""server/chat_prompt.py: a chat's prompt bounded, rendered and tokenized off the event loop,
refused as soon as it cannot fit (issue 19)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from server.app import create_app
from server.chat_prompt import MIN_TOKENS_PER_MESSAGE, build_chat_prompt, encode_within
from server.chat_template import render_chat
from server.errors import APIError
from server.limits import ServerLimits

MODEL = "tiny-test"


def test_every_message_renders_at_least_the_minimum_tokens(tiny_tokenizer):
    """The early bound is a true lower bound for the smallest messages of every role."""
    smallest = [{"role": "user", "content": ""}, {"role": "system", "content": None},
                {"role": "assistant", "content": ""},
                {"role": "tool", "tool_call_id": "c", "name": "f", "content": ""}]
    for message in smallest:
        for effort in (None, "none"):
            one, two = (tiny_tokenizer.encode_segments(render_chat(
                [message] * count, reasoning_effort=effort, add_generation_prompt=False))
                for count in (1, 2))
            per_message = len(two) - len(one)
            assert per_message >= MIN_TOKENS_PER_MESSAGE, message


def test_encode_within_equals_encode_segments_and_stops_early(tiny_tokenizer):
    segments = render_chat([{"role": "user", "content": f"message {i} é"} for i in range(50)])
    full = tiny_tokenizer.encode_segments(segments)
    assert encode_within(tiny_tokenizer, segments, len(full)) == full
    assert encode_within(tiny_tokenizer, segments, len(full) - 1) is None


def test_a_chat_that_cannot_fit_is_refused_before_rendering(live_server, monkeypatch):
    """Issue 19: 40,000 one-character messages were rendered and tokenized (for seconds)
    before the context check; the message count alone shows they cannot fit in 4096."""
    import server.chat_prompt as chat_prompt

    def must_not_render(*args, **kwargs):
        raise AssertionError("rendered a prompt already known not to fit")

    monkeypatch.setattr(chat_prompt, "render_chat", must_not_render)
    messages = [{"role": "user", "content": "x"}] * 400
    start = time.monotonic()
    response = httpx.post(live_server.base_url + "/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": messages, "max_tokens": 8})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "400 messages make at least 4410 tokens" in error["message"]
    assert "4096" in error["message"] and time.monotonic() - start < 5


@pytest.fixture
def roomy_server(scripted_engine, start_server):
    """A scripted engine with a huge context, and limits that let a huge chat through."""
    engine = scripted_engine(max_model_len=10 ** 8)
    engine.script = sorted(engine.stop_ids)
    limits = ServerLimits(max_chat_messages=10 ** 6, max_content_parts=10 ** 6)
    return start_server(create_app(None, MODEL, engine=engine, limits=limits))


def test_health_answers_while_a_huge_chat_renders(roomy_server):
    """Issue 19: one request of 40,000 messages left /health unanswered for 9.3 s: the
    prompt was rendered and tokenized on the event loop."""
    messages = [{"role": "user", "content": f"message number {i}"} for i in range(40_000)]
    result: dict = {}

    def send() -> None:
        start = time.monotonic()
        result["response"] = httpx.post(roomy_server.base_url + "/v1/chat/completions",
                                        json={"model": MODEL, "messages": messages,
                                              "max_tokens": 1}, timeout=120)
        result["seconds"] = time.monotonic() - start

    sender = threading.Thread(target=send)
    sender.start()
    latencies = []
    with httpx.Client(base_url=roomy_server.base_url, timeout=30) as client:
        time.sleep(0.3)   # the body is sent and its rendering under way
        while sender.is_alive() and len(latencies) < 200:
            start = time.monotonic()
            assert client.get("/health").status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)
    sender.join()
    assert result["response"].status_code == 200, result["response"].text
    # On the event loop, one probe waited for the whole rendering; in a worker thread each
    # answers at once (the bound is loose: other processes may load the machine).
    assert latencies and max(latencies) < min(1.0, result["seconds"] / 3), (latencies, result)
    assert len(latencies) >= 3, "the request finished before /health could be probed"


@pytest.mark.parametrize("content, max_prompt, message", [
    ([{"type": "text", "text": "w"}] * 40, 50,
     "the rendered prompt has 61 segments, so at least as many tokens"),
    ("some words " * 20, 40, "the prompt has more than 40 tokens"),
], ids=["by-segments", "by-tokens"])
def test_build_chat_prompt_stops_as_soon_as_the_prompt_cannot_fit(tiny_tokenizer, content,
                                                                 max_prompt, message):
    messages = [{"role": "user", "content": content}]
    with pytest.raises(APIError, match=message) as raised:
        build_chat_prompt(messages, tiny_tokenizer, max_prompt, 4096, reasoning_effort="none")
    assert raised.value.code == "context_length_exceeded"
    assert "at most" in raised.value.message and "4096" in raised.value.message
