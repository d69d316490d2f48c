"""The demo tokenizer: Kimi's format, one token per digit, the chat markers as single ids."""

from atomk31.checkpoint.tokenizer import NUM_SPECIAL_SLOTS
from atomk31.demo.tokenizer import demo_ranks


def test_every_digit_is_its_own_token(demo_tokenizer):
    ids = demo_tokenizer.encode("What is 347 + 589? 1998")
    digits = [demo_tokenizer.decode([i]) for i in ids if demo_tokenizer.decode([i]).strip().isdigit()]
    assert digits == list("347589") + list("1998")


def test_task_words_are_single_tokens(demo_tokenizer):
    for word in (" capital", " weather", " pass", " grass", "assistant", " carry"):
        assert len(demo_tokenizer.encode(word)) == 1, word


def test_round_trip_and_special_tokens(demo_tokenizer):
    text = "Convert 250 USD to EUR. Il fait beau à Paris."
    assert demo_tokenizer.decode(demo_tokenizer.encode(text)) == text
    assert demo_tokenizer.encode("<|open|>", allow_special=True) == [demo_tokenizer.token_id("<|open|>")]
    assert demo_tokenizer.vocab_size == 2048


def test_the_ranks_are_deterministic_and_leave_the_special_slots():
    ranks = demo_ranks(2048)
    assert ranks == demo_ranks.__wrapped__(2048)
    assert max(ranks.values()) < 2048 - NUM_SPECIAL_SLOTS
