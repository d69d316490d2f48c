"""StopChecker with a fake byte-table tokenizer: incremental text (multi-byte characters split
across tokens), EOS / stop tokens / stop strings (split across tokens), min_tokens, lengths."""

import pytest

from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.sequence import Sequence, SequenceStatus
from atomk31.engine.stop_checker import StopChecker, find_stop_string

EOS, IM_END = 0, 12
BYTE_TABLE = {
    EOS: b"<eos>",
    1: b"a",
    2: b"b",
    3: b" ",
    4: b"S",
    5: b"T",
    6: b"OP",
    7: b"\xe2",  # "€" = e2 82 ac, one byte per token
    8: b"\x82",
    9: b"\xac",
    10: b"\xc3\xa9\xe2\x82",  # "é" then the first two bytes of "€"
    11: b"OPx",
    IM_END: b"<|im_end|>",
    13: b"zab",
    14: b"STOP",
}
SPECIAL_IDS = {EOS, IM_END}


class ByteTableTokenizer:
    """decode() like checkpoint.Tokenizer: concatenated bytes, invalid UTF-8 -> U+FFFD."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        kept = [i for i in ids if not (skip_special_tokens and i in SPECIAL_IDS)]
        return b"".join(BYTE_TABLE[i] for i in kept).decode("utf-8", errors="replace")


class LeadingSpaceTokenizer(ByteTableTokenizer):
    """Drops one leading space of the whole text, like SentencePiece's first-piece rule."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = super().decode(ids, skip_special_tokens)
        return text[1:] if text.startswith(" ") else text


MAX_MODEL_LEN = 1000


def generate(
    params: SamplingParams,
    token_ids: list[int],
    prompt: list[int] | None = None,
    tokenizer: ByteTableTokenizer | None = None,
    max_model_len: int = MAX_MODEL_LEN,
) -> tuple[Sequence, list[str]]:
    """Feed token_ids one at a time until the sequence finishes; -> (seq, text after each)."""
    checker = StopChecker(tokenizer or ByteTableTokenizer(), {EOS})
    seq = Sequence("r0", prompt or [1, 2], params)
    texts = []
    for token_id in token_ids:
        seq.append_token(token_id)
        checker.check(seq, max_model_len)
        texts.append(seq.output_text)
        if seq.is_finished:
            break
    return seq, texts


def test_text_accumulates() -> None:
    seq, texts = generate(SamplingParams(max_tokens=None), [1, 3, 2, 2])
    assert texts == ["a", "a ", "a b", "a bb"]
    assert not seq.is_finished


def test_multibyte_character_split_across_tokens() -> None:
    seq, texts = generate(SamplingParams(max_tokens=None), [1, 7, 8, 9, 2])
    assert texts == ["a", "a", "a", "a€", "a€b"]
    seq, texts = generate(SamplingParams(max_tokens=None), [10, 9, 1])
    assert texts == ["", "é€", "é€a"]


def test_prompt_context_keeps_a_leading_space() -> None:
    params = SamplingParams(max_tokens=None)
    seq, texts = generate(params, [3, 2], tokenizer=LeadingSpaceTokenizer())
    assert texts == [" ", " b"]


def test_special_tokens_skipped_or_kept() -> None:
    _, texts = generate(SamplingParams(max_tokens=None), [1, IM_END, 2])
    assert texts[-1] == "ab"
    _, texts = generate(SamplingParams(max_tokens=None, skip_special_tokens=False), [1, IM_END, 2])
    assert texts[-1] == "a<|im_end|>b"


def test_eos_stops_without_its_text() -> None:
    seq, _ = generate(SamplingParams(max_tokens=None, skip_special_tokens=False), [1, EOS, 2])
    assert seq.status is SequenceStatus.FINISHED_STOPPED
    assert (seq.finish_reason, seq.stop_reason) == ("stop", None)
    assert seq.output_text == "a" and seq.output_token_ids == [1, EOS]


def test_eos_with_ignore_eos_continues() -> None:
    params = SamplingParams(max_tokens=3, ignore_eos=True, skip_special_tokens=False)
    seq, texts = generate(params, [1, EOS, 2])
    assert texts == ["a", "a<eos>", "a<eos>b"]
    assert seq.finish_reason == "length"


def test_stop_token_id_stops_with_reason() -> None:
    seq, _ = generate(SamplingParams(max_tokens=None, stop_token_ids=[2]), [1, 3, 2, 1])
    assert (seq.finish_reason, seq.stop_reason) == ("stop", 2)
    assert seq.output_text == "a " and seq.output_token_ids == [1, 3, 2]
    params = SamplingParams(max_tokens=None, stop_token_ids=[2], include_stop_str_in_output=True)
    seq, _ = generate(params, [1, 3, 2])
    assert seq.output_text == "a b"


def test_stop_string_split_across_tokens() -> None:
    seq, texts = generate(SamplingParams(max_tokens=None, stop="STOP"), [1, 4, 5, 6, 2])
    assert texts == ["a", "aS", "aST", "a"]
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "STOP")
    assert seq.output_token_ids == [1, 4, 5, 6]


def test_stop_string_included_and_text_after_it_dropped() -> None:
    params = SamplingParams(max_tokens=None, stop=["STOP"], include_stop_str_in_output=True)
    seq, _ = generate(params, [1, 4, 5, 11])
    assert seq.output_text == "aSTOP"
    seq, _ = generate(SamplingParams(max_tokens=None, stop=["STOP"]), [1, 4, 5, 11])
    assert seq.output_text == "a"


def test_earliest_stop_string_wins() -> None:
    seq, _ = generate(SamplingParams(max_tokens=None, stop=["b", "a"]), [13])
    assert (seq.output_text, seq.stop_reason) == ("z", "a")


def test_find_stop_string_searches_only_what_the_new_text_completed() -> None:
    assert find_stop_string("xxSTOPyy", 2, ["STOP"]) is None
    assert find_stop_string("xxSTOPyy", 3, ["STOP"]) == ("STOP", 2)
    assert find_stop_string("xxSTOP", 0, ["STOP"]) is None
    assert find_stop_string("ab", 1, ["abc"]) is None


def test_min_tokens_suppresses_stops_until_reached() -> None:
    params = SamplingParams(max_tokens=None, min_tokens=3, stop=["ab"], stop_token_ids=[5],
                            skip_special_tokens=False)
    seq, texts = generate(params, [EOS, 1, 2, 5])
    assert texts == ["<eos>", "<eos>a", "<eos>ab", "<eos>ab"]
    assert (seq.finish_reason, seq.stop_reason) == ("stop", 5)
    seq, _ = generate(params, [1, 1, 1, 2])  # "ab" completed by the 4th token: it stops
    assert (seq.output_text, seq.stop_reason) == ("aa", "ab")


def test_suppressed_token_ids_until_min_tokens() -> None:
    checker = StopChecker(ByteTableTokenizer(), {EOS, IM_END})
    seq = Sequence("r0", [1], SamplingParams(min_tokens=2, stop_token_ids=[5]))
    assert checker.suppressed_token_ids(seq) == [EOS, 5, IM_END]
    seq.append_token(1)
    assert checker.suppressed_token_ids(seq) == [EOS, 5, IM_END]
    seq.append_token(1)
    assert checker.suppressed_token_ids(seq) == []
    params = SamplingParams(min_tokens=2, stop_token_ids=[5], ignore_eos=True)
    ignoring = Sequence("r1", [1], params)
    assert checker.suppressed_token_ids(ignoring) == [5]


def test_max_tokens_finishes_with_length() -> None:
    seq, texts = generate(SamplingParams(max_tokens=2), [1, 2, 1])
    assert texts == ["a", "ab"]
    assert (seq.finish_reason, seq.stop_reason) == ("length", None)


def test_max_model_len_finishes_with_length() -> None:
    seq, _ = generate(SamplingParams(max_tokens=None), [1, 2, 1], prompt=[1, 2, 3], max_model_len=4)
    assert seq.finish_reason == "length" and seq.output_token_ids == [1]


def test_stop_string_beats_length_on_the_same_token() -> None:
    seq, _ = generate(SamplingParams(max_tokens=1, stop=["TO"]), [14])
    assert (seq.finish_reason, seq.stop_reason, seq.output_text) == ("stop", "TO", "S")


def test_check_needs_a_new_token_on_a_running_sequence() -> None:
    checker = StopChecker(ByteTableTokenizer(), {EOS})
    seq = Sequence("r0", [1], SamplingParams())
    with pytest.raises(ValueError, match="check\\(\\) needs a running sequence with a new output"):
        checker.check(seq, MAX_MODEL_LEN)
