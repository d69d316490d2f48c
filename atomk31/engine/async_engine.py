"""AsyncEngine: the LLMEngine behind an asyncio interface, for the server.

The engine runs in one background thread that owns it completely: requests to add or abort
arrive through a command queue and are applied between steps, so no engine state is touched
from two threads. Each request's outputs are handed to its asyncio queue with
`call_soon_threadsafe`. Leaving a `generate` stream early (a client that disconnects, a
cancelled task) aborts the request, which frees its blocks and state slots.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from atomk31.config import EngineConfig
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.outputs import RequestOutput
from atomk31.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineBusyError(RuntimeError):
    """The waiting queue is full; the server answers 503."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an error; no request can be served."""


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    state_usage: float
    prefix_hit_rate: float
    num_free_blocks: int
    num_blocks: int
    num_free_state_slots: int


class AsyncEngine:
    def __init__(self, options: EngineConfig | None = None, engine: LLMEngine | None = None):
        self.engine = engine if engine is not None else LLMEngine(options)
        self.max_num_waiting = self.engine.config.options.max_num_waiting
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="atomk31-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def is_alive(self) -> bool:
        """The engine thread runs (it stops only on shutdown or an error outside a step)."""
        return self._thread.is_alive() and self._error is None

    # -- the asyncio side ---------------------------------------------------------------
    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs (cumulative), the last one with `finished=True`.

        Raises the engine's ValueError (e.g. a prompt over the context length) before the
        first output, and EngineBusyError when the waiting queue is full."""
        [stream] = await self.submit([(prompt, params, request_id)])
        async with aclosing(stream):
            async for out in stream:
                yield out

    async def submit(self, requests: list[tuple[str | list[int], SamplingParams, str | None]]
                     ) -> list[RequestStream]:
        """Add `(prompt, params, request_id or None)` requests in one command, so that the
        engine admits them together and one step batches them; -> one stream per request.

        Raises (and adds none) when one is refused: the engine's ValueError for a bad prompt,
        EngineBusyError when the waiting queue is full. Close a stream to abort its request."""
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped after an error: {self._error!r}")
        loop = asyncio.get_running_loop()
        named = [(prompt, params, rid if rid is not None else f"req-{next(self._ids)}")
                 for prompt, params, rid in requests]
        streams = [RequestStream(self, rid) for _, _, rid in named]
        for stream in streams:
            self._streams[stream.request_id] = (loop, stream.outputs)
        added = loop.create_future()
        self._commands.put(("add", named, loop, added))
        try:
            await added
        except BaseException:
            for stream in streams:
                self._streams.pop(stream.request_id, None)
            if not added.done() or added.cancelled():   # cancelled: they may be added
                for stream in streams:
                    self.abort(stream.request_id)
            raise
        return streams

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stats(self) -> EngineStats:
        e = self.engine
        sched = e.scheduler
        return EngineStats(
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            kv_usage=e.block_pool.usage(), state_usage=e.state_pool.usage(),
            prefix_hit_rate=e.block_pool.hit_rate(), num_free_blocks=e.block_pool.num_free_blocks,
            num_blocks=e.block_pool.num_blocks, num_free_state_slots=e.state_pool.num_free_slots)

    def shutdown(self) -> None:
        self._stopped.set()
        self._commands.put(("stop",))
        self._thread.join(timeout=30)

    # -- the engine thread --------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._apply_commands(block=not self.engine.has_unfinished_requests())
                if self.engine.has_unfinished_requests():
                    self._step()
        except BaseException as exc:  # the thread must not die silently
            logger.exception("engine loop failed")
            self._error = exc
            for request_id in list(self._streams):
                self._publish(request_id, EngineDeadError(f"the engine stopped: {exc!r}"))

    def _step(self) -> None:
        """One engine step. A step that raises fails the requests it was running (their
        streams get the error, their blocks and slots are freed) and the engine goes on."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            logger.exception("engine step failed; failing the requests in flight")
            for request_id in list(self.engine.requests):
                self.engine.abort_request(request_id)
                self._publish(request_id, RuntimeError(f"the engine step failed: {exc!r}"))
            return
        for out in outputs:
            self._publish(out.request_id, out)

    def _apply_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(block=block, timeout=0.5 if block else None)
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "abort":
            self.engine.abort_request(command[1])
        elif kind == "add":
            _, requests, loop, added = command
            try:
                if len(self.engine.scheduler.waiting) >= self.max_num_waiting:
                    raise EngineBusyError(f"the waiting queue is full ({self.max_num_waiting} "
                                          "requests); retry later")
                self.engine.add_requests(requests)
            except Exception as exc:  # reported to the caller, the engine goes on
                _call_soon(loop, _settle, added, exc)
            else:
                _call_soon(loop, _settle, added, None)

    def _publish(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            loop, outputs = stream
            _call_soon(loop, outputs.put_nowait, item)


class RequestStream:
    """One submitted request's outputs, as an async iterator (cumulative outputs, the last one
    `finished`). Leaving early, by `aclose()` or by cancelling a pending `__anext__`, aborts
    the request, which frees its blocks and state slots."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.engine = engine
        self.request_id = request_id
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.is_done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.is_done:
            raise StopAsyncIteration
        try:
            out = await self.outputs.get()
        except BaseException:   # cancelled while waiting: nobody will read the rest
            await self.aclose()
            raise
        if isinstance(out, BaseException):
            self._end()
            raise out
        if out.finished:
            self._end()
        return out

    async def aclose(self) -> None:
        if not self.is_done:
            self._end()
            self.engine.abort(self.request_id)

    def _end(self) -> None:
        self.is_done = True
        self.engine._streams.pop(self.request_id, None)


def _call_soon(loop: asyncio.AbstractEventLoop, *call) -> None:
    """`loop.call_soon_threadsafe(*call)`, nothing once the loop has closed (a caller that
    left; the engine thread must not die of it)."""
    try:
        loop.call_soon_threadsafe(*call)
    except RuntimeError:
        pass


def _settle(future: asyncio.Future, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
