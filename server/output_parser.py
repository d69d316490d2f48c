"""Parse generated K3 token ids into reasoning, content and tool calls (CHAT_FORMAT.md §3-§5).

The parser works on token ids, not text: `<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>` and
`[EOS]` are single special ids, so channel text can never contain a marker, and the only things
held back are an element header (from `<|open|>`/`<|close|>` to `<|sep|>`) and a trailing
incomplete UTF-8 character (§3.3). One parser per choice; the same code serves streaming (one
`feed` per step) and non-streaming (one `feed` with everything) requests.

Grammar of a turn after the thinking prompt (§3.1):
    TEXT* <|close|>think<|sep|> <|open|>response<|sep|> TEXT* <|close|>response<|sep|>
    [<|open|>tools<|sep|> call+ <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|> [EOS]
    call := <|open|>call tool="NAME" index="I"<|sep|> (argument* | json) <|close|>call<|sep|>
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from server.xtml import CLOSE, END_OF_MESSAGE, END_OF_SEQUENCE, OPEN, SEP, unescape_attribute

if TYPE_CHECKING:
    from atomk31.checkpoint import Tokenizer

logger = logging.getLogger(__name__)

_HEADER_NAME = re.compile(r"\s*(\S+)")
_HEADER_ATTRIBUTE = re.compile(r'\s*([^\s="]+)="([^"]*)"')
_STREAMED_KINDS = ("think", "response")  # channels whose text is sent as it decodes
_CHANNELS = ("think", "response", "tools")  # the known children of `message`


@dataclass
class ToolCall:
    """One complete call (§3.2): `arguments` is the complete JSON text."""
    id: str
    name: str
    arguments: str


@dataclass
class ChatDelta:
    """What one `feed` / `finish` produced: new reasoning text, new content text, calls that
    closed in these tokens."""
    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class _Element:
    """An open XTML element. kind: message | think | response | tools | call | argument | json,
    or `ignored` for an unknown or misplaced element (its body is discarded, §5)."""
    kind: str
    name: str
    attributes: dict[str, str] = field(default_factory=dict)
    text: str = ""  # body text of argument / json / ignored / message (between channels)
    arguments: dict[str, Any] = field(default_factory=dict)  # call: decoded argument values
    json_text: str | None = None  # call: the raw text of a `json` child


class ChatOutputParser:
    """Incremental parser over generated token ids.

    tokenizer: `atomk31.checkpoint.Tokenizer` (`token_id(name)`, `decode(ids)`).
    starts_in_reasoning: `prompt_starts_in_reasoning(segments)` of the prompt: the first tokens
        are think-channel text (thinking prompt) or response text (non-thinking prompt).
    keep_tool_calls: False for `tool_choice="none"`: calls are parsed and dropped (§5).

    Feed every generated id, stop ids included (a stop id ends the turn), then call `finish()`.
    """

    def __init__(self, tokenizer: Tokenizer, starts_in_reasoning: bool,
                 keep_tool_calls: bool = True) -> None:
        self._tokenizer = tokenizer
        self._open_id, self._close_id, self._sep_id = (tokenizer.token_id(name)
                                                        for name in (OPEN, CLOSE, SEP))
        self._stop_ids = {tokenizer.token_id(END_OF_MESSAGE), tokenizer.token_id(END_OF_SEQUENCE)}
        self._special_ids = frozenset(tokenizer.special_token_ids)
        self._keep_tool_calls = keep_tool_calls
        # The generation prompt already opened `message` and the first channel (§2.4).
        first_channel = "think" if starts_in_reasoning else "response"
        self._stack = [_Element("message", "message"), _Element(first_channel, first_channel)]
        self._header_ids: list[int] | None = None  # ids after <|open|>/<|close|>, until <|sep|>
        self._header_opens = True  # whether the pending header is an opener
        self._text_ids: list[int] = []  # text of the innermost element not yet decoded
        self._delta = ChatDelta()
        self._reasoning = ""
        self._content = ""
        self._tool_calls: list[ToolCall] = []
        self._is_turn_over = False  # message closed, stop id seen, or finish() called
        self._is_finished = False
        self._saw_stop_id = False
        self._is_turn_complete = False  # the message closed or a stop id arrived
        self._is_cut_while_thinking = False  # ended by finish() inside the think channel
        self._generated_ids: list[int] = []  # the raw turn, for logging dropped parts
        self._problems: list[str] = []

    # ---- public ----------------------------------------------------------------------------------
    def feed(self, token_ids: list[int]) -> ChatDelta:
        """Parse newly generated ids; return the reasoning / content text and complete calls they
        produced. Text is emitted as soon as it decodes to whole characters."""
        if self._is_finished:
            raise ValueError("ChatOutputParser.feed() called after finish(); use one parser per "
                             "generated turn")
        for token_id in token_ids:
            self._generated_ids.append(int(token_id))
            if not self._is_turn_over:
                self._step(int(token_id))
        return self._take_delta()

    def finish(self) -> ChatDelta:
        """End the turn (token limit, stop string, or after a stop id): flush held-back text and
        drop any call that never closed (§5)."""
        if not self._is_finished:
            self._end_turn()
            self._is_finished = True
        return self._take_delta()

    @property
    def finish_reason_override(self) -> str | None:
        """`tool_calls` when at least one call is returned (§3.2), else None (the engine's
        `stop` / `length` stands)."""
        return "tool_calls" if self._tool_calls else None

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """§3.2: `length` whenever the token limit cut the turn (also after complete calls:
        a call that was being written is lost), else `tool_calls` if calls were returned,
        else the engine's reason. A turn is cut when the engine says `length` before the
        message closed or a stop id arrived."""
        if engine_reason == "length" and not self._is_turn_complete:
            return "length"
        return self.finish_reason_override or engine_reason

    @property
    def reasoning_content(self) -> str | None:
        """All think-channel text so far, verbatim; None when there is none (§3.2)."""
        return self._reasoning or None

    @property
    def content(self) -> str | None:
        """All response text so far, verbatim (§3.2, §5): None when it is empty and calls were
        returned, or when the turn ended inside the think channel without a stop id (token
        limit); else the text, possibly ""."""
        if self._content:
            return self._content
        return None if self._tool_calls or self._is_cut_while_thinking else ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """All calls returned so far, in order."""
        return list(self._tool_calls)

    # ---- token handling --------------------------------------------------------------------------
    def _step(self, token_id: int) -> None:
        if token_id in self._stop_ids:
            self._saw_stop_id = self._is_turn_complete = True
            self._end_turn()
        elif token_id in (self._open_id, self._close_id):
            if self._header_ids is not None:
                self._problems.append("an element header was interrupted by another marker")
            self._flush_text()
            self._header_ids, self._header_opens = [], token_id == self._open_id
        elif token_id == self._sep_id:
            if self._header_ids is None:
                self._problems.append("a stray <|sep|> outside an element header")
                return
            self._flush_text()
            header = self._tokenizer.decode(self._header_ids, skip_special_tokens=False)
            self._header_ids = None
            if self._header_opens:
                self._open_element(header)
            else:
                self._close_element(parse_header(header)[0])
        elif token_id in self._special_ids:
            pass  # other special ids (reserved, media, BOS...) carry no text in a turn
        elif self._header_ids is not None:
            self._header_ids.append(token_id)
        else:
            self._text_ids.append(token_id)
            if self._stack[-1].kind in _STREAMED_KINDS:
                self._flush_text(hold_incomplete=True)

    def _flush_text(self, hold_incomplete: bool = False) -> None:
        """Decode the pending text ids into the innermost element; with `hold_incomplete`, keep
        them while the decoded text ends in U+FFFD (a multi-byte character still arriving)."""
        if not self._text_ids:
            return
        text = self._tokenizer.decode(self._text_ids, skip_special_tokens=False)
        if hold_incomplete and text.endswith("\ufffd"):
            return
        self._text_ids = []
        element = self._stack[-1]
        if element.kind == "think":
            self._reasoning += text
            self._delta.reasoning_content += text
        elif element.kind == "response":
            self._content += text
            self._delta.content += text
        else:
            element.text += text

    def _end_turn(self) -> None:
        """Flush text and close every open element, unclosed calls being dropped (§5)."""
        if self._is_turn_over:
            return
        if self._header_ids is not None:
            self._problems.append("the turn ended inside an element header")
            self._header_ids = None
        self._flush_text()
        self._is_cut_while_thinking = not self._saw_stop_id and any(
            element.kind == "think" for element in self._stack)
        while self._stack:
            self._pop(explicitly=False)
        self._is_turn_over = True
        if self._problems:
            logger.warning("K3 output parser dropped parts of a turn: %s; raw turn: %r",
                           "; ".join(self._problems),
                           self._tokenizer.decode(self._generated_ids, skip_special_tokens=False))
            self._problems = []

    # ---- elements --------------------------------------------------------------------------------
    def _open_element(self, header: str) -> None:
        name, attributes = parse_header(header)
        parent = self._stack[-1]
        if parent.kind == "think" and name == "think":
            # §5: the generation prompt already opened the think channel; a repeated opener is
            # ignored and what follows stays reasoning (its closer then closes the channel).
            return
        if parent.kind == "think" and name in ("response", "tools"):
            # §5: a response or tools opener before <|close|>think<|sep|> ends the think channel.
            self._pop(explicitly=True)
            parent = self._stack[-1]
        if parent.kind == "message":
            self._settle_text_between_channels(parent)
            kind = name if name in _CHANNELS else "ignored"
        elif parent.kind == "tools":
            kind = "call" if name == "call" else "ignored"
        elif parent.kind == "call":
            kind = name if name in ("argument", "json") else "ignored"
        else:
            kind = "ignored"
        if kind == "ignored" and parent.kind not in ("tools", "call"):
            self._problems.append(f"discarded element <{name}> inside <{parent.name}>")
        self._stack.append(_Element(kind, name, attributes))

    def _close_element(self, name: str) -> None:
        depth = next((i for i in range(len(self._stack) - 1, -1, -1)
                      if self._stack[i].name == name), None)
        if depth is None:
            self._problems.append(f"a closer for <{name}>, which is not open")
            return
        while len(self._stack) > depth + 1:
            self._pop(explicitly=False)
        self._pop(explicitly=True)
        if not self._stack:
            self._is_turn_complete = True
            self._end_turn()  # §4: tokens after MSG_END other than stop ids are discarded

    def _pop(self, explicitly: bool) -> None:
        """Close the innermost element: `explicitly` by its own closer, or implicitly (an outer
        closer or the end of the turn)."""
        element = self._stack.pop()
        parent = self._stack[-1] if self._stack else None
        if element.kind == "message":
            self._settle_text_between_channels(element)
        elif element.kind in ("call", "argument", "json") and not explicitly:
            self._problems.append(f"an unclosed <{element.name}> was dropped")
        elif element.kind == "argument":
            key = element.attributes.get("key")
            if key is None:
                self._problems.append("an <argument> without key was dropped")
            else:
                # §5: a repeated key: the last one wins.
                parent.arguments[key] = decode_argument(element.text,
                                                        element.attributes.get("type"))
        elif element.kind == "json":
            parent.json_text = element.text
        elif element.kind == "call":
            self._return_call(element)
        if element.kind in ("call", "tools") and element.text.strip():
            self._problems.append(f"discarded stray text inside <{element.name}>: "
                                  f"{element.text[:200]!r}")
        elif element.kind == "ignored" and element.text.strip():
            self._problems.append(f"discarded text of <{element.name}>: {element.text[:200]!r}")

    def _return_call(self, call: _Element) -> None:
        name = call.attributes.get("tool")
        if name is None:
            self._problems.append("a <call> without tool was dropped")
            return
        if not self._keep_tool_calls:
            logger.debug("tool_choice='none': dropping a generated call of %r", name)
            return
        if call.json_text is not None and call.arguments:
            self._problems.append(f"a <json> child of call {name!r} was dropped: the call also "
                                  "has <argument> children, which win")
        arguments = (call.json_text if call.json_text is not None and not call.arguments
                     else json.dumps(call.arguments, ensure_ascii=False, allow_nan=False))
        # §3.2: the wire carries no id; ours is unique like ATOM's `call_` + 32 hex digits.
        tool_call = ToolCall(id=f"call_{uuid.uuid4().hex}", name=name, arguments=arguments)
        self._tool_calls.append(tool_call)
        self._delta.tool_calls.append(tool_call)

    def _settle_text_between_channels(self, message: _Element) -> None:
        """§5: text between channels: whitespace is dropped, anything else joins the content."""
        text, message.text = message.text, ""
        if text.strip():
            self._content += text
            self._delta.content += text

    def _take_delta(self) -> ChatDelta:
        delta, self._delta = self._delta, ChatDelta()
        return delta


def parse_header(header: str) -> tuple[str, dict[str, str]]:
    """`call tool="get_weather" index="1"` -> ("call", {"tool": "get_weather", "index": "1"}),
    attribute values unescaped (§1); text that is not an attribute is ignored."""
    match = _HEADER_NAME.match(header)
    if match is None:
        return "", {}
    attributes = {key: unescape_attribute(value)
                  for key, value in _HEADER_ATTRIBUTE.findall(header, match.end())}
    return match.group(1), attributes


def decode_argument(text: str, xtml_type: str | None) -> Any:
    """§3.2: `string` (or no type) -> the raw text; other types -> the JSON-decoded stripped text,
    or the raw text when it does not decode (§5: `number` with `abc` -> "abc") or when it holds
    a non-finite number anywhere (`Infinity`, `NaN`, `1e999`), which strict JSON cannot carry."""
    if xtml_type is None or xtml_type == "string":
        return text
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError:
        return text
    return value if is_finite_json(value) else text


def is_finite_json(value: Any) -> bool:
    """Whether a decoded JSON value holds no infinite or NaN number, however deeply nested."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(is_finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(is_finite_json(v) for v in value)
    return True
