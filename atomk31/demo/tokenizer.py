"""The built-in model's tokenizer: Kimi's tiktoken format with merges learned on the task texts.

256 byte tokens, then BPE merges learned from rendered training conversations of every family
(seed 0, train split), with no merge inside a run of digits, so every number is one token per
digit and column arithmetic can be learned; CHAT_FORMAT.md §1's special tokens fill the last 256
ids. `write_demo_tokenizer(out, vocab_size)` writes `tiktoken.model` and `tokenizer_config.json`,
which `Tokenizer.from_pretrained` reads like the released K3 files. Deterministic: the same
vocabulary size gives the same files.
"""

from __future__ import annotations

import functools
from pathlib import Path

from atomk31.checkpoint.tokenizer import NUM_SPECIAL_SLOTS
from atomk31.checkpoint.tokenizer_writer import train_bpe_ranks, write_tokenizer_files
from atomk31.demo.render import corpus_text
from atomk31.demo.tasks import FAMILIES, generate

CORPUS_SEED = 0
CORPUS_INSTANCES_PER_FAMILY = 200
CORPUS_PASSKEY_TOKENS = 300


def demo_corpus() -> str:
    """Rendered training conversations of every family, as plain text."""
    texts = [corpus_text(generate(family, "train", CORPUS_SEED, index,
                                  num_tokens=CORPUS_PASSKEY_TOKENS))
             for family in FAMILIES for index in range(CORPUS_INSTANCES_PER_FAMILY)]
    return "\n".join(texts)


@functools.lru_cache(maxsize=2)
def demo_ranks(vocab_size: int) -> dict[bytes, int]:
    """The BPE ranks of a demo tokenizer with `vocab_size` ids (specials included)."""
    return train_bpe_ranks(demo_corpus(), vocab_size - NUM_SPECIAL_SLOTS, split_digits=True)


def write_demo_tokenizer(out: Path, vocab_size: int) -> dict[str, int]:
    """Write the demo tokenizer files into `out`; return the special token ids."""
    return write_tokenizer_files(Path(out), demo_ranks(vocab_size), vocab_size)
