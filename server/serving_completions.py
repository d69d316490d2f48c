"""POST /v1/completions: raw text (or token ids) in, continuation out, OpenAI's legacy shape.

Each prompt of a request is one engine request with `n` completions; choice `i * n + j` is
completion j of prompt i. The prompts of one request are submitted to the engine together, so
that one step batches them (a list of 32 prompts costs what 32 concurrent requests cost). Text
prompts are tokenized in a worker thread. Stop strings are applied by the engine (on the output
text). When streaming with stop strings, the last `len(longest stop) - 1` characters are held
back until the choice ends, because the engine may still cut them off (a stop string can span
tokens).

`echo` puts the prompt's text before each choice's text and, with `logprobs`, the prompt
tokens' logprobs before the generated ones (the first prompt token has none: null);
`max_tokens=0` (with echo) returns the prompt alone: lm-eval's loglikelihood requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator

from fastapi import Request
from fastapi.responses import Response

from atomk31.engine.async_engine import AsyncEngine
from atomk31.engine.outputs import CompletionOutput, RequestOutput
from server.errors import APIError, bad_request, error_json
from server.logprobs import LegacyLogprobs
from server.metrics import ServerMetrics
from server.protocol import (
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    PromptTokensDetails, Usage,
)
from server.serving_common import (
    SSE_DONE, answer, check_model, engine_error, max_model_len, merge_streams, outputs_from,
    resolve_max_tokens, sampling_params, sse, start_streams,
)

logger = logging.getLogger(__name__)

ENDPOINT = "completions"


class CompletionChoiceState:
    """What has been sent of one choice (streaming) and its logprobs bookkeeping."""

    def __init__(self, index: int, echo_text: str, logprobs: LegacyLogprobs | None,
                 echo_logprobs: CompletionLogprobs | None) -> None:
        self.index = index
        self.echo_text = echo_text
        self.logprobs = logprobs
        self.echo_logprobs = echo_logprobs   # the prompt's, sent before the first token's
        self.num_chars_sent = 0
        self.num_tokens_sent = 0
        self.is_echo_sent = False
        self.finish_reason: str | None = None


class CompletionRequestRun:
    """One completions request: its prompts, engine streams and answer."""

    def __init__(self, body: CompletionRequest, engine: AsyncEngine, metrics: ServerMetrics,
                 model_name: str, prompt_token_ids: list[list[int]]) -> None:
        self.body = body
        self.engine = engine
        self.metrics = metrics
        self.model_name = model_name
        self.request_id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prompt_token_ids = prompt_token_ids
        self.is_prompt_only = body.max_tokens == 0   # generate one token, return none
        context_length = max_model_len(engine)
        self.params = []
        for ids in self.prompt_token_ids:
            if not ids:
                raise APIError(400, "a prompt encodes to no tokens; give at least one character",
                               param="prompt")
            max_tokens = resolve_max_tokens(len(ids), 1 if self.is_prompt_only
                                            else body.max_tokens, context_length, "prompt")
            params = sampling_params(body, max_tokens, stop=body.stop_strings,
                                     logprobs=body.logprobs)
            params.prompt_logprobs = body.logprobs if body.echo else None
            self.params.append(params)
        self.hold_back = max((len(s) for s in body.stop_strings), default=1) - 1
        self.choices: list[CompletionChoiceState] = []
        self.last_outputs: list[RequestOutput | None] = [None] * len(self.prompt_token_ids)

    async def start(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """Submit every prompt in one batch; errors before the first tokens become HTTP
        errors."""
        requests = [(ids, params, f"{self.request_id}-{i}")
                    for i, (ids, params) in enumerate(zip(self.prompt_token_ids, self.params))]
        started = await start_streams(self.engine, requests)
        self.choices = [self._choice_state(i, j, first) for i, (first, _) in enumerate(started)
                        for j in range(self.body.n)]
        return merge_streams([outputs_from(first, stream) for first, stream in started])

    def _choice_state(self, i: int, j: int, first: RequestOutput) -> CompletionChoiceState:
        tokenizer = self.engine.tokenizer
        ids = self.prompt_token_ids[i]
        echo_text = tokenizer.decode(ids) if self.body.echo else ""
        if self.body.logprobs is None:
            return CompletionChoiceState(i * self.body.n + j, echo_text, None, None)
        echo_logprobs = None
        if self.body.echo:
            entries = first.prompt_logprobs or [None] * len(ids)
            echo_logprobs = LegacyLogprobs(tokenizer, 0, counts_special=True).take(ids, entries)
        logprobs = LegacyLogprobs(tokenizer, len(echo_text), counts_special=False)
        return CompletionChoiceState(i * self.body.n + j, echo_text, logprobs, echo_logprobs)

    def record_metrics(self, is_complete: bool) -> None:
        for i, output in enumerate(self.last_outputs):
            n = self.body.n
            choices = self.choices[i * n:(i + 1) * n]
            reason = choices[0].finish_reason if is_complete and choices else None
            num_tokens = sum(len(c.token_ids) for c in output.outputs) if output else 0
            self.metrics.record(ENDPOINT, reason or "abort", output, num_tokens)

    def usage(self) -> Usage:
        num_prompt = sum(len(ids) for ids in self.prompt_token_ids)
        outputs = [o for o in self.last_outputs if o is not None]
        num_generated = 0 if self.is_prompt_only else sum(
            len(c.token_ids) for o in outputs for c in o.outputs)
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
        choices = [CompletionChoice(**self._new_part(state, completion))
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
        has_new_tokens = len(completion.token_ids) > state.num_tokens_sent
        part = self._new_part(state, completion)
        state.finish_reason = completion.finish_reason
        # A chunk for every step that produced tokens, its text empty while they complete no
        # character (a special token, part of a UTF-8 sequence, a held-back stop string), as
        # vLLM streams completions: a client then sees each token's arrival (TTFT, ITL).
        if not (part["text"] or has_new_tokens or completion.finished
                or (part["logprobs"] is not None and part["logprobs"].tokens)):
            return None
        return CompletionChoice(**part).model_dump(mode="json")

    def _new_part(self, state: CompletionChoiceState, completion: CompletionOutput) -> dict:
        """What `completion` adds to `state` beyond what was sent: the choice's fields."""
        text = "" if self.is_prompt_only else completion.text
        # A stop string may still cut the tail off; send it once the choice has ended.
        end = len(text) if completion.finished else max(len(text) - self.hold_back,
                                                         state.num_chars_sent)
        new_text = text[state.num_chars_sent:end]
        state.num_chars_sent = end
        logprobs = None
        if state.logprobs is not None:
            logprobs = CompletionLogprobs()
            if not state.is_echo_sent and state.echo_logprobs is not None:
                logprobs.extend(state.echo_logprobs)
            if not self.is_prompt_only:
                entries = (completion.logprobs or [])[state.num_tokens_sent:]
                ids = completion.token_ids[state.num_tokens_sent:]
                logprobs.extend(state.logprobs.take(ids, entries))
        state.num_tokens_sent = len(completion.token_ids)
        if not state.is_echo_sent:
            new_text, state.is_echo_sent = state.echo_text + new_text, True
        return {"index": state.index, "text": new_text, "logprobs": logprobs,
                "finish_reason": completion.finish_reason}

    def _chunk(self, choices: list[dict], usage: Usage | None = None) -> str:
        payload = {"id": self.request_id, "object": "text_completion", "created": self.created,
                   "model": self.model_name, "choices": choices}
        if self.body.include_usage_in_stream:
            payload["usage"] = usage.model_dump(mode="json") if usage is not None else None
        return sse(payload)


async def create_completion(body: CompletionRequest, request: Request, engine: AsyncEngine,
                            metrics: ServerMetrics, model_name: str
                            ) -> CompletionResponse | Response:
    check_model(body.model, model_name)
    if body.max_tokens == 0 and not body.echo:
        raise bad_request("max_tokens must be >= 1, got 0: max_tokens=0 generates nothing and is "
                          "only allowed with echo=true (the prompt and its logprobs)",
                          param="max_tokens")
    tokenizer = engine.tokenizer
    # A long text prompt takes a while to tokenize: off the event loop.
    prompt_token_ids = await asyncio.to_thread(
        lambda: [tokenizer.encode(p) if isinstance(p, str) else p for p in body.prompts])
    run = CompletionRequestRun(body, engine, metrics, model_name, prompt_token_ids)
    outputs = await run.start()
    return await answer(request, body.stream, lambda: run.event_stream(outputs),
                        lambda: run.full_response(outputs),
                        f"completion request {run.request_id}")
