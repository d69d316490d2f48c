"""How much one request may ask the server to read and render (`atomk31 serve` flags).

The engine bounds what it generates (context length, waiting queue); these bound the work a
request costs before it reaches the engine: reading the body, parsing it, rendering and
tokenizing a chat. Each limit is refused with a 413 or 400 that names the flag to raise.

Defaults, and why:
- max_request_body_bytes 32 MiB: a full 1M-token context is at most ~8 MB of JSON-escaped text
  or of token ids, so real requests fit with room to spare, while a runaway client cannot make
  the server buffer gigabytes.
- max_chat_messages 20,000 and max_content_parts 50,000 (text parts and content blocks over the
  whole request, system prompt and tool results included): a long agent session has a few
  thousand messages; the work of rendering grows with both counts (each part is a segment that
  is tokenized on its own, CHAT_FORMAT.md §1), and Anthropic's own API caps a request at
  100,000 messages.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_MAX_REQUEST_BODY_BYTES = 32 << 20
DEFAULT_MAX_CHAT_MESSAGES = 20_000
DEFAULT_MAX_CONTENT_PARTS = 50_000


@dataclass(frozen=True)
class ServerLimits:
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES
    max_content_parts: int = DEFAULT_MAX_CONTENT_PARTS

    def __post_init__(self) -> None:
        problems = [f"{f.name} must be >= 1, got {getattr(self, f.name)}"
                    for f in fields(self) if getattr(self, f.name) < 1]
        if problems:
            raise ValueError("; ".join(problems))

    @staticmethod
    def flag(name: str) -> str:
        """The `atomk31 serve` flag that sets limit `name`."""
        return "--" + name.replace("_", "-")
