"""K3 "XTML" markup primitives shared by the prompt renderer and the output parser
(CHAT_FORMAT.md §1).

A prompt is a list of `Segment`s, `(text, allow_special)`. Each segment is BPE-encoded on its own;
only control segments (`allow_special=True`) may turn special-token strings into their ids, so text
from users, tools or attribute values can never forge structure.

An element is `<|open|>NAME KEY="VALUE"...<|sep|>BODY<|close|>NAME<|sep|>`; a message ends with
`<|end_of_msg|>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

Segment = tuple[str, bool]

OPEN = "<|open|>"
CLOSE = "<|close|>"
SEP = "<|sep|>"
END_OF_MESSAGE = "<|end_of_msg|>"
END_OF_SEQUENCE = "[EOS]"

_ESCAPED_ENTITY = re.compile(r"&(amp|quot);")
_UNESCAPED = {"amp": "&", "quot": '"'}


class ChatTemplateError(ValueError):
    """A chat request the K3 renderer cannot render: a bad message shape, role, tool definition or
    option. The message says what was expected and what arrived; the server answers 400 with it."""


def escape_attribute(value: str) -> str:
    """§1: `&` -> `&amp;` first, then `"` -> `&quot;`; `<` and `>` stay literal."""
    return value.replace("&", "&amp;").replace('"', "&quot;")


def unescape_attribute(value: str) -> str:
    """Inverse of `escape_attribute` (one pass, so `&amp;quot;` becomes `&quot;`)."""
    return _ESCAPED_ENTITY.sub(lambda match: _UNESCAPED[match.group(1)], value)


def text_segments(text: str) -> list[Segment]:
    """One plain-text segment, or none for empty text (§1: empty segments are left out)."""
    return [(text, False)] if text else []


def control_segments(text: str) -> list[Segment]:
    """One control segment (special-token strings become their ids), or none when empty."""
    return [(text, True)] if text else []


def open_tag(name: str, attributes: Iterable[tuple[str, str | int]] = ()) -> list[Segment]:
    """`<|open|>` · NAME · per attribute (` KEY` · `="` · VALUE · `"`) · `<|sep|>` (§1)."""
    segments = control_segments(OPEN) + text_segments(name)
    for key, value in attributes:
        segments += (text_segments(f" {key}") + text_segments('="')
                     + text_segments(escape_attribute(str(value))) + text_segments('"'))
    return segments + control_segments(SEP)


def close_tag(name: str) -> list[Segment]:
    """`<|close|>` · NAME · `<|sep|>`."""
    return control_segments(CLOSE) + text_segments(name) + control_segments(SEP)


def end_of_message() -> list[Segment]:
    return control_segments(END_OF_MESSAGE)


def segments_text(segments: Iterable[Segment]) -> str:
    """The prompt as one string (for logs and tests; never tokenize this string directly)."""
    return "".join(text for text, _ in segments)
