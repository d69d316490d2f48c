"""server/logprobs.py: logprob token strings that never collide and true text offsets
(issue 19)."""

from __future__ import annotations

import openai

from atomk31.engine.outputs import TokenLogprobs
from server.logprobs import LegacyLogprobs, token_string

MODEL = "tiny-test"


def byte_tokens(tokenizer, text: str) -> list[int]:
    """Token ids of `text` that are parts of a character (the tiny tokenizer splits emoji)."""
    ids = tokenizer.encode(text)
    parts = [t for t in ids if tokenizer.decode([t]) == "\ufffd"]
    assert len(parts) >= 2, f"{text!r} gives no two part-of-a-character tokens: {ids}"
    return parts


def test_part_of_a_character_tokens_get_distinct_strings(tiny_tokenizer):
    first, second = byte_tokens(tiny_tokenizer, "🙂")[:2]
    assert token_string(tiny_tokenizer, first) != token_string(tiny_tokenizer, second)
    assert token_string(tiny_tokenizer, first).startswith("bytes:\\x")
    assert token_string(tiny_tokenizer, tiny_tokenizer.encode("a")[0]) == "a"
    assert token_string(tiny_tokenizer, tiny_tokenizer.token_id("<|open|>")) == "<|open|>"


def test_colliding_alternatives_all_come_back_with_their_own_logprobs(tiny_tokenizer):
    """Issue 19: alternatives decoding to the same text collided (5 asked, 4 returned) and
    the chosen token's logprob was overwritten by another's."""
    first, second = byte_tokens(tiny_tokenizer, "🙂")[:2]
    others = tiny_tokenizer.encode("a b c")
    entry = TokenLogprobs(token_id=first, logprob=-0.5, top_token_ids=[second, *others, first],
                          top_logprobs=[-0.1, -1.0, -2.0, -3.0, -0.5][:len(others) + 2])
    logprobs = LegacyLogprobs(tiny_tokenizer, 0, counts_special=False).take([first], [entry])
    [top] = logprobs.top_logprobs
    assert len(top) == len(entry.top_token_ids)
    assert top[logprobs.tokens[0]] == -0.5 == logprobs.token_logprobs[0]


def test_text_offsets_leave_out_special_tokens_of_generated_text(tiny_tokenizer):
    """Issue 19: `text_offset` counted special tokens that `text` leaves out (offsets up to
    249 into a 57-character text)."""
    special = tiny_tokenizer.token_id("<|open|>")
    ids = (tiny_tokenizer.encode("Hi") + [special] + tiny_tokenizer.encode(" there 🙂!")
           + [special])
    text = tiny_tokenizer.decode(ids, skip_special_tokens=True)
    entries = [TokenLogprobs(t, -1.0, [], []) for t in ids]
    offsets = LegacyLogprobs(tiny_tokenizer, 0, counts_special=False).take(ids, entries
                                                                           ).text_offset
    assert offsets == sorted(offsets) and offsets[-1] == len(text)
    for i, token_id in enumerate(ids):
        piece = tiny_tokenizer.decode([token_id], skip_special_tokens=True)
        if "\ufffd" not in piece:
            assert text[offsets[i]:offsets[i] + len(piece)] == piece


def test_echoed_prompt_offsets_count_its_special_tokens(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<|open|>user says hi", allow_special=True)
    text = tiny_tokenizer.decode(ids)
    logprobs = LegacyLogprobs(tiny_tokenizer, 0, counts_special=True).take(
        ids, [None] + [TokenLogprobs(t, -1.0, [], []) for t in ids[1:]])
    assert [text[o:] .startswith(t) for o, t in zip(logprobs.text_offset, logprobs.tokens)] == \
        [True] * len(ids)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None


def test_completion_logprobs_over_http_are_complete(live_server):
    """Twenty alternatives asked: twenty distinct ones come back per token, with the chosen
    token's own logprob, and the offsets index the returned text."""
    client = openai.OpenAI(base_url=live_server.base_url + "/v1", api_key="x", max_retries=0)
    choice = client.completions.create(model=MODEL, prompt="Hello 🙂 world", max_tokens=12,
                                       logprobs=20, seed=4, extra_body={"ignore_eos": True}
                                       ).choices[0]
    lp = choice.logprobs
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) >= 20 and top[token] == logprob
    assert all(0 <= o <= len(choice.text) for o in lp.text_offset)
