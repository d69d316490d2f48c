"""POST /v1/completions: raw text (or token ids) in, continuation out, OpenAI's legacy shape.

Each prompt of a request is one engine request with `n` completions; choice `i * n + j` is
completion j of prompt i. Stop strings are applied by the engine (on the output text). When
streaming with stop strings, the last `len(longest stop) - 1` characters are held back until
the choice ends, because the engine may still cut them off (a stop string can span tokens).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from atomk31.engine.async_engine import AsyncEngine
from atomk31.engine.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from server.errors import APIError, error_json
from server.metrics import ServerMetrics
from server.protocol import (
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    PromptTokensDetails, Usage,
)
from server.serving_common import (
    SSE_DONE, ClientDisconnected, check_model, clamp_logprob, engine_error, first_output,
    max_model_len, merge_streams, outputs_from, resolve_max_tokens, run_until_disconnected,
    sampling_params, sse, token_text, top_alternatives,
)

logger = logging.getLogger(__name__)

ENDPOINT = "completions"


class CompletionChoiceState:
    """What has been sent of one choice (streaming) and its logprobs bookkeeping."""

    def __init__(self, index: int, echo_text: str) -> None:
        self.index = index
        self.echo_text = echo_text
        self.num_chars_sent = 0
        self.num_tokens_sent = 0
        self.is_echo_sent = False
        self.text_offset = len(echo_text)
        self.finish_reason: str | None = None


class CompletionRequestRun:
    """One completions request: its prompts, engine streams and answer."""

    def __init__(self, body: CompletionRequest, engine: AsyncEngine, metrics: ServerMetrics,
                 model_name: str) -> None:
        self.body = body
        self.engine = engine
        self.metrics = metrics
        self.model_name = model_name
        self.request_id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        tokenizer = engine.tokenizer
        context_length = max_model_len(engine)
        self.prompt_token_ids = [tokenizer.encode(p) if isinstance(p, str) else p
                                 for p in body.prompts]
        self.params = []
        for ids in self.prompt_token_ids:
            if not ids:
                raise APIError(400, "a prompt encodes to no tokens; give at least one character",
                               param="prompt")
            max_tokens = resolve_max_tokens(len(ids), body.max_tokens, context_length, "prompt")
            self.params.append(sampling_params(body, max_tokens, stop=body.stop_strings,
                                               logprobs=body.logprobs))
        self.hold_back = max((len(s) for s in body.stop_strings), default=1) - 1
        self.choices = [
            CompletionChoiceState(i * body.n + j,
                                  tokenizer.decode(ids) if body.echo else "")
            for i, ids in enumerate(self.prompt_token_ids) for j in range(body.n)]
        self.last_outputs: list[RequestOutput | None] = [None] * len(self.prompt_token_ids)

    async def start(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """Submit every prompt; errors before their first tokens become HTTP errors."""
        started: list[AsyncGenerator[RequestOutput, None]] = []
        try:
            for i, (ids, params) in enumerate(zip(self.prompt_token_ids, self.params)):
                stream = self.engine.generate(ids, params, f"{self.request_id}-{i}")
                started.append(outputs_from(await first_output(stream), stream))
        except BaseException:
            for stream in started:
                await stream.aclose()
            raise
        return merge_streams(started)

    def record_metrics(self, is_complete: bool) -> None:
        for i, output in enumerate(self.last_outputs):
            n = self.body.n
            choices = self.choices[i * n:(i + 1) * n]
            reason = choices[0].finish_reason if is_complete else None
            num_tokens = sum(len(c.token_ids) for c in output.outputs) if output else 0
            self.metrics.record(ENDPOINT, reason or "abort", output, num_tokens)

    def usage(self) -> Usage:
        num_prompt = sum(len(ids) for ids in self.prompt_token_ids)
        outputs = [o for o in self.last_outputs if o is not None]
        num_generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return Usage(prompt_tokens=num_prompt, completion_tokens=num_generated,
                     total_tokens=num_prompt + num_generated,
                     prompt_tokens_details=PromptTokensDetails(
                         cached_tokens=sum(o.num_cached_tokens for o in outputs)))

    # ---- whole answer ---------------------------------------------------------------------------
    async def full_response(self, outputs: AsyncGenerator[tuple[int, RequestOutput], None]
                            ) -> CompletionResponse:
        is_complete = False
        try:
            async for i, output in outputs:
                self.last_outputs[i] = output
            is_complete = True
        finally:
            for state, completion in self._completions():
                state.finish_reason = completion.finish_reason
            self.record_metrics(is_complete)
        choices = [CompletionChoice(
            index=state.index, text=state.echo_text + completion.text,
            logprobs=self._logprobs(state, completion.logprobs or [])
            if self.body.logprobs is not None else None,
            finish_reason=completion.finish_reason)
            for state, completion in self._completions()]
        return CompletionResponse(id=self.request_id, created=self.created,
                                  model=self.model_name, choices=choices, usage=self.usage())

    def _completions(self) -> list[tuple[CompletionChoiceState, CompletionOutput]]:
        n = self.body.n
        return [(self.choices[i * n + c.index], c)
                for i, output in enumerate(self.last_outputs) if output is not None
                for c in output.outputs]

    # ---- stream ---------------------------------------------------------------------------------
    async def event_stream(self, outputs: AsyncGenerator[tuple[int, RequestOutput], None]
                           ) -> AsyncGenerator[str, None]:
        is_complete = False
        try:
            async for i, output in outputs:
                self.last_outputs[i] = output
                choices = [choice for c in output.outputs
                           if (choice := self._stream_choice(self.choices[i * self.body.n
                                                                          + c.index], c))]
                if choices:
                    yield self._chunk(choices)
            if self.body.include_usage_in_stream:
                yield self._chunk([], usage=self.usage())
            is_complete = True
        except Exception as exc:  # the stream has started: report in-band
            error = engine_error(exc)
            if error is None:
                logger.exception("completion stream %s failed", self.request_id)
                error = APIError(500, "internal server error while streaming; quote request "
                                 f"id {self.request_id} when reporting it", code="internal_error",
                                 error_type="server_error")
            yield sse(error_json(error))
        finally:
            self.record_metrics(is_complete)
        yield SSE_DONE

    def _stream_choice(self, state: CompletionChoiceState,
                       completion: CompletionOutput) -> dict | None:
        if state.finish_reason is not None:
            return None
        text = completion.text
        # A stop string may still cut the tail off; send it once the choice has ended.
        end = len(text) if completion.finished else max(len(text) - self.hold_back,
                                                         state.num_chars_sent)
        new_text = text[state.num_chars_sent:end]
        if not state.is_echo_sent:
            new_text, state.is_echo_sent = state.echo_text + new_text, True
        state.num_chars_sent = end
        new_logprobs = (completion.logprobs or [])[state.num_tokens_sent:]
        state.num_tokens_sent = len(completion.token_ids)
        state.finish_reason = completion.finish_reason
        if not new_text and not completion.finished and not (
                self.body.logprobs is not None and new_logprobs):
            return None
        logprobs = (self._logprobs(state, new_logprobs)
                    if self.body.logprobs is not None else None)
        return CompletionChoice(index=state.index, text=new_text, logprobs=logprobs,
                                finish_reason=completion.finish_reason).model_dump(mode="json")

    def _chunk(self, choices: list[dict], usage: Usage | None = None) -> str:
        payload = {"id": self.request_id, "object": "text_completion", "created": self.created,
                   "model": self.model_name, "choices": choices}
        if self.body.include_usage_in_stream:
            payload["usage"] = usage.model_dump(mode="json") if usage is not None else None
        return sse(payload)

    def _logprobs(self, state: CompletionChoiceState,
                  entries: list[TokenLogprobs]) -> CompletionLogprobs:
        """Legacy logprobs of `entries`; text offsets continue from what `state` has seen."""
        tokenizer = self.engine.tokenizer
        result = CompletionLogprobs()
        for entry in entries:
            text = token_text(tokenizer, entry.token_id)
            result.tokens.append(text)
            result.token_logprobs.append(clamp_logprob(entry.logprob))
            result.top_logprobs.append(dict(top_alternatives(tokenizer, entry)))
            result.text_offset.append(state.text_offset)
            state.text_offset += len(text)
        return result


async def create_completion(body: CompletionRequest, request: Request, engine: AsyncEngine,
                            metrics: ServerMetrics, model_name: str
                            ) -> CompletionResponse | Response:
    check_model(body.model, model_name)
    run = CompletionRequestRun(body, engine, metrics, model_name)
    outputs = await run.start()
    if body.stream:
        return StreamingResponse(run.event_stream(outputs), media_type="text/event-stream")
    try:
        return await run_until_disconnected(request, run.full_response(outputs))
    except ClientDisconnected:
        logger.info("client left before completion request %s finished; aborted it",
                    run.request_id)
        return Response(status_code=499)
