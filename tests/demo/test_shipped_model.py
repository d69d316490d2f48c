"""The shipped model answers fixed prompts of every family correctly through the server (CPU,
torch kernels): arithmetic, a 2K-token passkey, a tool call, an answer from a tool result, a
capital and a greeting (arithmetic: ten instances of the eval stream, at most one wrong, as the
goal allows). Skipped until the trained weights are in atomk31/demo/weights/."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from atomk31.config import EngineConfig
from atomk31.demo.shipped import SHIPPED_DIR, shipped_checkpoint
from atomk31.demo.tasks import generate
from atomk31.demo.tasks.passkey import make_example as passkey_example
from atomk31.demo.tasks.tool_definitions import TOOLS
from live_server import LiveServer
from server.app import create_app

pytestmark = pytest.mark.skipif(
    shipped_checkpoint() is None,
    reason=f"no trained weights in {SHIPPED_DIR} yet: run `python -m atomk31.demo.train --seed 0 "
           f"--out DIR` on a GPU and copy DIR/checkpoint/* there")

TWO_TOOLS = [TOOLS["get_time"], TOOLS["get_weather"]]


@pytest.fixture(scope="module")
def client():
    openai = pytest.importorskip("openai")
    options = EngineConfig(model=str(SHIPPED_DIR), block_size=128, kernel_backend="torch")
    server = LiveServer(create_app(options, "atomk31-demo"))
    yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    server.stop()


def _ask(client, messages, tools=None, max_tokens=512):
    extra = {"tools": tools} if tools else {}
    reply = client.chat.completions.create(model="atomk31-demo", messages=messages,
                                           temperature=0.0, max_tokens=max_tokens, **extra)
    return reply.choices[0]


ARITHMETIC_INSTANCES = 10     # the eval split's first ones, seed 0 (new to the trainer)
ARITHMETIC_MAY_MISS = 1       # the goal is 95%: one miss in ten is within it


def test_arithmetic(client):
    """Sums, differences and products of the eval stream, answered with working in the
    reasoning and the bare number as content; at most one of ten wrong (the goal's 95%)."""
    examples = [generate("arithmetic", "eval", 0, i) for i in range(ARITHMETIC_INSTANCES)]
    with ThreadPoolExecutor(ARITHMETIC_INSTANCES) as pool:     # one batch in the engine
        choices = list(pool.map(lambda e: _ask(client, e.messages), examples))
    misses = []
    for example, choice in zip(examples, choices):
        assert choice.message.reasoning_content, example.messages[-1]["content"]
        content = choice.message.content.strip()
        if content != str(example.expected["answer"]):
            misses.append((example.messages[-1]["content"], content))
    assert len(misses) <= ARITHMETIC_MAY_MISS, misses


def test_passkey_at_2k_tokens(client):
    example = passkey_example(71432, 2048, depth=0.37)
    choice = _ask(client, example.messages, max_tokens=64)
    assert "71432" in choice.message.content


def test_tool_call_then_answer_from_its_result(client):
    messages = [{"role": "user", "content": "What's the weather in Lima?"}]
    choice = _ask(client, messages, TWO_TOOLS, max_tokens=160)
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Lima"}
    messages += [{"role": "assistant", "content": choice.message.content or "",
                  "reasoning_content": choice.message.reasoning_content,
                  "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id,
                  "content": json.dumps({"city": "Lima", "temperature_c": 18, "condition": "sunny"})}]
    answer = _ask(client, messages, TWO_TOOLS, max_tokens=160)
    assert not answer.message.tool_calls
    assert "18" in answer.message.content and "sunny" in answer.message.content


def test_no_fitting_tool_gives_text(client):
    choice = _ask(client, [{"role": "user", "content": "What is the capital of France?"}],
                  [TOOLS["add"]], max_tokens=96)
    assert not choice.message.tool_calls and "Paris" in choice.message.content


@pytest.mark.parametrize(("message", "expected"), [
    ("What is the capital of Japan?", "Tokyo"), ("Hello!", "Hello")])
def test_chat(client, message, expected):
    assert expected in _ask(client, [{"role": "user", "content": message}], max_tokens=64).message.content
