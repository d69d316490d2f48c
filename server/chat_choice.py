"""One chat choice while it is generated: K3 parsing, request stop strings, token accounting.

The engine hands over cumulative token ids; `ChatChoiceState.advance` feeds the new ones to the
choice's `ChatOutputParser` and returns what they added (reasoning, content, complete tool
calls, logprobs, and the finish reason once it is known). The same state serves streaming (one
update per engine step) and non-streaming requests (the totals it keeps).

Request `stop` strings match response-channel text only, which is cut before the match
(CHAT_FORMAT.md §4), so they are applied here on the parsed content rather than by the engine
(whose text would include the reasoning): content that could be the start of a stop string is
held back until it is known not to be one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atomk31.engine.outputs import CompletionOutput, TokenLogprobs
from server.output_parser import ChatOutputParser, ToolCall


class ContentStopFilter:
    """Finds request stop strings in streamed text, holding back a possible partial match."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = stop
        self.held = ""
        self.matched: str | None = None   # the stop string found (the earliest)

    def feed(self, text: str, may_stop: bool = True) -> tuple[str, bool]:
        """-> (text that can be sent now, whether a stop string matched). After a match the
        text is cut before it and nothing more should be fed."""
        if not self.stop or not may_stop:
            text, self.held = self.held + text, ""
            return text, False
        buffer = self.held + text
        starts = [(i, s) for s in self.stop if (i := buffer.find(s)) != -1]
        if starts:
            self.held = ""
            start, self.matched = min(starts, key=lambda match: match[0])
            return buffer[:start], True
        keep = self._partial_match_length(buffer)
        self.held = buffer[len(buffer) - keep:]
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that begins some stop string."""
        longest = min(len(buffer), max(len(s) for s in self.stop) - 1)
        for length in range(longest, 0, -1):
            tail = buffer[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0


@dataclass
class ChoiceUpdate:
    """What one engine step added to a choice."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def has_delta(self) -> bool:
        return bool(self.reasoning_content or self.content or self.tool_calls)


class ChatChoiceState:
    """Parsing state and running totals of choice `index`."""

    def __init__(self, index: int, parser: ChatOutputParser, stop: list[str],
                 min_tokens: int) -> None:
        self.index = index
        self.parser = parser
        self.stop_filter = ContentStopFilter(stop)
        self.min_tokens = min_tokens
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.reasoning_content = ""
        self.content = ""
        self.tool_calls: list[ToolCall] = []
        self.logprobs: list[TokenLogprobs] = []

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, completion: CompletionOutput) -> ChoiceUpdate | None:
        """Take the tokens `completion` holds beyond those seen; None once finished."""
        if self.is_finished:
            return None
        seen = self.num_tokens
        self.num_tokens = len(completion.token_ids)
        delta = self.parser.feed(completion.token_ids[seen:])
        update = ChoiceUpdate(reasoning_content=delta.reasoning_content,
                              tool_calls=list(delta.tool_calls),
                              logprobs=list(completion.logprobs[seen:])
                              if completion.logprobs is not None else [])
        if completion.finished:
            tail = self.parser.finish()
            update.reasoning_content += tail.reasoning_content
            update.tool_calls += tail.tool_calls
            content, is_stopped = self.stop_filter.feed(delta.content + tail.content,
                                                        self._may_stop())
            if not is_stopped:
                content += self.stop_filter.flush()
            update.finish_reason = ("stop" if is_stopped
                                    else self.parser.finish_reason(completion.finish_reason))
        else:
            content, is_stopped = self.stop_filter.feed(delta.content, self._may_stop())
            if is_stopped:
                update.finish_reason = "stop"
        update.content = content
        self._accumulate(update)
        return update

    def message_content(self) -> str | None:
        """The final `content` (CHAT_FORMAT.md §3.2, §5): None when it is empty and calls were
        returned or the turn was cut inside the think channel; else the text, possibly ""."""
        if self.content:
            return self.content
        return None if self.tool_calls or self.parser.content is None else ""

    def _may_stop(self) -> bool:
        # SamplingParams semantics: the first min_tokens tokens never trigger a stop string.
        return self.num_tokens > self.min_tokens

    def _accumulate(self, update: ChoiceUpdate) -> None:
        self.reasoning_content += update.reasoning_content
        self.content += update.content
        self.tool_calls += update.tool_calls
        self.logprobs += update.logprobs
        self.finish_reason = update.finish_reason
