"""Random workloads: lengths around a mean, and prompts of an exact token count (token ids,
or text that the tokenizer encodes to exactly that many tokens).

Ids are drawn uniformly from the tokenizer's ordinary (non-special) ids. Text is made of "word
tokens": ids whose text is one space and letters (" were", " most") and that encode back to
themselves alone. The pre-tokenizer cuts text before every such space, so BPE never merges two
of them and n words encode to exactly n tokens; the count is checked, and corrected the way
vLLM's random dataset does (re-encode, cut or extend, decode again) should a vocabulary break
the rule.
"""

from __future__ import annotations

import numpy as np
import regex

from atomk31.bench.errors import BenchmarkError
from atomk31.checkpoint import Tokenizer

MAX_TEXT_ROUNDS = 10
WORD_TEXT = regex.compile(r"^ \p{L}+$")


def ordinary_token_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Every id below vocab_size that is not a special token, ascending."""
    ids = np.arange(tokenizer.vocab_size)
    special = np.fromiter(tokenizer.special_token_ids, dtype=np.int64)
    return ids[~np.isin(ids, special)]


def random_token_ids(pool: np.ndarray, num_tokens: int, rng: np.random.Generator) -> list[int]:
    """`num_tokens` ids drawn uniformly from `pool` (ordinary_token_ids)."""
    return pool[rng.integers(0, len(pool), size=num_tokens)].tolist()


def word_token_ids(tokenizer: Tokenizer, pool: np.ndarray) -> np.ndarray:
    """The ids of `pool` whose text is a space and letters and encodes back to that id alone."""
    words = [i for i in pool.tolist()
             if WORD_TEXT.match(text := tokenizer.decode([i])) and tokenizer.encode(text) == [i]]
    return np.asarray(words, dtype=np.int64)


def random_text(tokenizer: Tokenizer, words: np.ndarray, num_tokens: int,
                rng: np.random.Generator) -> tuple[str, int]:
    """(text, its token count): text of `num_tokens` random word tokens (word_token_ids), which
    encodes to `num_tokens` tokens (module docstring)."""
    ids = random_token_ids(words, num_tokens, rng)
    text = tokenizer.decode(ids)
    for _ in range(MAX_TEXT_ROUNDS):
        ids = tokenizer.encode(text)
        if len(ids) == num_tokens:
            break
        if len(ids) > num_tokens:
            ids = ids[:num_tokens]
        else:
            ids = ids + random_token_ids(words, num_tokens - len(ids), rng)
        text = tokenizer.decode(ids)
    return text, len(tokenizer.encode(text))


def sample_lengths(num: int, mean: int, range_ratio: float,
                   rng: np.random.Generator) -> list[int]:
    """`num` lengths uniform in [floor(mean (1 - r)), ceil(mean (1 + r))], at least 1 (vLLM's
    random dataset)."""
    if not 0 <= range_ratio < 1:
        raise BenchmarkError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    low = max(1, int(np.floor(mean * (1 - range_ratio))))
    high = max(low, int(np.ceil(mean * (1 + range_ratio))))
    return rng.integers(low, high + 1, size=num).tolist()
