"""The OpenAI request bodies the server accepts, as pydantic models.

Decisions (the OpenAI reference is the contract; vLLM's extras are accepted where we run them):
- Known fields are typed strictly: `"max_tokens": "10"` or `"stream": "yes"` is a 400, not a
  silent conversion. Floats must be finite (JSON `NaN`/`Infinity` are refused).
- Unknown fields are ignored, as vLLM and most OpenAI-compatible servers do: clients send
  bookkeeping fields (`user`, `metadata`, `store`, `service_tier`, ...) that do not change the
  output. Known fields that would change the output and that we do not implement
  (`frequency_penalty`, `presence_penalty`, `repetition_penalty`, `logit_bias`, `suffix`,
  `best_of != n`) are refused with a 400 instead of being ignored.
- Completions: `echo` with `logprobs` returns the prompt tokens' logprobs too, and
  `max_tokens=0` with `echo` returns only the prompt (what lm-eval's loglikelihood sends).
- Chat `messages`, `tools`, `tool_choice` and `response_format` stay plain JSON here: the K3
  renderer (server/chat_template.py) checks their shapes and reports with the message's index;
  the pydantic layer only checks what the renderer does not (tool names, duplicates).
- vLLM extras accepted: `top_k`, `min_p`, `min_tokens`, `ignore_eos`, `stop_token_ids`, and for
  chat K3's thinking switches `thinking: {"type", "effort"}` and
  `chat_template_kwargs: {"thinking": bool}` (CHAT_FORMAT.md §2.5).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, \
    model_validator

from atomk31.engine.sampling_params import MAX_LOGPROBS

MAX_N = 128   # completions per request; bounds the work one request can ask for
# OpenAI's function-name rule, plus '.' which MCP-style clients use ("server.tool").
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

MIN_SEED, MAX_SEED = -(2 ** 63), 2 ** 63 - 1 - MAX_N
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


class RequestModel(BaseModel):
    """Base of request bodies: strict types, finite floats, unknown fields ignored."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(RequestModel):
    include_usage: bool = False


class ThinkingOptions(RequestModel):
    """K3's switch (CHAT_FORMAT.md §2.5): `{"type": "disabled"}` or `{"effort": "high"}`."""

    type: Literal["enabled", "disabled"] | None = None
    effort: str | None = None


class SamplingRequest(RequestModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool = False
    # torch seeds are 64-bit and completion i of n uses seed + i (SamplingParams): keep it there;
    # a larger seed would crash the engine thread instead of being refused here.
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _check_supported(self) -> "SamplingRequest":
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0):
                raise ValueError(f"{name} is not supported by this server, got "
                                 f"{getattr(self, name)}; leave it out or pass 0")
        if self.repetition_penalty not in (None, 1):
            raise ValueError(f"repetition_penalty is not supported by this server, got "
                             f"{self.repetition_penalty}; leave it out or pass 1")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server; leave it out")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None   # K3 decides itself; accepted, not enforced
    reasoning_effort: str | None = None
    thinking: ThinkingOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("tools")
    @classmethod
    def _check_tool_names(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """Names must be OpenAI-style and unique; the renderer checks the rest of the shape."""
        seen: set[str] = set()
        for i, tool in enumerate(tools or []):
            function = tool.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str):
                continue
            if not TOOL_NAME_PATTERN.match(name):
                raise ValueError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', "
                                 f"'-' or '.', got {name[:80]!r}")
            if name in seen:
                raise ValueError(f"tools[{i}].function.name {name!r} is declared twice; tool "
                                 "names must be unique")
            seen.add(name)
        return tools

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def max_output_tokens(self) -> int | None:
        """`max_completion_tokens` (OpenAI's current name) wins over `max_tokens`."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None (off) or how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def effective_reasoning_effort(self) -> str | None:
        """The renderer's `reasoning_effort` (CHAT_FORMAT.md §2.5): "none" when thinking is
        switched off, else `thinking.effort`, else `reasoning_effort` (None: the default)."""
        kwargs = self.chat_template_kwargs or {}
        if (self.thinking is not None and self.thinking.type == "disabled") \
                or kwargs.get("thinking") is False:
            return "none"
        if self.thinking is not None and self.thinking.effort is not None:
            return self.thinking.effort
        return self.reasoning_effort


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(SamplingRequest):
    """POST /v1/completions: `prompt` is a string, a list of strings, a list of token ids or a
    list of token id lists (one completion set per prompt)."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(16, ge=0)   # OpenAI's default for legacy completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check_prompt(self) -> "CompletionRequest":
        if self.suffix is not None:
            raise ValueError("suffix is not supported by this server; leave it out")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of is not supported by this server (got best_of="
                             f"{self.best_of}, n={self.n}); leave it out or set it equal to n")
        if not self.prompts or any(len(p) == 0 for p in self.prompts):
            raise ValueError("prompt must not be empty; give at least one character or token")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


# ---- responses ---------------------------------------------------------------------------------
class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "atomk31"
    max_model_len: int


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# chat ------------------------------------------------------------------------------------------
class FunctionCall(ResponseModel):
    name: str
    arguments: str


class ToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class StreamedToolCall(ToolCall):
    """A tool call in a stream delta: sent whole, once, when the call closes (§3.3)."""

    index: int


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[TokenLogprob]


class ChatMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(ResponseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(ResponseModel):
    """A stream delta; fields left None are not sent (OpenAI sends only what changed)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[StreamedToolCall] | None = None


class ChatStreamChoice(ResponseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


# completions -----------------------------------------------------------------------------------
class CompletionLogprobs(ResponseModel):
    """The legacy completions format: parallel lists, one entry per generated token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)   # None: a prompt's first
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    def extend(self, other: "CompletionLogprobs") -> None:
        self.tokens += other.tokens
        self.token_logprobs += other.token_logprobs
        self.top_logprobs += other.top_logprobs
        self.text_offset += other.text_offset


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
