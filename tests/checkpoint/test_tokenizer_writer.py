"""Generated tokenizer files: the BPE trainer and the special-token placement."""

import json
from pathlib import Path

import pytest

from atomk31.checkpoint.tokenizer_writer import (
    K3_SPECIAL_TOKENS,
    TRAINING_CORPUS,
    generated_special_ids,
    train_bpe_ranks,
    write_tokenizer,
)


def test_trainer_fills_768_contiguous_ranks_over_the_bytes() -> None:
    ranks = train_bpe_ranks(TRAINING_CORPUS, 768)
    assert sorted(ranks.values()) == list(range(768))
    assert all(ranks[bytes([b])] == b for b in range(256))
    assert ranks[b" the"] < 300                                      # frequent words merge first
    assert all(len(token) > 1 for token, rank in ranks.items() if rank >= 256)


def test_trainer_is_deterministic_and_stops_when_the_corpus_is_exhausted() -> None:
    uncached = train_bpe_ranks.__wrapped__(TRAINING_CORPUS, 600)
    assert uncached == train_bpe_ranks(TRAINING_CORPUS, 600)
    small = train_bpe_ranks("abab abab", 1000)
    # Pieces "abab" and " abab": the merges are ab, then abab (2 uses vs 1 for " ab"),
    # then " abab"; after that every piece is one token.
    assert len(small) == 259
    assert (small[b"ab"], small[b"abab"], small[b" abab"]) == (256, 257, 258)


def test_special_ids_are_the_last_256_slots() -> None:
    assert generated_special_ids(163840) == K3_SPECIAL_TOKENS
    tiny = generated_special_ids(1024)
    assert tiny["[BOS]"] == 768 and tiny["[PAD]"] == 1023 and tiny["<|media_pad|>"] == 789


def test_written_files_use_the_real_format(tmp_path: Path) -> None:
    specials = write_tokenizer(tmp_path, 1024)
    lines = (tmp_path / "tiktoken.model").read_text().splitlines()
    assert len(lines) == 768 and lines[65] == "QQ== 65"               # base64(b"A") rank 65
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    assert decoder["770"] == {"content": "<|end_of_msg|>", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": True}
    assert len(decoder) == len(K3_SPECIAL_TOKENS) == len(specials)  # unnamed slots stay unnamed
    assert (config["bos_token"], config["eos_token"]) == ("[BOS]", "[EOS]")


def test_too_small_vocabulary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"vocab_size >= 512 .* got 500"):
        write_tokenizer(tmp_path, 500)
