"""Tokenizer: the Kimi tiktoken format, special tokens (CHAT_FORMAT.md §1), segments, decoding."""

import base64
import json
from pathlib import Path

import pytest

import atomk31.checkpoint.tokenizer as tokenizer_module
from atomk31.checkpoint import Tokenizer
from atomk31.checkpoint.tokenizer_writer import write_tokenizer

TINY_IDS = {"[BOS]": 768, "[EOS]": 769, "<|end_of_msg|>": 770, "<|open|>": 771,
            "<|close|>": 772, "<|sep|>": 773, "[start_header_id]": 774, "[end_header_id]": 775,
            "[EOT]": 777, "<|media_begin|>": 786, "<|media_content|>": 787,
            "<|media_end|>": 788, "<|media_pad|>": 789, "<osagent_mode>": 833,
            "[UNK]": 1022, "[PAD]": 1023}
K3_IDS = {"[BOS]": 163584, "[EOS]": 163585, "<|end_of_msg|>": 163586, "<|open|>": 163587,
          "<|close|>": 163588, "<|sep|>": 163589, "[start_header_id]": 163590,
          "[end_header_id]": 163591, "[EOT]": 163593, "<|media_begin|>": 163602,
          "<|media_content|>": 163603, "<|media_end|>": 163604, "<|media_pad|>": 163605,
          "<osagent_mode>": 163649, "[UNK]": 163838, "[PAD]": 163839}
TEXTS = ["", "a", "Hello, world!", "The keeper's log: 12 ships, 300 km.\n\n\tIndented.",
         "naïve café Ünïcödé", "中文分词测试和English混合",
         "emoji 🚀🚀 and ZWJ 👩‍💻",
         "  leading and trailing spaces  ", "<|open|>message<|sep|> looks special"]


def _tokenizer(tmp_path: Path, vocab_size: int) -> Tokenizer:
    write_tokenizer(tmp_path, vocab_size)
    return Tokenizer.from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return _tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"), 1024)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return _tokenizer(tmp_path_factory.mktemp("proxy_tokenizer"), 163840)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_round_trip(tiny: Tokenizer, proxy: Tokenizer, text: str) -> None:
    ids = tiny.encode(text)
    assert tiny.decode(ids) == text
    assert all(0 <= i < 768 for i in ids)                # plain text never yields a special id
    assert proxy.encode(text) == ids                     # same 768 ranks for every vocabulary


def test_merges_shorten_english(tiny: Tokenizer) -> None:
    text = "The keeper of the old lighthouse wrote in his log every evening."
    assert len(tiny.encode(text)) < len(text.encode("utf-8")) / 2


def test_special_ids_of_tiny_and_proxy(tiny: Tokenizer, proxy: Tokenizer) -> None:
    assert {name: tiny.token_id(name) for name in TINY_IDS} == TINY_IDS
    assert {name: proxy.token_id(name) for name in K3_IDS} == K3_IDS
    assert tiny.vocab_size == 1024 and proxy.vocab_size == 163840
    assert tiny.special_token_ids == frozenset(range(768, 1024))
    assert proxy.special_token_ids == frozenset(range(163584, 163840))
    assert (tiny.bos_token_id, tiny.eos_token_id) == (768, 769)   # tokenizer eos is [EOS], §4
    assert (proxy.bos_token_id, proxy.eos_token_id) == (163584, 163585)


def test_unnamed_slots_are_reserved_tokens(tiny: Tokenizer, proxy: Tokenizer) -> None:
    assert tiny.decode([776]) == "<|reserved_token_776|>"         # K3 163592 is unnamed
    assert tiny.token_id("<|reserved_token_776|>") == 776
    assert proxy.decode([163600]) == "<|reserved_token_163600|>"
    with pytest.raises(ValueError, match=r"'<\|reserved_token_163600\|>' is not a special token"):
        tiny.token_id("<|reserved_token_163600|>")


def test_special_strings_are_text_unless_allowed(tiny: Tokenizer) -> None:
    text = "<|open|>message<|sep|>"
    plain = tiny.encode(text)
    assert len(plain) > 2 and not set(plain) & tiny.special_token_ids
    special = tiny.encode(text, allow_special=True)
    assert special[0] == 771 and special[-1] == 773
    assert tiny.decode(special) == tiny.decode(plain) == text
    assert tiny.decode(special, skip_special_tokens=True) == "message"


def test_segments_encode_on_their_own(tiny: Tokenizer, proxy: Tokenizer) -> None:
    # CHAT_FORMAT.md §1: the thinking generation prompt is these 10 segments.
    segments = [("<|open|>", True), ("message", False), (" role", False), ('="', False),
                ("assistant", False), ('"', False), ("<|sep|>", True), ("<|open|>", True),
                ("think", False), ("<|sep|>", True)]
    ids = proxy.encode_segments(segments)
    assert [i for i in ids if i in proxy.special_token_ids] == [163587, 163589, 163587, 163589]
    assert ids == [i for text, special in segments
                   for i in proxy.encode(text, allow_special=special)]
    assert proxy.decode(ids) == '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
    # A user's "<|open|>" in a text segment stays text; no merge across segment boundaries.
    assert not set(tiny.encode_segments([("<|open|>", False)])) & tiny.special_token_ids
    assert tiny.encode_segments([("the", False), (" keeper", False)]) == \
        tiny.encode("the") + tiny.encode(" keeper")


def test_unknown_ids_decode_to_nothing(tiny: Tokenizer, proxy: Tokenizer) -> None:
    assert tiny.decode([5000, -1, 2**40]) == ""
    assert proxy.decode([1000, 163000]) == ""                      # the gap after 768 ranks
    hello = tiny.encode("Hello")
    assert tiny.decode([9999] + hello + [-5]) == "Hello"
    cut = tiny.encode("é")                                         # two UTF-8 bytes
    assert tiny.decode(cut[:1]) == "\ufffd"


def test_kimi_pre_tokenization(tmp_path: Path) -> None:
    # Ranks that only fire if a piece boundary is NOT where Kimi's pattern puts one.
    ranks = {bytes([b]): b for b in range(256)}
    extra = [b"o ", b"o w", b"t'", b"t's", b"34", b"\xe5\x9c\xb0a"]
    for token in extra:
        ranks[token] = len(ranks)
    ids = {token: ranks[token] for token in extra}
    tokenizer = Tokenizer(ranks, {"[EOS]": 1000})
    assert ids[b"o w"] not in tokenizer.encode("Hello world")      # " world" is its own piece
    assert ids[b"t's"] in tokenizer.encode("It's")                 # contractions stay attached
    assert ids[b"34"] not in tokenizer.encode("12345")             # digits in groups of 3
    assert ids[b"\xe5\x9c\xb0a"] not in tokenizer.encode("地a")     # Han runs split from Latin


def test_real_kimi_layout_specials_right_after_the_ranks(tmp_path: Path) -> None:
    """K3's layout: 163584 ranks then the slots; here 300 ranks then slots 300..555."""
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(bytes([97, b])).decode()} {256 + b}" for b in range(44)]
    (tmp_path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    config = {"added_tokens_decoder": {"300": {"content": "[BOS]", "special": True},
                                       "302": {"content": "<|end_of_msg|>", "special": True}},
              "bos_token": {"content": "[BOS]"}, "eos_token": "<|end_of_msg|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_pretrained(tmp_path)
    assert tokenizer.special_token_ids == frozenset(range(300, 556))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (300, 302)
    assert tokenizer.decode([301, 302]) == "<|reserved_token_301|><|end_of_msg|>"
    assert tokenizer.vocab_size == 556


def test_long_runs_are_cut_before_tiktoken(
    tiny: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer_module, "MAX_ENCODE_CHARS", 12)
    monkeypatch.setattr(tokenizer_module, "MAX_RUN_CHARS", 5)
    text = "aaaaaaaaaaaaaa      bbbbbbbbbbbbbbbbbbbbb c" * 3
    pieces = list(tokenizer_module._split_long_text(text))
    assert "".join(pieces) == text and max(len(p) for p in pieces) <= 12
    assert tiny.decode(tiny.encode(text)) == text


def test_missing_files_and_bad_lines(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tiktoken.model in .*needs tiktoken.model and "
                                         r"tokenizer_config.json"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tiktoken.model").write_text("QQ== 0\nnot-base64!! 1\n")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"tiktoken.model:2: expected 'base64-token rank'"):
        Tokenizer.from_pretrained(tmp_path)


def test_special_id_that_is_also_a_rank_is_refused(tmp_path: Path) -> None:
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (tmp_path / "tiktoken.model").write_text("\n".join(lines))
    config = {"added_tokens_decoder": {"65": {"content": "[BOS]", "special": True}}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"special tokens at ids \[65\] that are also BPE ranks"):
        Tokenizer.from_pretrained(tmp_path)


def test_token_bytes_shows_parts_of_characters(proxy: Tokenizer) -> None:
    """Issue 19: logprob tokens need each token's own bytes (decode gives U+FFFD for a part
    of a character)."""
    ids = proxy.encode("🙂")
    assert b"".join(proxy.token_bytes(t) for t in ids) == "🙂".encode()
    assert proxy.token_bytes(proxy.token_id("<|open|>")) == b"<|open|>"
    with pytest.raises(ValueError, match="token id 163000 is not in this tokenizer's vocabulary"):
        proxy.token_bytes(163000)
