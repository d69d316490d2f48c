"""atomk31/bench/serve_client.py: one streamed request against scripted HTTP answers."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from atomk31.bench.serve_client import (
    RequestSpec, endpoint_kind, request_body, send_request,
)

URL = "http://server/v1/completions"


def sse(*payloads: dict | str) -> list[bytes]:
    return [f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n".encode() for p in payloads]


def text_chunk(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def chat_chunk(delta: dict) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def serve(events: list[bytes | float], status: int = 200):
    """A transport answering every request with `events`: bytes are sent, floats slept."""
    async def body():
        for event in events:
            if isinstance(event, float):
                await asyncio.sleep(event)
            else:
                yield event

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body())

    return httpx.MockTransport(handler)


def run(transport: httpx.AsyncBaseTransport, timeout_s: float = 10.0):
    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await send_request(client, URL, {"model": "m"}, prompt_len=5, headers={},
                                      timeout_s=timeout_s)
    return asyncio.run(go())


def test_a_completions_stream_gives_ttft_itl_e2el_and_usage():
    events = [*sse(text_chunk(" a")), 0.05, *sse(text_chunk(" b c", "length")), *sse(USAGE),
              *sse("[DONE]")]
    result = run(serve(events))
    assert result.success and result.error == ""
    assert result.generated_text == " a b c"
    assert len(result.itl) == 1 and result.itl[0] >= 0.05
    assert result.latency == pytest.approx(result.ttft + result.itl[0])
    assert (result.output_tokens, result.prompt_len) == (3, 7)


def test_a_completions_chunk_with_empty_text_is_a_token_arrival():
    """A token that completes no character (a special token, part of a UTF-8 sequence) comes
    as a chunk with empty text: it is the first token's arrival, as vLLM's client counts it."""
    events = [*sse(text_chunk("")), 0.05, *sse(text_chunk("")), *sse(text_chunk("ab", "length")),
              *sse(USAGE, "[DONE]")]
    result = run(serve(events))
    assert result.success and result.ttft < 0.05
    assert len(result.itl) == 2 and result.itl[0] >= 0.05
    assert result.generated_text == "ab"


def test_a_chat_role_chunk_does_not_count_as_the_first_token():
    events = [*sse(chat_chunk({"role": "assistant", "content": ""})), 0.1,
              *sse(chat_chunk({"reasoning_content": "hm"})), *sse(chat_chunk({"content": "ok"})),
              *sse(USAGE, "[DONE]")]
    result = run(serve(events))
    assert result.success and result.ttft >= 0.1
    assert result.generated_text == "hmok" and len(result.itl) == 1


@pytest.mark.parametrize("events, status, error", [
    (sse({"error": {"message": "nope"}}), 404, r"^HTTP 404: .*nope"),
    ([*sse(text_chunk(" a")), *sse({"error": {"message": "engine died"}})], 200,
     r"^error in the stream: engine died"),
    (sse(USAGE, "[DONE]"), 200, r"carried no generated output"),
    ([b"data: {not json\n\n"], 200, r"^JSONDecodeError"),
], ids=["http-error", "in-band-error", "no-output", "bad-json"])
def test_failures_are_reported_not_raised(events, status, error):
    result = run(serve(events, status))
    assert not result.success
    assert re.search(error, result.error), result.error


def test_a_stuck_server_fails_the_request_at_its_deadline():
    result = run(serve([*sse(text_chunk(" a")), 30.0]), timeout_s=0.3)
    assert not result.success
    assert "no complete answer within 0.3 s; raise --request-timeout" in result.error


def test_a_refused_connection_fails_the_request():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    result = run(httpx.MockTransport(refuse))
    assert not result.success and result.error.startswith("ConnectError: connection refused")


def test_request_bodies_follow_the_openai_shapes():
    spec = RequestSpec(prompt=[1, 2, 3], prompt_len=3, output_len=9)
    body = request_body("completions", "m", spec, ignore_eos=True, temperature=0.0)
    assert body == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "prompt": [1, 2, 3], "max_tokens": 9, "ignore_eos": True, "temperature": 0.0}
    chat = request_body("chat", "m", RequestSpec("hi", 1, 4), ignore_eos=False, temperature=None)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 4 and "ignore_eos" not in chat


def test_endpoint_kind_reads_the_path_and_refuses_others():
    assert endpoint_kind("/v1/chat/completions") == "chat"
    assert endpoint_kind("/v1/completions/") == "completions"
    with pytest.raises(ValueError, match="--endpoint must end with /completions or "
                                         "/chat/completions, got '/v1/embeddings'"):
        endpoint_kind("/v1/embeddings")
