"""Anthropic Messages API bodies (POST /v1/messages, /v1/messages/count_tokens), as pydantic
models; the conversion to the chat renderer's messages is server/anthropic_messages.py.

Decisions (Anthropic's API reference is the contract):
- Known fields are typed strictly, unknown ones ignored (`metadata`, `service_tier`,
  `container`, `mcp_servers`, beta fields), as on the OpenAI routes. `cache_control` on blocks
  and tools is accepted and ignored: the engine's prefix cache needs no hint.
- `messages`, `system`, `tools` and `tool_choice` stay plain JSON here; the converter checks
  their block shapes and names the path at fault (`messages[2].content[0].tool_use_id ...`).
- `thinking`: K3 always thinks (CHAT_FORMAT.md §2.5), so absent, `enabled` and `adaptive` all
  render the default thinking prompt; `{"type": "disabled"}` renders K3's non-thinking prompt.
  `budget_tokens` is accepted and not enforced (K3 has no thinking budget; `max_tokens` bounds
  the whole turn).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from server.protocol import NonEmptyStr, RequestModel, ResponseModel


class ThinkingConfig(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class CountTokensRequest(RequestModel):
    """POST /v1/messages/count_tokens: what a Messages request renders from."""

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[NonEmptyStr] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)


# ---- responses ---------------------------------------------------------------------------------
class ThinkingBlock(ResponseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class TextBlock(ResponseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = ThinkingBlock | TextBlock | ToolUseBlock


class MessagesUsage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessagesResponse(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(ResponseModel):
    input_tokens: int


class AnthropicErrorDetail(ResponseModel):
    type: str
    message: str


class AnthropicErrorResponse(ResponseModel):
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
