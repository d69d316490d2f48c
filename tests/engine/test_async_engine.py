"""AsyncEngine: streams per request, errors before the first output, abort frees everything."""

import asyncio
import time

import pytest

from atomk31 import SamplingParams
from atomk31.config import EngineConfig
from atomk31.engine.async_engine import AsyncEngine, EngineBusyError


@pytest.fixture
def engine(tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), block_size=16,
                                      kernel_backend="torch", max_model_len=512,
                                      max_num_waiting=4))
    yield engine
    engine.shutdown()


def wait_until_idle(engine: AsyncEngine, timeout_s: float = 60.0) -> None:
    """Aborts land between steps, and a step may take seconds on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == stats.num_waiting == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine.stats()}")


def test_concurrent_streams_are_cumulative_and_reproducible(engine, pools_free):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[1, 2, 3], list(range(40, 80)), [7] * 20]

    async def collect(prompt):
        seen = []
        async for out in engine.generate(prompt, params):
            seen.append(list(out.outputs[0].token_ids))
        return seen

    async def main():
        return await asyncio.gather(*(collect(p) for p in prompts))

    streams = asyncio.run(main())
    for stream in streams:
        # cumulative outputs: each step extends the previous one by one token
        assert [len(s) for s in stream] == list(range(1, 7))
        assert all(a == b[: len(a)] for a, b in zip(stream, stream[1:]))
    wait_until_idle(engine)
    finals = [s[-1] for s in streams]
    again = asyncio.run(main())   # greedy: the same tokens whatever ran beside them
    assert [s[-1] for s in again] == finals
    wait_until_idle(engine)
    pools_free(engine)


def test_prompt_over_context_length_raises_before_output(engine):
    async def main():
        async for _ in engine.generate([1] * 600, SamplingParams(max_tokens=4)):
            pass

    with pytest.raises(ValueError, match="over the context length of 512"):
        asyncio.run(main())


def test_leaving_a_stream_early_aborts_and_frees(engine, pools_free):
    async def main():
        async for out in engine.generate(list(range(100)), SamplingParams(max_tokens=200,
                                                                           ignore_eos=True)):
            if len(out.outputs[0].token_ids) == 2:
                break

    asyncio.run(main())
    wait_until_idle(engine)
    pools_free(engine)


def test_full_waiting_queue_is_busy(tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), block_size=16,
                                      kernel_backend="torch", max_num_seqs=1,
                                      max_num_waiting=1))
    params = SamplingParams(max_tokens=30, ignore_eos=True)

    async def consume(prompt):
        async for _ in engine.generate(prompt, params):
            pass

    async def main():
        return await asyncio.gather(*(consume([i + 1] * 50) for i in range(4)),
                                    return_exceptions=True)

    try:
        results = asyncio.run(main())
        assert any(isinstance(r, EngineBusyError) for r in results), results
    finally:
        engine.shutdown()


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine, pools_free):
    """A step that raises must not kill the engine thread or leak blocks (issue #4 review)."""
    original = engine.engine.step
    calls = {"n": 0}

    def step_that_fails_once():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return original()

    engine.engine.step = step_that_fails_once
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)

    async def run(prompt):
        return [out async for out in engine.generate(prompt, params)]

    with pytest.raises(RuntimeError, match="the engine step failed"):
        asyncio.run(run([1, 2, 3]))
    wait_until_idle(engine)
    pools_free(engine)
    assert engine.is_alive
    outputs = asyncio.run(run([1, 2, 3]))            # the next request is served
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 5


def test_submitted_requests_are_prefilled_in_one_step(engine, pools_free):
    """Issue 19: the prompts of one request (a completions list) go to the engine together,
    so that one step prefills them all."""
    steps = []
    original = engine.engine.step

    def step():
        steps.append(len(engine.engine.scheduler.waiting))
        return original()

    engine.engine.step = step
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)

    async def main():
        streams = await engine.submit([([i + 1] * 10, params, None) for i in range(6)])
        return [[out async for out in stream] for stream in streams]

    results = asyncio.run(main())
    assert all(r[-1].finished and len(r[-1].outputs[0].token_ids) == 3 for r in results)
    assert steps[0] == 6, steps   # the first step found all six waiting
    wait_until_idle(engine)
    pools_free(engine)


def test_a_refused_batch_adds_none_of_its_requests(engine, pools_free):
    params = SamplingParams(max_tokens=4)

    async def main():
        await engine.submit([([1, 2, 3], params, "ok"), ([1] * 600, params, "too-long")])

    with pytest.raises(ValueError, match="over the context length of 512"):
        asyncio.run(main())
    wait_until_idle(engine)
    pools_free(engine)


def test_closing_or_cancelling_a_stream_aborts_its_request(engine, pools_free):
    """Also: an output published after the caller's event loop closed must not kill the
    engine thread (it did: `call_soon_threadsafe` raised in the engine loop)."""
    params = SamplingParams(max_tokens=300, ignore_eos=True)

    async def main():
        first, second = await engine.submit([([5] * 30, params, None), ([6] * 30, params, None)])
        await anext(first)
        await first.aclose()
        waiting = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)

    asyncio.run(main())
    wait_until_idle(engine)
    pools_free(engine)
    assert engine.is_alive
