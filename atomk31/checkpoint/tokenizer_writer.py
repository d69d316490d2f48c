"""Tokenizer files for generated checkpoints, in the real Kimi format.

`write_tokenizer(out, vocab_size)` writes `tiktoken.model` and `tokenizer_config.json`, which
`Tokenizer.from_pretrained` reads exactly as it reads the released K3 files.

* BPE ranks: the 256 single bytes (rank = byte value), then merges learned by a small
  deterministic byte-level BPE trainer on the built-in English corpus below, up to 768 ranks in
  all (fewer if the corpus runs out of pairs). The same ranks serve every vocabulary size.
* Special tokens: CHAT_FORMAT.md §1's table, at `vocab_size - 256 + (k3_id - 163584)`. The
  proxy (vocabulary 163840) thus gets the real K3 ids, and tiny (1024) gets 768..1023.
  Unnamed slots stay unnamed (they read as `<|reserved_token_{id}|>`), as in the release.
"""

from __future__ import annotations

import base64
import functools
import json
from collections import Counter
from pathlib import Path

import regex

from atomk31.checkpoint.tokenizer import (
    KIMI_PAT_STR,
    NUM_SPECIAL_SLOTS,
    TIKTOKEN_FILE,
    TOKENIZER_CONFIG_FILE,
)

NUM_GENERATED_RANKS = 768
K3_FIRST_SPECIAL_ID = 163584

# CHAT_FORMAT.md §1: name -> K3 id.
K3_SPECIAL_TOKENS: dict[str, int] = {
    "[BOS]": 163584, "[EOS]": 163585, "<|end_of_msg|>": 163586,
    "<|open|>": 163587, "<|close|>": 163588, "<|sep|>": 163589,
    "[start_header_id]": 163590, "[end_header_id]": 163591, "[EOT]": 163593,
    "<|media_begin|>": 163602, "<|media_content|>": 163603, "<|media_end|>": 163604,
    "<|media_pad|>": 163605, "<osagent_mode>": 163649, "[UNK]": 163838, "[PAD]": 163839,
}
# CHAT_FORMAT.md §4: every turn ends with it; it is eos_token_id of generation_config.json.
END_OF_MESSAGE = "<|end_of_msg|>"

TRAINING_CORPUS = """\
The keeper of the old lighthouse wrote in his log every evening. On clear nights he counted the
ships that passed the point: three in the spring, twelve in the summer, and sometimes none at all
when the storms came in from the west. He didn't mind the quiet. He liked the sound of the wind
against the glass, the slow turn of the great lamp, and the smell of oil and salt in the tower.

When the supply boat arrived each month, it brought flour, coffee, letters and newspapers that
were already two weeks old. The keeper read them anyway, slowly, from the first page to the
last. He learned that a new bridge had opened in the city, that the price of bread had risen by
4 cents, and that someone had built a machine which could translate a sentence from one language
into another. "What will they think of next?" he asked the gulls, who did not answer.

Years later, the lighthouse was automated. A small computer now switches the lamp on at dusk and
off at dawn; it measures the wind speed, the temperature and the height of the waves, and sends
its readings to a station 300 kilometres away. Nobody lives in the tower any more. But visitors
still climb the 117 steps to the top, where they can see the whole coastline, the islands, and on
a very clear day the mountains beyond the bay. Some of them find the keeper's logbooks in a box
under the stairs, and they sit on the floor and read about the ships, the storms and the gulls.

Reading is a kind of listening. Writing, too, is a way of keeping watch: you notice what changes
and what stays the same, and you put it down so that it isn't lost. The keeper understood this
better than most. His entries were short, but they were honest, and they were never late.
"""


def write_tokenizer(out: Path, vocab_size: int) -> dict[str, int]:
    """Write `tiktoken.model` and `tokenizer_config.json` into `out`; return the special
    token name -> id map used."""
    _check_vocab_size(vocab_size)
    first_special = vocab_size - NUM_SPECIAL_SLOTS
    ranks = train_bpe_ranks(TRAINING_CORPUS, min(NUM_GENERATED_RANKS, first_special))
    return write_tokenizer_files(out, ranks, vocab_size)


def write_tokenizer_files(out: Path, ranks: dict[bytes, int], vocab_size: int) -> dict[str, int]:
    """Write the BPE `ranks` and CHAT_FORMAT.md §1's special tokens (in the last 256 ids of
    `vocab_size`) as `tiktoken.model` and `tokenizer_config.json`; return the special ids."""
    _check_vocab_size(vocab_size)
    if max(ranks.values()) >= vocab_size - NUM_SPECIAL_SLOTS:
        raise ValueError(f"{len(ranks)} BPE ranks do not fit below the {NUM_SPECIAL_SLOTS} special "
                         f"slots of vocab_size {vocab_size}; train fewer ranks or raise vocab_size")
    specials = generated_special_ids(vocab_size)
    lines = [f"{base64.b64encode(token).decode('ascii')} {rank}"
             for token, rank in sorted(ranks.items(), key=lambda item: item[1])]
    (out / TIKTOKEN_FILE).write_text("\n".join(lines) + "\n", encoding="ascii")
    config = {
        "added_tokens_decoder": {
            str(token_id): {"content": name, "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True}
            for name, token_id in sorted(specials.items(), key=lambda item: item[1])},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "TikTokenTokenizer",
    }
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n",
                                             encoding="utf-8")
    return specials


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size < 256 + NUM_SPECIAL_SLOTS:
        raise ValueError(f"a generated tokenizer needs vocab_size >= {256 + NUM_SPECIAL_SLOTS} "
                         f"(256 byte tokens + {NUM_SPECIAL_SLOTS} special slots), got "
                         f"{vocab_size}")


def generated_special_ids(vocab_size: int) -> dict[str, int]:
    """CHAT_FORMAT.md §1's special tokens placed in the last 256 ids of `vocab_size`."""
    first_special = vocab_size - NUM_SPECIAL_SLOTS
    return {name: first_special + (k3_id - K3_FIRST_SPECIAL_ID)
            for name, k3_id in K3_SPECIAL_TOKENS.items()}


@functools.lru_cache(maxsize=4)
def train_bpe_ranks(text: str, num_ranks: int, split_digits: bool = False) -> dict[bytes, int]:
    """Byte-level BPE: ranks 0..255 are the single bytes, then one rank per learned merge.

    Pieces come from Kimi's pre-tokenization pattern, so no merge crosses a piece boundary.
    Each step merges the most frequent adjacent pair (ties: the smaller pair of byte strings),
    which makes the result a pure function of `text`, `num_ranks` and `split_digits`.
    `split_digits` learns no merge inside a run of digits (the pattern makes digit runs pieces
    of their own), so every number encodes one token per digit.
    """
    ranks = {bytes([b]): b for b in range(256)}
    pieces = Counter(p.encode("utf-8") for p in _pretokenizer().findall(text)
                     if not (split_digits and p.isdigit()))
    words = [[bytes([b]) for b in piece] for piece in pieces]
    counts = list(pieces.values())
    while len(ranks) < num_ranks:
        pair_counts: Counter[tuple[bytes, bytes]] = Counter()
        for symbols, count in zip(words, counts):
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] += count
        if not pair_counts:
            break  # every piece is a single token: the corpus is exhausted
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merged = best[0] + best[1]
        ranks.setdefault(merged, len(ranks))
        words = [_merge_pair(symbols, best, merged) for symbols in words]
    return dict(ranks)


def _merge_pair(symbols: list[bytes], pair: tuple[bytes, bytes], merged: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


@functools.lru_cache(maxsize=1)
def _pretokenizer() -> regex.Pattern:
    # VERSION1 gives the `regex` module the `&&` class intersection that tiktoken's engine has.
    return regex.compile(KIMI_PAT_STR, regex.VERSION1)
