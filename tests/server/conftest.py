"""Server test harness: real uvicorn servers on loopback, in background threads.

`live_server`: the app serving the tiny checkpoint (kernel backend torch, block size 16), shared
by the whole session; after every test that uses it, every KV block and KDA state slot must be
free again (waiting a little for aborts to land). `ScriptedEngine` stands in for the engine when
a test needs exact K3 output (reasoning, tool calls), which random weights never produce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import pytest
from fastapi import FastAPI

from atomk31.checkpoint import Tokenizer
from atomk31.config import EngineConfig
from atomk31.engine.async_engine import EngineStats
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.outputs import CompletionOutput, RequestOutput
from atomk31.engine.sampling_params import SamplingParams
from live_server import LiveServer
from server.app import create_app
from live_server import LiveServer

MODEL_NAME = "tiny-test"
POOLS_FREE_TIMEOUT_S = 10.0


def pool_problems(engine: LLMEngine) -> list[str]:
    """What is still held: blocks, KDA state slots (prefix snapshots excepted), requests."""
    problems = []
    if engine.block_pool.num_free_blocks != engine.block_pool.num_blocks:
        problems.append(f"{engine.block_pool.num_blocks - engine.block_pool.num_free_blocks} "
                        "KV blocks in use")
    pool = engine.state_pool
    held = pool.num_slots - pool.num_free_slots - engine.snapshots.num_snapshots
    if held:
        problems.append(f"{held} KDA state slots in use")
    if engine.scheduler.has_unfinished() or engine.requests:
        problems.append(f"requests still open: {list(engine.requests)}")
    return problems


def assert_pools_free(engine: LLMEngine, timeout_s: float = POOLS_FREE_TIMEOUT_S) -> None:
    """Every block and state slot free again, within timeout_s (aborts land asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while (problems := pool_problems(engine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not problems, f"leaked after the test: {'; '.join(problems)}"


def tiny_engine_config(checkpoint: str, max_num_seqs: int = 64,
                       max_num_waiting: int = 1024) -> EngineConfig:
    return EngineConfig(model=str(checkpoint), block_size=16, kernel_backend="torch",
                        max_num_seqs=max_num_seqs, max_num_waiting=max_num_waiting)


@pytest.fixture(scope="session")
def session_server(tiny_checkpoint) -> Iterator[LiveServer]:
    server = LiveServer(create_app(tiny_engine_config(tiny_checkpoint), MODEL_NAME))
    yield server
    server.stop()


@pytest.fixture
def live_server(session_server: LiveServer) -> Iterator[LiveServer]:
    """The tiny-checkpoint server; the test fails if it leaves blocks or state slots held."""
    yield session_server
    assert_pools_free(session_server.engine.engine)


class ScriptedEngine:
    """Stands in for AsyncEngine: every completion of every request generates `script` (token
    ids), one token per step, until a stop id ("stop") or max_tokens ("length"). Records the
    prompts it was given."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: set[int], max_model_len: int = 4096):
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.engine = SimpleNamespace(config=SimpleNamespace(max_model_len=max_model_len))
        self.script: list[int] = []
        self.prompts: list[list[int]] = []
        self.num_open = 0
        self.is_alive = True

    def stats(self) -> EngineStats:
        return EngineStats(num_running=self.num_open, num_waiting=0, kv_usage=0.0,
                           state_usage=0.0, prefix_hit_rate=0.0, num_free_blocks=1,
                           num_blocks=1, num_free_state_slots=1)

    async def submit(self, requests: list[tuple[list[int], SamplingParams, str]]) -> list:
        return [self.generate(prompt, params, request_id) for prompt, params, request_id
                in requests]

    async def generate(self, prompt: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        self.prompts.append(list(prompt))
        self.num_open += 1
        try:
            ids: list[int] = []
            for token in self.script[:params.max_tokens]:
                ids.append(token)
                reason = ("stop" if token in self.stop_ids
                          else "length" if len(ids) == params.max_tokens else None)
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                yield RequestOutput(request_id, None, list(prompt),
                                    [CompletionOutput(i, text, list(ids), reason)
                                     for i in range(params.n)], finished=reason is not None)
                if reason is not None:
                    return
                await asyncio.sleep(0)
        finally:
            self.num_open -= 1


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_checkpoint) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="session")
def scripted_server(tiny_tokenizer: Tokenizer) -> Iterator[tuple[LiveServer, ScriptedEngine]]:
    stop_ids = {tiny_tokenizer.token_id("<|end_of_msg|>"), tiny_tokenizer.token_id("[EOS]")}
    engine = ScriptedEngine(tiny_tokenizer, stop_ids)
    server = LiveServer(create_app(None, MODEL_NAME, engine=engine))
    yield server, engine
    server.stop()


@pytest.fixture
def scripted_engine(tiny_tokenizer: Tokenizer):
    """Factory: `scripted_engine(max_model_len=...)` -> a fresh ScriptedEngine."""
    stop_ids = {tiny_tokenizer.token_id("<|end_of_msg|>"), tiny_tokenizer.token_id("[EOS]")}
    return lambda max_model_len=4096: ScriptedEngine(tiny_tokenizer, stop_ids, max_model_len)


@pytest.fixture
def start_server() -> Iterator:
    """Factory: `start_server(app)` -> a LiveServer, stopped after the test."""
    servers: list[LiveServer] = []

    def start(app: FastAPI) -> LiveServer:
        servers.append(LiveServer(app))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def pools_free():
    """`pools_free(llm_engine)`: assert every block and state slot is free again."""
    return assert_pools_free


@pytest.fixture
def engine_config():
    """`engine_config(checkpoint, max_num_seqs=..., max_num_waiting=...)` for the tiny model."""
    return tiny_engine_config
