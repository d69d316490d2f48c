"""POST /v1/chat/completions: render the chat (server/chat_template.py), generate, parse the turn
(server/output_parser.py) and answer in OpenAI's shape, whole or as server-sent events.

Streaming (CHAT_FORMAT.md §3.3): a first chunk per choice carries the role; then each engine
step's new reasoning text goes out as `delta.reasoning_content`, response text as
`delta.content`, and each tool call whole, once, when it closes; the last chunk of a choice
carries its finish reason; with `stream_options.include_usage` a final chunk with no choices
carries the usage. A client that leaves mid-stream cancels the generator, which aborts the
engine request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from atomk31.engine.async_engine import AsyncEngine
from atomk31.engine.outputs import RequestOutput, TokenLogprobs
from server.chat_choice import ChatChoiceState, ChoiceUpdate
from server.chat_prompt import ChatPrompt, build_chat_prompt, check_chat_size, \
    count_content_parts, max_prompt_tokens
from server.chat_template import ChatTemplateError
from server.errors import APIError, bad_request, error_json, param_named_by
from server.limits import ServerLimits
from server.logprobs import clamp_logprob, token_string
from server.metrics import ServerMetrics
from server.output_parser import ChatOutputParser, ToolCall
from server.protocol import (
    ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatMessage, ChatStreamChoice, FunctionCall, PromptTokensDetails,
    StreamedToolCall, TokenLogprob, TopLogprob, Usage,
)
from server.protocol import ToolCall as ToolCallOut
from server.serving_common import (
    SSE_DONE, answer, check_model, engine_error, max_model_len, outputs_from,
    resolve_max_tokens, sampling_params, sse, start_streams,
)

logger = logging.getLogger(__name__)

ENDPOINT = "chat"
# request fields the renderer checks; its error messages start with the path at fault
TEMPLATE_FIELDS = frozenset({"messages", "tools", "tool_choice", "reasoning_effort",
                             "response_format"})


class ChatRequestRun:
    """One chat request from rendered prompt to answer."""

    def __init__(self, body: ChatCompletionRequest, engine: AsyncEngine, metrics: ServerMetrics,
                 model_name: str, prompt: ChatPrompt) -> None:
        self.body = body
        self.engine = engine
        self.metrics = metrics
        self.model_name = model_name
        self.request_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.endpoint = ENDPOINT   # the metrics label
        self.created = int(time.time())
        self.prompt_token_ids = prompt.token_ids
        max_tokens = resolve_max_tokens(len(self.prompt_token_ids), body.max_output_tokens,
                                        max_model_len(engine), "messages")
        # Stop strings are matched on the response channel here, not by the engine (§4).
        self.params = sampling_params(body, max_tokens, stop=[], logprobs=body.num_logprobs)
        self.choices = [
            ChatChoiceState(i, ChatOutputParser(engine.tokenizer, prompt.starts_in_reasoning,
                                                keep_tool_calls=body.tool_choice != "none"),
                            body.stop_strings, body.min_tokens)
            for i in range(body.n)]
        self.last_output: RequestOutput | None = None

    # ---- driving the engine ---------------------------------------------------------------------
    async def start(self) -> AsyncGenerator[RequestOutput, None]:
        """Submit the request; errors before the first token become HTTP errors."""
        [(first, stream)] = await start_streams(
            self.engine, [(self.prompt_token_ids, self.params, self.request_id)])
        return outputs_from(first, stream)

    async def updates(self, outputs: AsyncGenerator[RequestOutput, None]
                      ) -> AsyncGenerator[list[ChoiceUpdate | None], None]:
        """Per engine step, each choice's update; ends when every choice has finished (leaving
        early aborts the engine request)."""
        async with aclosing(outputs):
            async for output in outputs:
                self.last_output = output
                yield [state.advance(c) for state, c in zip(self.choices, output.outputs)]
                if all(state.is_finished for state in self.choices):
                    return

    def record_metrics(self, finish_reason: str | None) -> None:
        """finish_reason: choice 0's, "error", or None for a request cut off (client gone)."""
        self.metrics.record(self.endpoint, finish_reason or "abort", self.last_output,
                            sum(state.num_tokens for state in self.choices))

    def usage(self) -> Usage:
        num_prompt = len(self.prompt_token_ids)
        num_generated = sum(state.num_tokens for state in self.choices)
        cached = self.last_output.num_cached_tokens if self.last_output is not None else 0
        return Usage(prompt_tokens=num_prompt, completion_tokens=num_generated,
                     total_tokens=num_prompt + num_generated,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    # ---- whole answer ---------------------------------------------------------------------------
    async def full_response(self, outputs: AsyncGenerator[RequestOutput, None]
                            ) -> ChatCompletionResponse:
        finish_reason = None
        try:
            async for _ in self.updates(outputs):
                pass
            finish_reason = self.choices[0].finish_reason
        finally:
            self.record_metrics(finish_reason)
        choices = [ChatChoice(
            index=state.index,
            message=ChatMessage(content=state.message_content(),
                                reasoning_content=state.reasoning_content or None,
                                tool_calls=[_tool_call(c) for c in state.tool_calls] or None),
            logprobs=self._logprobs(state.logprobs) if self.body.logprobs else None,
            finish_reason=state.finish_reason) for state in self.choices]
        return ChatCompletionResponse(id=self.request_id, created=self.created,
                                      model=self.model_name, choices=choices, usage=self.usage())

    # ---- stream ---------------------------------------------------------------------------------
    async def event_stream(self, outputs: AsyncGenerator[RequestOutput, None]
                           ) -> AsyncGenerator[str, None]:
        finish_reason = None
        num_calls = [0] * len(self.choices)
        try:
            for state in self.choices:
                yield self._chunk([ChatStreamChoice(index=state.index, delta=ChatDelta(
                    role="assistant", content=""))])
            async for updates in self.updates(outputs):
                choices = []
                for state, update in zip(self.choices, updates):
                    if update is None:
                        continue
                    if update.has_delta or update.finish_reason or (
                            self.body.logprobs and update.logprobs):
                        choices.append(self._stream_choice(state.index, update,
                                                           num_calls[state.index]))
                        num_calls[state.index] += len(update.tool_calls)
                if choices:
                    yield self._chunk(choices)
            if self.body.include_usage_in_stream:
                yield self._chunk([], usage=self.usage())
            finish_reason = self.choices[0].finish_reason
        except Exception as exc:  # the stream has started: report in-band, as OpenAI does
            error = engine_error(exc)
            if error is None:
                logger.exception("chat stream %s failed", self.request_id)
                error = APIError(500, "internal server error while streaming; quote request "
                                 f"id {self.request_id} when reporting it", code="internal_error",
                                 error_type="server_error")
            finish_reason = "error"
            yield sse(error_json(error))
        finally:
            self.record_metrics(finish_reason)
        yield SSE_DONE

    def _stream_choice(self, index: int, update: ChoiceUpdate,
                       num_calls_sent: int) -> ChatStreamChoice:
        delta = ChatDelta(
            reasoning_content=update.reasoning_content or None, content=update.content or None,
            tool_calls=[StreamedToolCall(index=num_calls_sent + j, id=c.id,
                                         function=FunctionCall(name=c.name, arguments=c.arguments))
                        for j, c in enumerate(update.tool_calls)] or None)
        logprobs = (self._logprobs(update.logprobs)
                    if self.body.logprobs and update.logprobs else None)
        return ChatStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                finish_reason=update.finish_reason)

    def _chunk(self, choices: list[ChatStreamChoice], usage: Usage | None = None) -> str:
        chunk = ChatCompletionChunk(id=self.request_id, created=self.created,
                                    model=self.model_name, choices=choices, usage=usage)
        payload = chunk.model_dump(mode="json")
        for choice in payload["choices"]:   # a delta carries only what changed
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        if not self.body.include_usage_in_stream:
            del payload["usage"]
        return sse(payload)

    def _logprobs(self, entries: list[TokenLogprobs]) -> ChatLogprobs:
        tokenizer = self.engine.tokenizer
        content = []
        for entry in entries:
            content.append(TokenLogprob(
                token=token_string(tokenizer, entry.token_id),
                logprob=clamp_logprob(entry.logprob),
                bytes=list(tokenizer.token_bytes(entry.token_id)),
                top_logprobs=[TopLogprob(token=token_string(tokenizer, t),
                                         logprob=clamp_logprob(lp),
                                         bytes=list(tokenizer.token_bytes(t)))
                              for t, lp in zip(entry.top_token_ids, entry.top_logprobs)]))
        return ChatLogprobs(content=content)


def _tool_call(call: ToolCall) -> ToolCallOut:
    return ToolCallOut(id=call.id, function=FunctionCall(name=call.name,
                                                         arguments=call.arguments))


async def chat_prompt(messages: list[dict], engine: AsyncEngine, limits: ServerLimits,
                      max_tokens: int | None, context_length: int | None = None,
                      **render_options: Any) -> ChatPrompt:
    """The request's prompt, bounded, rendered and tokenized in a worker thread (a large
    request must not stall the event loop: other requests, /health). `context_length`: the
    model's unless given (token counting checks none)."""
    context_length = context_length or max_model_len(engine)

    def build() -> ChatPrompt:
        check_chat_size(messages, limits, count_content_parts(messages))
        return build_chat_prompt(messages, engine.tokenizer,
                                 max_prompt_tokens(context_length, max_tokens), context_length,
                                 **render_options)

    try:
        return await asyncio.to_thread(build)
    except ChatTemplateError as exc:
        raise bad_request(str(exc), param=param_named_by(str(exc), TEMPLATE_FIELDS)) from exc


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 engine: AsyncEngine, metrics: ServerMetrics,
                                 model_name: str) -> ChatCompletionResponse | Response:
    check_model(body.model, model_name)
    prompt = await chat_prompt(body.messages, engine, request.app.state.limits,
                               body.max_output_tokens, tools=body.tools,
                               tool_choice=body.tool_choice,
                               reasoning_effort=body.effective_reasoning_effort,
                               response_format=body.response_format)
    run = ChatRequestRun(body, engine, metrics, model_name, prompt)
    outputs = await run.start()
    return await answer(request, body.stream, lambda: run.event_stream(outputs),
                        lambda: run.full_response(outputs), f"chat request {run.request_id}")
