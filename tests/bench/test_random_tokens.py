"""atomk31/bench/random_tokens.py: prompt lengths, exact token counts for ids and text."""

from __future__ import annotations

import numpy as np
import pytest

from atomk31.bench.random_tokens import (
    ordinary_token_ids, random_text, random_token_ids, sample_lengths, word_token_ids,
)
from atomk31.checkpoint import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_checkpoint)


def test_ordinary_ids_leave_out_every_special_token(tokenizer):
    pool = ordinary_token_ids(tokenizer)
    assert not set(pool.tolist()) & tokenizer.special_token_ids
    assert len(pool) == tokenizer.vocab_size - len(tokenizer.special_token_ids)


@pytest.mark.parametrize("num_tokens", [1, 17, 300])
def test_random_token_ids_have_the_exact_count_and_come_from_the_pool(tokenizer, num_tokens):
    pool = ordinary_token_ids(tokenizer)
    ids = random_token_ids(pool, num_tokens, np.random.default_rng(0))
    assert len(ids) == num_tokens and set(ids) <= set(pool.tolist())


@pytest.mark.parametrize("num_tokens", [1, 16, 100, 1000])
def test_random_text_encodes_to_the_requested_token_count(tokenizer, num_tokens):
    words = word_token_ids(tokenizer, ordinary_token_ids(tokenizer))
    rng = np.random.default_rng(num_tokens)
    for _ in range(5):
        text, count = random_text(tokenizer, words, num_tokens, rng)
        assert count == num_tokens == len(tokenizer.encode(text))


def test_sample_lengths_stay_within_the_range_ratio():
    lengths = sample_lengths(1000, 100, 0.25, np.random.default_rng(1))
    assert min(lengths) == 75 and max(lengths) == 125
    assert sample_lengths(3, 7, 0.0, np.random.default_rng(1)) == [7, 7, 7]


def test_sample_lengths_refuse_a_range_ratio_of_one_or_more():
    with pytest.raises(ValueError, match=r"--range-ratio must be in \[0, 1\), got 1.0"):
        sample_lengths(3, 10, 1.0, np.random.default_rng(0))


def test_word_tokens_are_a_space_and_letters_that_encode_to_themselves(tokenizer):
    words = word_token_ids(tokenizer, ordinary_token_ids(tokenizer)).tolist()
    assert len(words) > 50
    for i in words:
        text = tokenizer.decode([i])
        assert text[0] == " " and text[1:].isalpha() and tokenizer.encode(text) == [i]
