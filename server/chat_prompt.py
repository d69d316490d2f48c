"""A chat request's prompt: bounded, rendered (server/chat_template.py) and tokenized, in the
caller's worker thread, refused as soon as it is known not to fit.

The OpenAI and Anthropic routes both come here with OpenAI-shaped messages, so the same
conversation gives the same token ids on either route.

"As soon as it is known": every rendered message is at least MIN_TOKENS_PER_MESSAGE
non-empty segments (opener, name, role attribute, closer, end of message: CHAT_FORMAT.md §2)
and every non-empty segment is at least one token, since segments are tokenized on their own
(§1). So the message count bounds the prompt from below before anything is rendered, the
segment count bounds it before anything is tokenized, and tokenizing stops at the first
segment past the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.chat_template import prompt_starts_in_reasoning, render_chat
from server.errors import APIError, bad_request
from server.limits import ServerLimits
from server.xtml import Segment

# <|open|> message ␣role =" ROLE " <|sep|>, <|close|> message <|sep|>, <|end_of_msg|>
MIN_TOKENS_PER_MESSAGE = 11
MIN_GENERATION_PROMPT_TOKENS = 10   # §2.4: ten segments either way
MAX_MEMO_SEGMENT_CHARS = 32   # framing segments repeat in every message: encode each once


@dataclass
class ChatPrompt:
    segments: list[Segment]
    token_ids: list[int]
    starts_in_reasoning: bool


def count_content_parts(messages: list[Any]) -> int:
    """Text parts (a string counts one), tool calls: the pieces a request's messages hold."""
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        total += len(content) if isinstance(content, list) else int(bool(content))
        calls = message.get("tool_calls")
        total += len(calls) if isinstance(calls, list) else 0
    return total


def check_chat_size(messages: list[Any], limits: ServerLimits, num_parts: int) -> None:
    """400 when the request holds more messages or content parts than the server renders."""
    if len(messages) > limits.max_chat_messages:
        raise bad_request(f"the request has {len(messages)} messages, over this server's limit "
                          f"of {limits.max_chat_messages}; send fewer, or start the server with "
                          f"a larger {ServerLimits.flag('max_chat_messages')}",
                          param="messages", code="too_many_messages")
    if num_parts > limits.max_content_parts:
        raise bad_request(f"the request has {num_parts} content parts, over this server's limit "
                          f"of {limits.max_content_parts}; merge or drop some, or start the "
                          f"server with a larger {ServerLimits.flag('max_content_parts')}",
                          param="messages", code="too_many_content_parts")


def build_chat_prompt(messages: list[dict], tokenizer: Any, max_prompt_tokens: int,
                      context_length: int, **render_options: Any) -> ChatPrompt:
    """Render and tokenize; `max_prompt_tokens` is what the context leaves beside the output
    budget. Raises ChatTemplateError for input the renderer refuses and a 400
    (context_length_exceeded) as soon as the prompt is known to be longer."""
    lower_bound = MIN_TOKENS_PER_MESSAGE * len(messages) + MIN_GENERATION_PROMPT_TOKENS
    if lower_bound > max_prompt_tokens:
        raise _too_long(f"{len(messages)} messages make at least {lower_bound} tokens",
                        max_prompt_tokens, context_length)
    segments = render_chat(messages, **render_options)
    num_segments = sum(1 for text, _ in segments if text)
    if num_segments > max_prompt_tokens:
        raise _too_long(f"the rendered prompt has {num_segments} segments, so at least as many "
                        "tokens", max_prompt_tokens, context_length)
    token_ids = encode_within(tokenizer, segments, max_prompt_tokens)
    if token_ids is None:
        raise _too_long(f"the prompt has more than {max_prompt_tokens} tokens",
                        max_prompt_tokens, context_length)
    return ChatPrompt(segments, token_ids, prompt_starts_in_reasoning(segments))


def encode_within(tokenizer: Any, segments: list[Segment], max_tokens: int) -> list[int] | None:
    """`tokenizer.encode_segments(segments)`, or None once it passes `max_tokens`. Short
    segments (the markup every message repeats) are encoded once per call."""
    memo: dict[Segment, list[int]] = {}
    ids: list[int] = []
    for segment in segments:
        text, allow_special = segment
        if not text:
            continue
        if len(text) <= MAX_MEMO_SEGMENT_CHARS:
            piece = memo.get(segment)
            if piece is None:
                piece = memo[segment] = tokenizer.encode(text, allow_special=allow_special)
        else:
            piece = tokenizer.encode(text, allow_special=allow_special)
        ids.extend(piece)
        if len(ids) > max_tokens:
            return None
    return ids


def max_prompt_tokens(context_length: int, max_tokens: int | None) -> int:
    """The longest prompt that leaves room for `max_tokens` (None: for at least one)."""
    return context_length - (max_tokens if max_tokens is not None else 1)


def _too_long(reason: str, max_prompt: int, context_length: int) -> APIError:
    return bad_request(f"the prompt does not fit: {reason}, and at most {max_prompt} fit beside "
                       f"the requested output in this model's context length of "
                       f"{context_length} tokens; shorten the messages or lower max_tokens",
                       param="messages", code="context_length_exceeded")
