"""server/auth.py: with --api-key, /v1 needs the bearer token; /health and /metrics stay open."""

from __future__ import annotations

import httpx
import openai
import pytest

from server.app import create_app

MODEL = "tiny-test"
KEY = "sk-test-4d1c"


@pytest.fixture
def keyed_server(session_server, start_server):
    """A second app with an API key, over the session's engine (no second engine to build)."""
    return start_server(create_app(None, MODEL, api_key=KEY, engine=session_server.engine))


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
    {"Authorization": KEY}, {"Authorization": "Bearer"}, {"Authorization": f"Bearer {KEY}x"},
], ids=["absent", "wrong", "basic-scheme", "no-scheme", "empty", "longer"])
@pytest.mark.parametrize("method, path", [("GET", "/v1/models"),
                                          ("POST", "/v1/chat/completions")],
                         ids=["models", "chat"])
def test_wrong_or_missing_key_is_401(keyed_server, headers, method, path):
    response = httpx.request(method, keyed_server.base_url + path, headers=headers, timeout=30,
                             json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key" and KEY not in response.text
    assert response.headers["www-authenticate"] == "Bearer"


def test_right_key_is_served_by_the_openai_client(keyed_server):
    client = openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    wrong = openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_health_and_metrics_need_no_key(keyed_server, path):
    assert httpx.get(keyed_server.base_url + path, timeout=30).status_code == 200


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'{"model": 3}'],
                         ids=["broken-json", "empty", "not-an-object", "wrong-types"])
def test_the_key_is_checked_before_the_body_is_parsed(keyed_server, body):
    """Issue 19: without a key, an invalid body got 400 instead of 401 (the body was parsed
    before the key was checked)."""
    response = httpx.post(keyed_server.base_url + "/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_x_api_key_header_is_accepted_too(keyed_server):
    headers = {"x-api-key": KEY}
    assert httpx.get(keyed_server.base_url + "/v1/models", headers=headers,
                     timeout=30).status_code == 200
    headers = {"x-api-key": "wrong", "Authorization": f"Bearer {KEY}"}
    assert httpx.get(keyed_server.base_url + "/v1/models", headers=headers,
                     timeout=30).status_code == 401
