"""server/request_body.py and server/limits.py: bounded bodies, parsed after the key check."""

from __future__ import annotations

import httpx
import pytest

from server.app import create_app
from server.limits import ServerLimits

MODEL = "tiny-test"


@pytest.fixture
def small_limits_server(scripted_server, start_server):
    _, engine = scripted_server
    limits = ServerLimits(max_request_body_bytes=2000, max_chat_messages=5, max_content_parts=8)
    return start_server(create_app(None, MODEL, engine=engine, limits=limits))


def chat(messages: list) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 2}


def test_a_body_over_the_limit_is_413_from_its_length(small_limits_server):
    response = httpx.post(small_limits_server.base_url + "/v1/chat/completions",
                          json=chat([{"role": "user", "content": "x" * 3000}]), timeout=30)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "request_too_large"
    assert "has 3" in error["message"] and "--max-request-body-bytes" in error["message"]


def test_a_chunked_body_over_the_limit_is_413_while_reading(small_limits_server):
    def chunks():
        yield b'{"model": "tiny-test", "messages": [{"role": "user", "content": "'
        for _ in range(50):
            yield b"x" * 100
        yield b'"}]}'

    response = httpx.post(small_limits_server.base_url + "/v1/completions", content=chunks(),
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text
    assert "more than 2000 bytes" in response.json()["error"]["message"]


@pytest.mark.parametrize("messages, code, flag", [
    ([{"role": "user", "content": "x"}] * 6, "too_many_messages", "--max-chat-messages"),
    ([{"role": "user", "content": [{"type": "text", "text": "p"}] * 9}], "too_many_content_parts",
     "--max-content-parts"),
], ids=["messages", "parts"])
def test_too_many_messages_or_parts_is_400_naming_the_flag(small_limits_server, messages, code,
                                                           flag):
    response = httpx.post(small_limits_server.base_url + "/v1/chat/completions",
                          json=chat(messages), timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, "messages") and flag in error["message"]


def test_limits_within_bounds_are_served(small_limits_server, scripted_server):
    _, engine = scripted_server
    engine.script = [min(engine.stop_ids)]
    response = httpx.post(small_limits_server.base_url + "/v1/chat/completions",
                          json=chat([{"role": "user", "content": "x"}] * 5), timeout=30)
    assert response.status_code == 200, response.text


def test_server_limits_refuse_non_positive_values():
    with pytest.raises(ValueError, match="max_chat_messages must be >= 1, got 0"):
        ServerLimits(max_chat_messages=0)
