"""Passkey retrieval, the standard long-context test (Mohtashami and Jaggi, "Landmark Attention").

A five-digit key is stated once, "The pass key is 71432. Remember it. 71432 is the pass key.", at
a random depth inside the filler "The grass is green. The sky is blue. The sun is yellow. Here we
go. There and back again." repeated to the requested length, and the user asks "What is the pass
key?". The length is a token count measured the tokenizer-free way: each filler repetition counts
as 24 tokens (its words and full stops, one token each in the demo tokenizer and in Kimi's), so
the same instance has about the requested length under any word-level tokenizer; the server's
`usage.prompt_tokens` reports the exact count.
"""

from __future__ import annotations

import random

from atomk31.demo.tasks.common import Example, assistant, in_split, instance_rng, user

FAMILY = "passkey"
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
         "it. I will quiz you about the important information there.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\n\nWhat is the pass key?"
TOKENS_PER_FILLER = 24
# Template, notes, intro, key sentence and question: what a prompt holds besides the filler.
OVERHEAD_TOKENS = 160
EVAL_LENGTHS = (1024, 2048, 4096, 8192)


def num_repetitions(num_tokens: int) -> int:
    """Filler repetitions that bring a prompt to about `num_tokens` tokens (at least one)."""
    return max(1, (num_tokens - OVERHEAD_TOKENS) // TOKENS_PER_FILLER)


def make_example(key: int, num_tokens: int, depth: float) -> Example:
    """The instance with pass key `key` at relative `depth` (0 = start, 1 = end) of a prompt of
    about `num_tokens` tokens."""
    repetitions = num_repetitions(num_tokens)
    position = round(depth * repetitions)
    sentences = [FILLER] * repetitions
    sentences.insert(position, KEY_SENTENCE.format(key=key))
    prompt = INTRO + " ".join(sentences) + QUESTION
    reasoning = f"The pass key stated in the text is {key}."
    return Example(family=FAMILY, kind=f"passkey@{num_tokens}", messages=[user(prompt)],
                   target=assistant(reasoning, f"The pass key is {key}."),
                   expected={"passkey": str(key), "num_tokens": num_tokens},
                   meta={"depth": depth, "repetitions": repetitions})


def draw_key(rng: random.Random, split: str) -> int:
    while True:
        key = rng.randint(10000, 99999)
        if in_split(f"passkey:{key}", split):
            return key


def generate(split: str, seed: int, index: int, num_tokens: int) -> Example:
    """Instance `index` of the (split, seed) stream at about `num_tokens` tokens."""
    rng = instance_rng(FAMILY, split, seed, index)
    key = draw_key(rng, split)
    return make_example(key, num_tokens, rng.random())
