"""Request bodies: read after the API key check, bounded in size, parsed off the event loop.

FastAPI parses a declared body model before any dependency runs, so a request without a key
and with a broken body got a 400 instead of a 401, and a large body was read and parsed on the
event loop. The routes therefore take their body through `parsed_body(Model)`, a dependency
that runs after the router's key check: it refuses a body over the limit from its
Content-Length (or while reading it) with a 413, then decodes and validates it in a worker
thread. Problems are raised as FastAPI's `RequestValidationError`, in the shapes FastAPI
itself would give, so the error handlers answer them as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from server.errors import APIError
from server.limits import ServerLimits

ModelT = TypeVar("ModelT", bound=BaseModel)


def parsed_body(model: type[ModelT]) -> Callable[[Request], Awaitable[ModelT]]:
    """A dependency giving the request's JSON body validated as `model`."""

    async def dependency(request: Request) -> ModelT:
        limits: ServerLimits = request.app.state.limits
        raw = await read_body(request, limits.max_request_body_bytes)
        content_type = request.headers.get("content-type", "")
        return await asyncio.to_thread(validate_body, model, raw, content_type)

    return dependency


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes; a 413 as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit, is_partial=True)
        chunks.append(chunk)
    return b"".join(chunks)


def validate_body(model: type[ModelT], raw: bytes, content_type: str) -> ModelT:
    """Decode and validate (in a worker thread); raises RequestValidationError."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    media_type = content_type.split(";")[0].strip().lower()
    if media_type and not (media_type == "application/json" or media_type.endswith("+json")):
        raise RequestValidationError([{"type": "dict_type", "loc": ("body",),
                                       "msg": "Input should be a valid dictionary",
                                       "input": None}])
    try:
        value: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        position = getattr(exc, "pos", getattr(exc, "start", 0))
        detail = getattr(exc, "msg", getattr(exc, "reason", str(exc)))
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", position),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": detail}}]) from exc
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = [dict(e, loc=("body", *e["loc"])) for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from exc


def _too_large(size: int, limit: int, is_partial: bool = False) -> APIError:
    amount = f"more than {limit}" if is_partial else str(size)
    return APIError(413, f"the request body has {amount} bytes, over this server's limit of "
                    f"{limit} bytes; send a smaller request, or start the server with a larger "
                    f"{ServerLimits.flag('max_request_body_bytes')}", code="request_too_large")
