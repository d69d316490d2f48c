"""What the chat and completions endpoints share: the model check, sampling parameters, the
context-length check, engine errors as HTTP errors, server-sent events, and watching for a
client that leaves before its (non-streamed) answer is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from atomk31.engine.async_engine import AsyncEngine, EngineBusyError, EngineDeadError
from atomk31.engine.outputs import RequestOutput
from atomk31.engine.sampling_params import SamplingParams
from server.errors import APIError, bad_request, quoted
from server.protocol import SamplingRequest

logger = logging.getLogger(__name__)

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


def check_model(requested: str, served_model_name: str) -> None:
    if requested != served_model_name:
        raise APIError(404, f"the model {quoted(requested)} does not exist; this server serves "
                       f"{served_model_name!r} (see GET /v1/models)", param="model",
                       code="model_not_found")


def max_model_len(engine: AsyncEngine) -> int:
    return engine.engine.config.max_model_len


def resolve_max_tokens(num_prompt_tokens: int, max_tokens: int | None, context_length: int,
                       prompt_param: str) -> int:
    """The request's output budget, checked against the context length (both numbers are in
    the message). None means "the rest of the context", as in vLLM."""
    if max_tokens is None:
        if num_prompt_tokens >= context_length:
            raise bad_request(f"the prompt has {num_prompt_tokens} tokens, which leaves no room "
                              f"to generate within this model's context length of "
                              f"{context_length} tokens; shorten the {prompt_param}",
                              param=prompt_param, code="context_length_exceeded")
        return context_length - num_prompt_tokens
    total = num_prompt_tokens + max_tokens
    if total > context_length:
        raise bad_request(f"the prompt has {num_prompt_tokens} tokens and max_tokens asks for "
                          f"{max_tokens} more ({total} in all), over this model's context "
                          f"length of {context_length} tokens; shorten the {prompt_param} or "
                          "lower max_tokens", param=prompt_param, code="context_length_exceeded")
    return max_tokens


def sampling_params(body: SamplingRequest, max_tokens: int, stop: list[str],
                    logprobs: int | None) -> SamplingParams:
    """SamplingParams for a request; OpenAI's null means the default (temperature 1, top_p 1)."""
    try:
        return SamplingParams(
            n=body.n, temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k is None else body.top_k,
            min_p=0.0 if body.min_p is None else body.min_p, seed=body.seed,
            max_tokens=max_tokens, min_tokens=body.min_tokens, stop=stop,
            stop_token_ids=body.stop_token_ids, ignore_eos=body.ignore_eos, logprobs=logprobs)
    except ValueError as exc:
        raise bad_request(str(exc)) from exc


def engine_error(exc: Exception) -> APIError | None:
    """The HTTP error for an exception the engine raised, None if it is not one of ours."""
    if isinstance(exc, EngineBusyError):
        return APIError(503, f"the server is busy: {exc}", code="queue_full")
    if isinstance(exc, EngineDeadError):
        return APIError(503, "the engine has stopped after an internal error; the server must "
                        "be restarted", code="engine_dead")
    if isinstance(exc, ValueError):   # raised before the first output: a bad prompt
        return bad_request(str(exc))
    return None


async def start_streams(engine: AsyncEngine,
                        requests: list[tuple[list[int], SamplingParams, str]]
                        ) -> list[tuple[RequestOutput, AsyncIterator[RequestOutput]]]:
    """Submit requests together (one engine step can batch them) and wait for each one's
    first output, so that an error (bad prompt, busy engine) becomes the HTTP status instead
    of an event inside a 200 stream. -> (first output, the rest) per request."""
    try:
        streams = await engine.submit(requests)
    except Exception as exc:
        raise _as_http_error(exc) from exc
    firsts = [asyncio.ensure_future(anext(stream)) for stream in streams]
    try:
        await asyncio.gather(*firsts)
    except BaseException as exc:
        for task in firsts:   # a cancelled wait aborts its request (RequestStream)
            task.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
        if isinstance(exc, StopAsyncIteration):
            raise RuntimeError("the engine ended a request without any output") from exc
        raise _as_http_error(exc) if isinstance(exc, Exception) else exc from exc
    return [(task.result(), stream) for task, stream in zip(firsts, streams)]


def _as_http_error(exc: Exception) -> Exception:
    error = engine_error(exc)
    return exc if error is None else error


async def outputs_from(first: RequestOutput, stream: AsyncIterator[RequestOutput]
                       ) -> AsyncGenerator[RequestOutput, None]:
    """`first`, then the rest of `stream`; closing this closes `stream` (aborting its request)."""
    async with aclosing(stream):
        yield first
        async for output in stream:
            yield output


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


async def answer(request: Request, is_stream: bool,
                 events: Callable[[], AsyncGenerator[str, None]],
                 whole: Callable[[], Awaitable[T]], what: str) -> T | Response:
    """The response of a started request: `events()` as server-sent events, or `whole()`
    awaited (a client that leaves first aborts it: 499). `what` names it in the log."""
    if is_stream:
        return StreamingResponse(events(), media_type="text/event-stream")
    try:
        return await run_until_disconnected(request, whole())
    except ClientDisconnected:
        logger.info("client left before %s finished; aborted it", what)
        return Response(status_code=499)


async def run_until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it (which aborts its engine
    request and frees its blocks) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def merge_streams(streams: list[AsyncGenerator[RequestOutput, None]]
                        ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Interleave several requests' outputs as `(stream index, output)` in arrival order.
    Leaving early cancels and closes every stream (aborting their requests)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((i, output))
        except Exception as exc:   # handed to the consumer, which raises it
            queue.put_nowait((i, exc))
        queue.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        num_running = len(tasks)
        while num_running:
            i, item = await queue.get()
            if item is done:
                num_running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
