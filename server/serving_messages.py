"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the same
renderer, engine run and K3 parser as /v1/chat/completions.

The request becomes a chat request (server/anthropic_messages.py), so prompt tokens are the
ones /v1/chat/completions renders for the same conversation; the turn is parsed by the same
`ChatChoiceState` and answered as Anthropic content blocks: `thinking` (K3's reasoning, with
a random `signature`: nothing here verifies one passed back), `text`, then one `tool_use` per
call. Stop reasons: stop -> `end_turn` (`stop_sequence` when one of `stop_sequences` matched),
length -> `max_tokens`, tool calls -> `tool_use`.

Streaming sends the documented events: `message_start` (usage with the input tokens), per block
`content_block_start`, `content_block_delta` (`thinking_delta` then a `signature_delta`,
`text_delta`, or one `input_json_delta` with the whole input: a call is sent when it closes,
CHAT_FORMAT.md §3.3), `content_block_stop`; then `message_delta` (stop reason, output tokens)
and `message_stop`. An error after the stream began is an `error` event.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from atomk31.engine.async_engine import AsyncEngine
from atomk31.engine.outputs import RequestOutput
from server.anthropic_messages import to_chat_options
from server.anthropic_protocol import (
    ContentBlock, CountTokensRequest, CountTokensResponse, MessagesRequest, MessagesResponse,
    MessagesUsage, TextBlock, ThinkingBlock, ToolUseBlock,
)
from server.chat_choice import ChatChoiceState
from server.chat_template import ChatTemplateError
from server.errors import APIError, anthropic_error_json, bad_request, param_named_by
from server.metrics import ServerMetrics
from server.output_parser import ToolCall
from server.protocol import ChatCompletionRequest
from server.serving_chat import ChatRequestRun, chat_prompt
from server.serving_common import answer, check_model, engine_error

logger = logging.getLogger(__name__)

ENDPOINT = "messages"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
TEMPLATE_FIELDS = frozenset({"messages", "system", "tools", "tool_choice"})


def event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the `input` object; arguments that are not a JSON object (a raw
    `json` child, §3.2) travel whole as {"arguments": text}."""
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"arguments": call.arguments}


class BlockStream:
    """The open content block of a stream and the events that open, extend and close it."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def text(self, kind: str, text: str) -> list[str]:
        """`text` for a `thinking` or `text` block, opening one when another kind is open."""
        events = [] if self.kind == kind else self.close() + self._start(
            ThinkingBlock(thinking="", signature="") if kind == "thinking" else TextBlock(text=""))
        delta = ({"type": "thinking_delta", "thinking": text} if kind == "thinking"
                 else {"type": "text_delta", "text": text})
        return events + [self._delta(delta)]

    def tool_use(self, call: ToolCall) -> list[str]:
        events = self.close() + self._start(ToolUseBlock(id=call.id, name=call.name, input={}))
        partial = json.dumps(tool_input(call), ensure_ascii=False)
        return events + [self._delta({"type": "input_json_delta", "partial_json": partial})]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        events = []
        if self.kind == "thinking":
            events.append(self._delta({"type": "signature_delta",
                                       "signature": uuid.uuid4().hex}))
        self.kind = None
        return events + [event("content_block_stop", {"type": "content_block_stop",
                                                      "index": self.index})]

    def _start(self, block: ContentBlock) -> list[str]:
        self.index += 1
        self.kind = block.type
        return [event("content_block_start", {"type": "content_block_start",
                                              "index": self.index,
                                              "content_block": block.model_dump()})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"type": "content_block_delta",
                                             "index": self.index, "delta": delta})


class MessagesRun:
    """One Messages request, driven by the chat run it became."""

    def __init__(self, body: MessagesRequest, run: ChatRequestRun) -> None:
        self.body = body
        self.run = run
        self.message_id = f"msg_{uuid.uuid4().hex}"
        run.endpoint = ENDPOINT

    @property
    def state(self) -> ChatChoiceState:
        return self.run.choices[0]

    def stop_reason(self) -> tuple[str | None, str | None]:
        reason = self.state.finish_reason
        matched = self.state.stop_filter.matched
        if reason == "stop" and matched is not None:
            return "stop_sequence", matched
        return STOP_REASONS.get(reason), None

    def usage(self) -> MessagesUsage:
        output = self.run.last_output
        return MessagesUsage(input_tokens=len(self.run.prompt_token_ids),
                             output_tokens=self.state.num_tokens,
                             cache_read_input_tokens=output.num_cached_tokens if output else 0)

    async def full_response(self, outputs: AsyncGenerator[RequestOutput, None]
                            ) -> MessagesResponse:
        finish_reason = None
        try:
            async for _ in self.run.updates(outputs):
                pass
            finish_reason = self.state.finish_reason
        finally:
            self.run.record_metrics(finish_reason)
        state = self.state
        content: list[ContentBlock] = []
        if state.reasoning_content:
            content.append(ThinkingBlock(thinking=state.reasoning_content,
                                         signature=uuid.uuid4().hex))
        if state.content:
            content.append(TextBlock(text=state.content))
        content += [ToolUseBlock(id=c.id, name=c.name, input=tool_input(c))
                    for c in state.tool_calls]
        reason, sequence = self.stop_reason()
        return MessagesResponse(id=self.message_id, model=self.run.model_name, content=content,
                                stop_reason=reason, stop_sequence=sequence, usage=self.usage())

    async def event_stream(self, outputs: AsyncGenerator[RequestOutput, None]
                           ) -> AsyncGenerator[str, None]:
        finish_reason = None
        blocks = BlockStream()
        start = MessagesResponse(id=self.message_id, model=self.run.model_name, content=[],
                                 stop_reason=None, usage=self.usage())
        yield event("message_start", {"type": "message_start", "message": start.model_dump()})
        try:
            async for updates in self.run.updates(outputs):
                update = updates[0]
                if update is None:
                    continue
                for kind, text in (("thinking", update.reasoning_content),
                                   ("text", update.content)):
                    for item in blocks.text(kind, text) if text else []:
                        yield item
                for call in update.tool_calls:
                    for item in blocks.tool_use(call):
                        yield item
            for item in blocks.close():
                yield item
            finish_reason = self.state.finish_reason
            reason, sequence = self.stop_reason()
            yield event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason,
                                                    "stop_sequence": sequence},
                                          "usage": {"output_tokens": self.state.num_tokens}})
            yield event("message_stop", {"type": "message_stop"})
        except Exception as exc:  # the stream has started: report in-band, as Anthropic does
            error = engine_error(exc)
            if error is None:
                logger.exception("messages stream %s failed", self.message_id)
                error = APIError(500, "internal server error while streaming; quote request "
                                 f"id {self.message_id} when reporting it")
            finish_reason = "error"
            yield event("error", anthropic_error_json(error.status, error.message))
        finally:
            self.run.record_metrics(finish_reason)


def chat_options(body: CountTokensRequest) -> dict[str, Any]:
    try:
        return to_chat_options(body)
    except ChatTemplateError as exc:
        raise bad_request(str(exc), param=param_named_by(str(exc), TEMPLATE_FIELDS)) from exc


async def create_message(body: MessagesRequest, request: Request, engine: AsyncEngine,
                         metrics: ServerMetrics, model_name: str) -> MessagesResponse | Response:
    check_model(body.model, model_name)
    options = chat_options(body)
    try:
        chat = ChatCompletionRequest.model_validate({
            "model": body.model, "messages": options["messages"], "tools": options["tools"],
            "tool_choice": options["tool_choice"],
            "reasoning_effort": options["reasoning_effort"], "max_tokens": body.max_tokens,
            "stop": body.stop_sequences or None, "temperature": body.temperature,
            "top_p": body.top_p, "top_k": body.top_k})
    except ValidationError as exc:   # e.g. a tool name the chat route refuses
        raise bad_request("; ".join(e["msg"].removeprefix("Value error, ")
                                    for e in exc.errors())) from exc
    prompt = await chat_prompt(chat.messages, engine, request.app.state.limits, body.max_tokens,
                               tools=chat.tools, tool_choice=chat.tool_choice,
                               reasoning_effort=chat.reasoning_effort)
    run = MessagesRun(body, ChatRequestRun(chat, engine, metrics, model_name, prompt))
    outputs = await run.run.start()
    return await answer(request, body.stream, lambda: run.event_stream(outputs),
                        lambda: run.full_response(outputs), f"message {run.message_id}")


async def count_tokens(body: CountTokensRequest, request: Request,
                       engine: AsyncEngine, model_name: str) -> CountTokensResponse:
    """The prompt's length, as /v1/messages would render it (no context check)."""
    check_model(body.model, model_name)
    options = chat_options(body)
    prompt = await chat_prompt(options.pop("messages"), engine, request.app.state.limits,
                               None, context_length=sys.maxsize, **options)
    return CountTokensResponse(input_tokens=len(prompt.token_ids))
