"""One error shape for every failure: OpenAI's `{"error": {"message", "type", "param", "code"}}`,
and on the Anthropic routes (/v1/messages...) Anthropic's `{"type": "error", "error": {"type",
"message"}}`, the same message in both.

Handlers cover our own `APIError`, FastAPI's `RequestValidationError` (answered 400, as OpenAI
does, not FastAPI's 422), Starlette's `HTTPException` (the router's own 404 and 405) and, last,
any other exception: a 500 whose traceback goes to the log under a fresh request id and whose
body carries only that id, never the exception's text (STYLE.md "In atomk31" #11).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.anthropic_protocol import AnthropicErrorDetail, AnthropicErrorResponse
from server.protocol import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

# What a status means to a client, as OpenAI's `type` field.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable_error",
}
FIELD_PATH = re.compile(r"([a-z_]+)(\[\d+\]|\.[a-z_]+)*")
UNION_TAG_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
MAX_VALIDATION_PROBLEMS = 3   # a union mismatch reports one problem per member; show a few
MAX_ECHOED_CHARS = 100        # of a client's value quoted back in an error message
ANTHROPIC_PATH_PREFIX = "/v1/messages"
ANTHROPIC_ERROR_TYPES = {     # Anthropic's `error.type` per status (its API's errors page)
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class APIError(Exception):
    """An error the server answers with `status` and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "server_error")


def quoted(value: str, limit: int = MAX_ECHOED_CHARS) -> str:
    """`repr(value)`, cut to about `limit` characters: a client's value echoed in a message
    (a 1 MB model name must not come back as a 1 MB error)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def param_named_by(message: str, fields: frozenset[str]) -> str | None:
    """The field path a message starts with (`messages[0].role must be ...` ->
    `messages[0].role`) when its first name is one of `fields`; None otherwise. The chat
    renderer's messages all start with the path of the value at fault."""
    match = FIELD_PATH.match(message)
    if match is None or match.group(1) not in fields:
        return None
    return match.group(0)


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   error_type: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(
        message=message, type=error_type or ERROR_TYPES.get(status, "server_error"),
        param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def error_json(error: APIError) -> dict[str, Any]:
    """The body of `error`, for an error event inside an already started stream."""
    return ErrorResponse(error=ErrorDetail(message=error.message, type=error.error_type,
                                           param=error.param, code=error.code)).model_dump()


def is_anthropic_route(request: Request) -> bool:
    """The Anthropic Messages routes answer errors in Anthropic's shape."""
    return request.url.path.startswith(ANTHROPIC_PATH_PREFIX)


def anthropic_error_json(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`, the type from the status."""
    return AnthropicErrorResponse(error=AnthropicErrorDetail(
        type=ANTHROPIC_ERROR_TYPES.get(status, "api_error"), message=message)).model_dump()


def _respond(request: Request, status: int, message: str, param: str | None = None,
             code: str | None = None, error_type: str | None = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    if is_anthropic_route(request):
        return JSONResponse(anthropic_error_json(status, message), status_code=status,
                            headers=headers)
    return error_response(status, message, param, code, error_type, headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(Exception, _unhandled_error)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return _respond(request, exc.status, exc.message, exc.param, exc.code, exc.error_type,
                    headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = list(exc.errors())
    first = problems[0] if problems else {}
    # a JSON syntax error's location is a character offset, not a field
    param = None if first.get("type") == "json_invalid" else _param_name(first.get("loc", ()))
    message = "; ".join(_describe(p) for p in problems[:MAX_VALIDATION_PROBLEMS])
    if len(problems) > MAX_VALIDATION_PROBLEMS:
        message += f"; and {len(problems) - MAX_VALIDATION_PROBLEMS} more"
    return _respond(request, 400, message or "invalid request body", param=param,
                    code=first.get("type"))


async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"no route {request.method} {quoted(request.url.path)}; see /docs for the API"
        code = "not_found"
    elif exc.status_code == 405:
        message = f"{quoted(request.url.path)} does not accept {request.method}"
        code = "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    return _respond(request, exc.status_code, message, code=code,
                    headers=getattr(exc, "headers", None))


async def _unhandled_error(request: Request, exc: Exception) -> JSONResponse:
    request_id = f"err-{uuid.uuid4().hex}"
    logger.error("request %s (%s %s) failed", request_id, request.method, request.url.path,
                 exc_info=exc)
    return _respond(request, 500, f"internal server error; quote request id {request_id} "
                    "when reporting it", code="internal_error", error_type="server_error")


def _param_name(loc: Sequence[Any]) -> str | None:
    """`("body", "messages", 0, "role")` -> `messages[0].role`; pydantic's union member tags
    (`str`, `list[int]`, `constrained-str`) are dropped."""
    name = ""
    for part in loc:
        if part == "body" and not name:
            continue
        if isinstance(part, int):
            name += f"[{part}]"
        elif isinstance(part, str) and not _is_union_tag(part):
            name += f".{part}" if name else part
    return name or None


def _is_union_tag(part: str) -> bool:
    return part in UNION_TAG_NAMES or any(c in part for c in "[(,-")


def _describe(problem: dict[str, Any]) -> str:
    kind = problem.get("type")
    param = _param_name(problem.get("loc", ()))
    if kind == "json_invalid":
        detail = problem.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail}); send one JSON object"
    if kind in ("model_attributes_type", "dict_type") and param is None:
        return ("the request body must be a JSON object; send one with "
                "Content-Type: application/json")
    message = str(problem.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    if param and message.startswith(param):   # our own messages already name the field
        return message
    if kind == "missing":
        return (f"{param} is required" if param
                else "the request body is missing; send a JSON object")
    return f"{param}: {message}" if param else message
