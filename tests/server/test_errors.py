"""server/errors.py: every bad request gets OpenAI's error shape and the right status (issue #4).

Raw httpx over loopback, so malformed bodies reach the server as sent. Each case is its own
parametrized test asserting the status, the exact shape `{"error": {"message", "type", "param",
"code"}}` and, where one field is at fault, `param`.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from server.app import get_engine
from server.errors import param_named_by

MODEL = "tiny-test"
DROP = object()
JSON = {"content-type": "application/json"}


def chat(**changes: object) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for key, value in changes.items():
        if value is DROP:
            body.pop(key)
        else:
            body[key] = value
    return body


def completion(**changes: object) -> dict:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    for key, value in changes.items():
        if value is DROP:
            body.pop(key)
        else:
            body[key] = value
    return body


def user(content: object) -> list[dict]:
    return [{"role": "user", "content": content}]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

# (id, path, body: dict | bytes, status, param or None when not checked)
BAD_REQUESTS = [
    ("malformed-json", CHAT, b'{"model": "tiny-test", "messages": [', 400, None),
    ("body-is-array", CHAT, b"[]", 400, None),
    ("empty-body", CHAT, b"", 400, None),
    ("json-nan", CHAT, b'{"model": "tiny-test", "messages": [{"role": "user", "content": "x"}],'
     b' "temperature": NaN}', 400, "temperature"),
    ("missing-model", CHAT, chat(model=DROP), 400, "model"),
    ("model-not-string", CHAT, chat(model=7), 400, "model"),
    ("missing-messages", CHAT, chat(messages=DROP), 400, "messages"),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages"),
    ("messages-not-list", CHAT, chat(messages="Hi"), 400, "messages"),
    ("message-not-object", CHAT, chat(messages=["Hi"]), 400, "messages[0]"),
    ("message-without-role", CHAT, chat(messages=[{"content": "Hi"}]), 400,
     "messages[0].role"),
    ("unknown-role", CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]), 400,
     "messages[0].role"),
    ("content-is-number", CHAT, chat(messages=user(5)), 400, "messages[0].content"),
    ("image-part", CHAT, chat(messages=user([{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AAAA"}}])), 400, "messages[0].content[0]"),
    ("max-tokens-zero", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", CHAT, chat(max_tokens=-3), 400, "max_tokens"),
    ("max-tokens-string", CHAT, chat(max_tokens="ten"), 400, "max_tokens"),
    ("max-tokens-float", CHAT, chat(max_tokens=2.5), 400, "max_tokens"),
    ("max-completion-tokens-zero", CHAT, chat(max_completion_tokens=0), 400,
     "max_completion_tokens"),
    ("temperature-negative", CHAT, chat(temperature=-1), 400, "temperature"),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("top-p-zero", CHAT, chat(top_p=0), 400, "top_p"),
    ("top-p-above-one", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("top-k-below-minus-one", CHAT, chat(top_k=-2), 400, "top_k"),
    ("n-zero", CHAT, chat(n=0), 400, "n"),
    ("n-too-large", CHAT, chat(n=1000), 400, "n"),
    ("stream-not-bool", CHAT, chat(stream="yes"), 400, "stream"),
    ("stop-empty-string", CHAT, chat(stop=[""]), 400, "stop"),
    ("stop-number", CHAT, chat(stop=5), 400, "stop"),
    ("seed-string", CHAT, chat(seed="abc"), 400, "seed"),
    ("seed-over-64-bits", CHAT, chat(seed=2 ** 70), 400, "seed"),   # crashed the engine thread
    ("completions-seed-under-64-bits", COMPLETIONS, completion(seed=-(2 ** 64)), 400, "seed"),
    ("logprobs-not-bool", CHAT, chat(logprobs="yes"), 400, "logprobs"),
    ("top-logprobs-too-many", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=2), 400, None),
    ("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}), 400,
     None),
    ("presence-penalty", CHAT, chat(presence_penalty=0.5), 400, None),
    ("logit-bias", CHAT, chat(logit_bias={"5": 10}), 400, None),
    ("min-tokens-over-max-tokens", CHAT, chat(min_tokens=5, max_tokens=2), 400, None),
    ("tools-not-list", CHAT, chat(tools={"type": "function"}), 400, "tools"),
    ("tool-wrong-type", CHAT, chat(tools=[{"type": "retrieval", "function": {"name": "a"}}]),
     400, "tools[0]"),
    ("tool-without-function", CHAT, chat(tools=[{"type": "function"}]), 400,
     "tools[0].function"),
    ("tool-name-with-space", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "get weather"}}]), 400, "tools"),
    ("tool-parameters-not-object", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": ["city"]}}]), 400, "tools[0].function.parameters"),
    ("duplicate-tool-names", CHAT, chat(tools=[WEATHER, WEATHER]), 400, "tools"),
    ("tool-choice-unknown-function", CHAT, chat(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_time"}}), 400, "tool_choice"),
    ("tool-choice-required-without-tools", CHAT, chat(tool_choice="required"), 400,
     "tool_choice"),
    ("tool-choice-unknown-mode", CHAT, chat(tools=[WEATHER], tool_choice="sometimes"), 400,
     "tool_choice"),
    ("reasoning-effort-unknown", CHAT, chat(reasoning_effort="extreme"), 400,
     "reasoning_effort"),
    ("reasoning-effort-number", CHAT, chat(reasoning_effort=3), 400, "reasoning_effort"),
    ("response-format-unknown", CHAT, chat(response_format={"type": "xml"}), 400,
     "response_format"),
    ("response-format-schema-missing", CHAT, chat(response_format={"type": "json_schema"}), 400,
     "response_format"),
    ("assistant-arguments-not-object", CHAT, chat(messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "[1, 2]"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]), 400,
     "messages[1].tool_calls[0].function.arguments"),
    ("tool-message-without-call-id", CHAT, chat(messages=[
        {"role": "user", "content": "Hi"}, {"role": "tool", "content": "18 C"}]), 400,
     "messages[1]"),
    ("context-length-exceeded", CHAT, chat(max_tokens=5000), 400, "messages"),
    ("unknown-model", CHAT, chat(model="gpt-4o"), 404, "model"),
    ("completions-missing-prompt", COMPLETIONS, completion(prompt=DROP), 400, "prompt"),
    ("completions-empty-prompt", COMPLETIONS, completion(prompt=""), 400, None),
    ("completions-empty-list", COMPLETIONS, completion(prompt=[]), 400, None),
    ("completions-mixed-prompt", COMPLETIONS, completion(prompt=[1, "a"]), 400, "prompt"),
    ("completions-negative-token", COMPLETIONS, completion(prompt=[-1]), 400, "prompt"),
    ("completions-token-out-of-vocab", COMPLETIONS, completion(prompt=[5, 10 ** 7]), 400, None),
    ("completions-max-tokens-zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    ("completions-logprobs-too-many", COMPLETIONS, completion(logprobs=21), 400, "logprobs"),
    ("completions-suffix", COMPLETIONS, completion(suffix="!"), 400, None),
    ("completions-best-of", COMPLETIONS, completion(best_of=3), 400, None),
    ("completions-context-length-exceeded", COMPLETIONS,
     completion(prompt=[5] * 4000, max_tokens=200), 400, "prompt"),
    ("completions-unknown-model", COMPLETIONS, completion(model="davinci"), 404, "model"),
]


def assert_error_shape(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


@pytest.mark.parametrize("path, body, status, param",
                         [case[1:] for case in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_gets_openai_error(live_server, path, body, status, param):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        if isinstance(body, bytes):
            response = client.post(path, content=body, headers=JSON)
        else:
            response = client.post(path, json=body)
    error = assert_error_shape(response, status)
    if param is not None:
        assert error["param"] == param, error


def test_bad_requests_cover_at_least_30_kinds():
    assert len(BAD_REQUESTS) >= 30


def test_context_length_error_names_both_numbers(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        response = client.post(COMPLETIONS, json=completion(prompt=[5] * 4000, max_tokens=200))
    error = assert_error_shape(response, 400)
    assert error["code"] == "context_length_exceeded"
    for number in ("4000", "200", "4200", "4096"):
        assert number in error["message"], error["message"]


def test_form_encoded_body_is_told_to_send_json(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        response = client.post(CHAT, content=b"model=tiny-test",
                               headers={"content-type": "application/x-www-form-urlencoded"})
    assert "Content-Type: application/json" in assert_error_shape(response, 400)["message"]


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/nothing", 404), ("GET", CHAT, 405), ("DELETE", "/v1/models", 405),
    ("GET", "/v1/models/gpt-4o", 404),
], ids=["unknown-route", "get-on-chat", "delete-on-models", "unknown-model-card"])
def test_router_errors_get_openai_error(live_server, method, path, status):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        assert_error_shape(client.request(method, path), status)


class _BrokenEngine:
    @property
    def tokenizer(self):
        raise RuntimeError("secret internal detail /etc/passwd")


def test_500_logs_traceback_and_returns_only_a_request_id(live_server, caplog):
    app = live_server.app
    app.dependency_overrides[get_engine] = _BrokenEngine
    try:
        with caplog.at_level(logging.ERROR, logger="server.errors"), \
                httpx.Client(base_url=live_server.base_url, timeout=30) as client:
            response = client.post(CHAT, json=chat())
    finally:
        app.dependency_overrides.clear()
    error = assert_error_shape(response, 500)
    assert "secret" not in response.text and "RuntimeError" not in response.text
    request_id = error["message"].split("request id ")[1].split()[0]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None, "the traceback was not logged"


def test_server_still_serves_after_bad_input(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        for _, path, body, _, _ in BAD_REQUESTS[:10]:
            client.post(path, content=body, headers=JSON) if isinstance(body, bytes) \
                else client.post(path, json=body)
        response = client.post(CHAT, json=chat())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("message, param", [
    ("messages[0].role must be one of ...", "messages[0].role"),
    ("tools[1].function.parameters must be ...", "tools[1].function.parameters"),
    ("tool_choice='required' needs ...", "tool_choice"),
    ("the prompt is empty", None), ("temperature must be >= 0", None),
])
def test_param_named_by_a_renderer_message(message, param):
    fields = frozenset({"messages", "tools", "tool_choice"})
    assert param_named_by(message, fields) == param


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_unknown_model_404_bounds_the_echoed_name(live_server, path):
    """Issue 19: a 404 for an unknown model echoed a 1 MB model name in full."""
    name = "m" * 1_000_000
    body = chat(model=name) if path == CHAT else completion(model=name)
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        response = client.post(path, json=body)
    error = assert_error_shape(response, 404)
    assert len(response.content) < 1000 and "(1000000 characters)" in error["message"]


def test_unknown_route_404_bounds_the_echoed_path(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        response = client.get("/v1/" + "p" * 5000)
    assert len(assert_error_shape(response, 404)["message"]) < 300
