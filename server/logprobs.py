"""Logprobs in OpenAI's shapes: token strings that never collide, and legacy text offsets.

Token strings. A byte-level token can be part of a character; decoded alone it is U+FFFD, so
two such alternatives used to collide in the legacy `top_logprobs` dict (5 asked, 4 returned,
and one logprob overwritten). As OpenAI does, a token whose bytes are not valid UTF-8 is shown
as `bytes:\\xNN...`, so distinct tokens always have distinct strings. The legacy format also
lists the chosen token itself among `top_logprobs` (so up to `logprobs + 1` entries).

Text offsets. `text_offset[i]` is where token i starts in the choice's `text`: special tokens,
which the generated text leaves out, add nothing; an echoed prompt keeps them (its text is
decoded with them), so there they count.
"""

from __future__ import annotations

import codecs
from typing import Any

from atomk31.engine.outputs import TokenLogprobs
from server.protocol import CompletionLogprobs

MIN_LOGPROB = -9999.0   # -inf is not JSON; vLLM clamps the same way


def clamp_logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


def token_string(tokenizer: Any, token_id: int) -> str:
    """The token as text, or `bytes:\\xNN...` when its bytes are not a whole UTF-8 text."""
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def top_alternatives(tokenizer: Any, entry: TokenLogprobs) -> list[tuple[str, float]]:
    return [(token_string(tokenizer, t), clamp_logprob(lp))
            for t, lp in zip(entry.top_token_ids, entry.top_logprobs)]


class LegacyLogprobs:
    """Builds a choice's legacy `logprobs` entry by entry (streamed or whole), keeping the
    text offset. `start`: where the first token begins in `text`; `counts_special`: whether
    special tokens are part of that text (an echoed prompt) or left out (generated text)."""

    def __init__(self, tokenizer: Any, start: int, counts_special: bool) -> None:
        self.tokenizer = tokenizer
        self.offset = start
        self.counts_special = counts_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._special_ids = tokenizer.special_token_ids

    def take(self, token_ids: list[int], entries: list[TokenLogprobs | None]
             ) -> CompletionLogprobs:
        """Logprobs of `token_ids`; entry None (a prompt's first token) has no logprob."""
        result = CompletionLogprobs()
        for token_id, entry in zip(token_ids, entries):
            result.tokens.append(token_string(self.tokenizer, token_id))
            result.text_offset.append(self.offset)
            if entry is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
            else:
                top = dict(top_alternatives(self.tokenizer, entry))
                top[result.tokens[-1]] = clamp_logprob(entry.logprob)
                result.token_logprobs.append(clamp_logprob(entry.logprob))
                result.top_logprobs.append(top)
            if self.counts_special or token_id not in self._special_ids:
                self.offset += len(self._decoder.decode(self.tokenizer.token_bytes(token_id)))
        return result
