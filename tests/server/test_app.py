"""server/app.py: routes, lifespan, the engine behind a dependency, 503 on a full queue."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from server.app import create_app

MODEL = "tiny-test"


def test_health_and_models(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        assert client.get("/health").json() == {"status": "ok"}
        models = client.get("/v1/models").json()
        card = client.get(f"/v1/models/{MODEL}").json()
    assert models["object"] == "list" and models["data"] == [card]
    assert card["id"] == MODEL and card["object"] == "model"
    assert card["max_model_len"] == live_server.engine.engine.config.max_model_len


def test_openai_client_lists_the_served_model(live_server):
    client = openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]


def test_create_app_needs_options_or_an_engine():
    with pytest.raises(ValueError, match="needs EngineConfig options or a running AsyncEngine"):
        create_app(None, MODEL)


def test_create_app_refuses_an_empty_api_key(live_server):
    with pytest.raises(ValueError, match="api_key must be a non-empty string"):
        create_app(None, MODEL, api_key="", engine=live_server.engine)


def test_full_waiting_queue_answers_503_and_frees_everything(tiny_checkpoint, engine_config,
                                                            start_server, pools_free):
    """One sequence runs (max_num_seqs=1), one waits (max_num_waiting=1): the third request
    gets 503; then the running stream is dropped, the waiting request completes, and no block
    or state slot stays held."""
    server = start_server(create_app(engine_config(tiny_checkpoint, max_num_seqs=1,
                                                   max_num_waiting=1), MODEL))
    engine = server.engine
    long_stream = {"model": MODEL, "prompt": "run", "max_tokens": 3000, "ignore_eos": True,
                   "stream": True}
    short = {"model": MODEL, "prompt": "wait", "max_tokens": 2}
    waiting_result: dict[str, httpx.Response] = {}

    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=long_stream) as running:
            assert running.status_code == 200
            lines = running.iter_lines()   # kept: dropping the iterator closes the connection
            while not next(lines).startswith("data:"):
                pass
            waiter = threading.Thread(target=lambda: waiting_result.update(
                response=httpx.post(server.base_url + "/v1/completions", json=short,
                                    timeout=60)))
            waiter.start()
            _wait_until(lambda: engine.stats().num_waiting == 1)
            refused = client.post("/v1/completions", json=short)
        waiter.join(timeout=60)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "queue_full" and "busy" in error["message"]
    assert waiting_result["response"].status_code == 200
    pools_free(engine.engine)


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the engine"
        time.sleep(0.01)


def test_health_is_503_once_the_engine_stopped(scripted_server):
    server, engine = scripted_server
    with httpx.Client(base_url=server.base_url) as client:
        engine.is_alive = False
        try:
            response = client.get("/health")
        finally:
            engine.is_alive = True
        assert response.status_code == 503 and response.json() == {"status": "engine stopped"}
        assert client.get("/health").status_code == 200
