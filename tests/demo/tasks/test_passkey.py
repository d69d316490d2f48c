"""Passkey instances: the standard test, the key stated once at the drawn depth."""

import pytest

from atomk31.demo.render import encode_example
from atomk31.demo.tasks import generate
from atomk31.demo.tasks.passkey import FILLER, KEY_SENTENCE, make_example


def test_the_key_is_stated_once_inside_the_filler_then_asked_for():
    example = make_example(71432, 1024, depth=0.5)
    prompt = example.messages[-1]["content"]
    assert prompt.count(KEY_SENTENCE.format(key=71432)) == 1
    assert prompt.count("71432") == 2          # "The pass key is 71432. ... 71432 is the pass key."
    assert prompt.endswith("What is the pass key?")
    before, after = prompt.split(KEY_SENTENCE.format(key=71432))
    assert abs(before.count(FILLER) - after.count(FILLER)) <= 1
    assert example.target["content"] == "The pass key is 71432."


@pytest.mark.parametrize("num_tokens", [1024, 2048, 8192])
def test_prompt_length_is_close_to_the_requested_tokens(num_tokens, demo_tokenizer):
    ids, num_prompt = encode_example(generate("passkey", "eval", 0, 0, num_tokens), demo_tokenizer)
    assert 0.97 * num_tokens <= num_prompt <= num_tokens


def test_depth_varies_over_instances():
    depths = {round(generate("passkey", "train", 0, i, 400).meta["depth"], 1) for i in range(40)}
    assert len(depths) >= 6
