"""`atomk31 eval`: scoring through a server's OpenAI API, against a stub server that answers
every instance with its reference turn (all right), one that answers nonsense (all wrong), one
that fails, and the real tiny-checkpoint server (per-family numbers come back)."""

import json

import pytest
from fastapi import FastAPI, HTTPException

from atomk31.cli import main
from atomk31.config import EngineConfig
from atomk31.demo.evaluate import EvalOptions, format_table, instances, run_eval
from live_server import LiveServer
from server.app import create_app

OPTIONS = EvalOptions(num_per_task=6, passkey_lengths=(300, 600), concurrency=3)


def _stub_app(answer) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "stub", "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        return {"choices": [{"index": 0, "message": answer(body), "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 1}}

    return app


@pytest.fixture
def stub_server():
    servers = []

    def start(answer) -> str:
        servers.append(LiveServer(_stub_app(answer)))
        return servers[-1].base_url + "/v1"

    yield start
    for server in servers:
        server.stop()


def test_reference_answers_score_one_everywhere(stub_server):
    targets = {json.dumps(e.messages): e.target for _, e in instances(OPTIONS)}
    url = stub_server(lambda body: targets[json.dumps(body["messages"])])
    result = run_eval(EvalOptions(**{**OPTIONS.__dict__, "base_url": url}))
    assert result["model"] == "stub"
    assert set(result["results"]) == {"arithmetic", "passkey@300", "passkey@600", "tools", "chat"}
    for group, summary in result["results"].items():
        assert summary["accuracy"] == 1.0 and summary["n"] == 6, group
    tools = result["results"]["tools"]
    assert all(tools.get(check, 1.0) == 1.0 for check in ("schema_valid", "right_call"))


def test_nonsense_answers_score_zero_and_requests_carry_tools(stub_server):
    seen_tools = []

    def answer(body):
        seen_tools.append(bool(body.get("tools")))
        assert body["temperature"] == 0.0 and body["max_tokens"] >= 64
        return {"role": "assistant", "content": "", "tool_calls": None}

    result = run_eval(EvalOptions(**{**OPTIONS.__dict__, "base_url": stub_server(answer),
                                     "tasks": ("arithmetic", "tools", "chat")}))
    assert result["results"]["arithmetic"]["accuracy"] == 0.0
    assert result["results"]["chat"]["accuracy"] == 0.0
    assert any(seen_tools)


def test_failing_requests_count_as_errors(stub_server):
    def answer(body):
        raise HTTPException(status_code=500, detail="boom")

    result = run_eval(EvalOptions(**{**OPTIONS.__dict__, "base_url": stub_server(answer),
                                     "tasks": ("chat",)}))
    assert result["results"]["chat"] == {"n": 6, "accuracy": 0.0, "errors": 6}
    assert "6 request errors" in format_table(result)


def test_an_unreachable_server_is_reported(capsys):
    assert main(["eval", "--base-url", "http://127.0.0.1:9/v1", "--tasks", "chat"]) == 1
    assert "could not reach the server at http://127.0.0.1:9/v1" in capsys.readouterr().out


def test_bad_flags_are_reported(capsys):
    assert main(["eval", "--tasks", "poetry"]) == 1
    assert "unknown task families ['poetry']" in capsys.readouterr().out
    assert main(["eval", "--passkey-lengths", "1k"]) == 1
    assert "--passkey-lengths must be comma-separated integers, got '1k'" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_runs_against_the_tiny_server(tiny_checkpoint, tmp_path, capsys):
    options = EngineConfig(model=str(tiny_checkpoint), block_size=16, kernel_backend="torch")
    server = LiveServer(create_app(options, "tiny-test"))
    try:
        result_file = tmp_path / "eval.json"
        assert main(["eval", "--base-url", server.base_url + "/v1", "--num-per-task", "1",
                     "--passkey-lengths", "300", "--max-tokens", "4", "--concurrency", "2",
                     "--result-file", str(result_file)]) == 0
    finally:
        server.stop()
    out = capsys.readouterr().out
    for group in ("arithmetic", "passkey@300", "tools", "chat"):
        assert group in out
    result = json.loads(result_file.read_text())
    assert result["model"] == "tiny-test"
    for summary in result["results"].values():
        assert summary["n"] == 1 and summary["errors"] == 0 and 0.0 <= summary["accuracy"] <= 1.0
