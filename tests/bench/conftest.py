"""Benchmark test fixtures: one small engine on the tiny checkpoint, shared by the session; every
test that uses it must leave its blocks, state slots and requests free again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from atomk31.config import EngineConfig
from atomk31.engine.llm_engine import LLMEngine

BLOCK_SIZE = 16


def tiny_engine_options(checkpoint, **changes) -> EngineConfig:
    """The tiny checkpoint on the torch backend with a small cache (fast to allocate)."""
    options = {"model": str(checkpoint), "block_size": BLOCK_SIZE, "kernel_backend": "torch",
               "max_num_seqs": 8, "kv_cache_memory": 96 << 20, **changes}
    return EngineConfig(**options)


@pytest.fixture
def engine_options(tiny_checkpoint):
    """`engine_options(**changes)`: tiny_engine_options for the session's tiny checkpoint."""
    return lambda **changes: tiny_engine_options(tiny_checkpoint, **changes)


@pytest.fixture(scope="session")
def shared_engine(tiny_checkpoint) -> LLMEngine:
    return LLMEngine(tiny_engine_options(tiny_checkpoint))


@pytest.fixture
def engine(shared_engine: LLMEngine) -> Iterator[LLMEngine]:
    """The shared tiny engine; the test fails if it leaves anything held."""
    yield shared_engine
    pool = shared_engine.block_pool
    held_slots = (shared_engine.state_pool.num_slots - shared_engine.state_pool.num_free_slots
                  - shared_engine.snapshots.num_snapshots)
    assert pool.num_free_blocks == pool.num_blocks, "the test left KV blocks held"
    assert held_slots == 0, "the test left KDA state slots held"
    assert not shared_engine.has_unfinished_requests() and not shared_engine.requests
