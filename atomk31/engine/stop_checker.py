"""StopChecker: after each generated token, extend the sequence's text and decide if it is done.

Incremental detokenization (the prefix-offset scheme of vLLM's detokenize_incrementally,
written over `decode(ids)`): decode the window `ids[prefix_offset:]` and the window without the
newest tokens `ids[prefix_offset:read_offset]`; the new text is the difference. While the window
ends in U+FFFD (a multi-byte UTF-8 character split across tokens) nothing is emitted and the
offsets stay, so the character appears whole once its last byte arrives.

A sequence finishes, in this order of precedence:
1. its last token is a stop token id (finish "stop", stop_reason = the id) or an EOS id
   (finish "stop", stop_reason None, as vLLM) unless ignore_eos. The token stays in the
   output ids; its text is left out unless include_stop_str_in_output.
2. a stop string appears in the text (finish "stop", stop_reason = the string); the text is
   cut before it (after it with include_stop_str_in_output). Only the tail that the new token
   could have completed is searched, so a stop string may span tokens; the earliest match wins.
3. max_tokens output tokens, or max_model_len tokens in all (finish "length").
The first min_tokens output tokens never trigger 1 or 2 (the sampler should also not pick EOS or
stop tokens then: `suppressed_token_ids`); the length limits always apply.
"""

from __future__ import annotations

from typing import Protocol

from atomk31.engine.sequence import Sequence, SequenceStatus

REPLACEMENT_CHAR = "\ufffd"


class Detokenizer(Protocol):
    """What StopChecker needs from a tokenizer (checkpoint.Tokenizer has it): invalid UTF-8
    decodes to U+FFFD; skip_special_tokens leaves special tokens' text out."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class StopChecker:
    """Detokenizes and applies stop conditions, one generated token at a time.

    eos_token_ids: ids that end generation unless the request sets ignore_eos.
    """

    def __init__(self, tokenizer: Detokenizer, eos_token_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)

    def check(self, seq: Sequence, max_model_len: int) -> None:
        """Account for seq's newest token: extend seq.output_text, finish seq if it is done.

        max_model_len: the sequence stops ("length") once it holds this many tokens.
        Call once per appended token (several times for a multi-token speculative step).
        """
        if seq.is_finished or seq.num_output_tokens == 0:
            raise ValueError(
                f"check() needs a running sequence with a new output token, got {seq!r}"
            )
        params = seq.sampling_params
        new_text = self._decode_new_text(seq)
        may_stop = seq.num_output_tokens > params.min_tokens

        if may_stop and self._is_stop_token(seq):
            if params.include_stop_str_in_output:
                seq.output_text += new_text
            token_id = seq.last_token_id
            stop_reason = token_id if token_id in params.stop_token_ids else None  # None: EOS
            seq.finish(SequenceStatus.FINISHED_STOPPED, stop_reason)
            return

        seq.output_text += new_text
        if may_stop and params.stop:
            match = find_stop_string(seq.output_text, len(new_text), params.stop)
            if match is not None:
                stop, start = match
                end = start + len(stop) if params.include_stop_str_in_output else start
                seq.output_text = seq.output_text[:end]
                seq.finish(SequenceStatus.FINISHED_STOPPED, stop)
                return

        reached_max_tokens = (
            params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens
        )
        if reached_max_tokens or seq.num_tokens >= max_model_len:
            seq.finish(SequenceStatus.FINISHED_LENGTH)

    def suppressed_token_ids(self, seq: Sequence) -> list[int]:
        """Token ids the sampler must not pick for seq's next token: EOS (unless ignore_eos)
        and the stop token ids while fewer than min_tokens tokens have been generated."""
        params = seq.sampling_params
        if seq.num_output_tokens >= params.min_tokens:
            return []
        token_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            token_ids |= self.eos_token_ids
        return sorted(token_ids)

    def _is_stop_token(self, seq: Sequence) -> bool:
        token_id = seq.last_token_id
        if token_id in seq.sampling_params.stop_token_ids:
            return True
        return token_id in self.eos_token_ids and not seq.sampling_params.ignore_eos

    def _decode_new_text(self, seq: Sequence) -> str:
        """Text the newest token completes ("" while a character is incomplete); advances the
        sequence's prefix_offset / read_offset when it emits text."""
        token_ids = seq.all_token_ids
        skip = seq.sampling_params.skip_special_tokens
        prefix_text = self.tokenizer.decode(
            token_ids[seq.prefix_offset : seq.read_offset], skip_special_tokens=skip
        )
        full_text = self.tokenizer.decode(token_ids[seq.prefix_offset :], skip_special_tokens=skip)
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(token_ids)
        return full_text[len(prefix_text) :]


def find_stop_string(text: str, num_new_chars: int, stop: list[str]) -> tuple[str, int] | None:
    """The earliest stop string that the last num_new_chars characters of text completed, as
    (stop string, index where it starts in text), or None.

    A match must end inside the new tail, so its start is at least
    len(text) - num_new_chars - len(stop) + 1; earlier matches were seen on earlier tokens.
    """
    if num_new_chars == 0:
        return None
    best: tuple[str, int] | None = None
    for stop_string in stop:
        search_from = max(len(text) - num_new_chars - len(stop_string) + 1, 0)
        start = text.find(stop_string, search_from)
        if start != -1 and (best is None or start < best[1]):
            best = (stop_string, start)
    return best
