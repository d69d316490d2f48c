"""The Kimi tokenizer: tiktoken BPE plus 256 special-token slots.

Reads the real Kimi format from a checkpoint directory:
* `tiktoken.model`: one `base64(token bytes) rank` pair per line (tiktoken's BPE file format);
* `tokenizer_config.json`: `added_tokens_decoder` (`{"163586": {"content": "<|end_of_msg|>",
  "special": true, ...}}`) names the special tokens; `bos_token` / `eos_token` name those two.

As in Kimi's `tokenization_kimi.py`, the 256 ids after the BPE ranks are special slots; a slot
that `added_tokens_decoder` does not name is `<|reserved_token_{id}|>` (CHAT_FORMAT.md §1). The
one extension: generated proxy tokenizers have only 768 BPE ranks but the real K3 special ids
(163584..163839), so when every named special id lies beyond the first 256 ids after the ranks,
the slots start at the lowest named id instead.

Pre-tokenization uses Kimi's `pat_str` (Han runs kept whole; letter runs split at case changes,
with English contractions attached; digits in groups of at most 3). Written here from the
pattern's published description in third-party Kimi tokenizer ports; `&&` is a character class
intersection, which tiktoken's regex engine supports.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import tiktoken

TIKTOKEN_FILE = "tiktoken.model"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
NUM_SPECIAL_SLOTS = 256

_LETTERS_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_LETTERS_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI_PAT_STR = "|".join([
    r"[\p{Han}]+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}*{_LETTERS_LOWER}+{_CONTRACTION}",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}+{_LETTERS_LOWER}*{_CONTRACTION}",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Kimi's tokenization_kimi.py feeds tiktoken at most this many characters at a time, and cuts
# runs of whitespace / non-whitespace longer than the second limit (tiktoken's regex is slow on
# them). We do the same, so very long prompts encode in linear time.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


class Tokenizer:
    """Encode text to token ids and back, with Kimi's special tokens.

    Build it with `Tokenizer.from_pretrained(checkpoint_dir)`.
    """

    def __init__(self, mergeable_ranks: dict[bytes, int], special_tokens: dict[str, int],
                 bos_token: str | None = None, eos_token: str | None = None,
                 pat_str: str = KIMI_PAT_STR) -> None:
        self._encoding = tiktoken.Encoding(name="kimi", pat_str=pat_str,
                                           mergeable_ranks=mergeable_ranks,
                                           special_tokens=special_tokens)
        self._special_tokens = dict(special_tokens)
        self._special_ids = frozenset(special_tokens.values())
        self._known_ids = frozenset(mergeable_ranks.values()) | self._special_ids
        self._vocab_size = max(self._known_ids) + 1
        self.bos_token_id = special_tokens.get(bos_token) if bos_token else None
        self.eos_token_id = special_tokens.get(eos_token) if eos_token else None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "Tokenizer":
        """Read `tiktoken.model` and `tokenizer_config.json` from the directory `path`."""
        root = Path(path)
        model_file, config_file = root / TIKTOKEN_FILE, root / TOKENIZER_CONFIG_FILE
        for file in (model_file, config_file):
            if not file.is_file():
                raise ValueError(f"no {file.name} in {root}: a Kimi tokenizer needs "
                                 f"{TIKTOKEN_FILE} and {TOKENIZER_CONFIG_FILE}; pass the "
                                 f"checkpoint directory")
        ranks = read_tiktoken_ranks(model_file)
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_file} is not valid JSON: {e}") from e
        specials = special_tokens_from_config(config, ranks)
        return cls(ranks, specials, bos_token=_token_content(config.get("bos_token")),
                   eos_token=_token_content(config.get("eos_token")))

    # ---- encoding ------------------------------------------------------------------------
    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Token ids of `text`. Special-token strings (e.g. `<|open|>`) become their ids only
        when `allow_special` is true; otherwise they are ordinary text (CHAT_FORMAT.md §1)."""
        allowed: str | set[str] = "all" if allow_special else set()
        ids: list[int] = []
        for piece in _split_long_text(text):
            ids.extend(self._encoding.encode(piece, allowed_special=allowed,
                                             disallowed_special=()))
        return ids

    def encode_segments(self, segments: Iterable[tuple[str, bool]]) -> list[int]:
        """Concatenated ids of `(text, allow_special)` segments, each encoded on its own so
        BPE never merges across a segment boundary (CHAT_FORMAT.md §1)."""
        ids: list[int] = []
        for text, allow_special in segments:
            ids.extend(self.encode(text, allow_special=allow_special))
        return ids

    # ---- decoding ------------------------------------------------------------------------
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`. Ids this tokenizer does not know decode to nothing; byte sequences
        that are not valid UTF-8 (e.g. a cut multi-byte character) become U+FFFD."""
        skipped = self._special_ids if skip_special_tokens else frozenset()
        kept = [i for i in map(int, ids) if i in self._known_ids and i not in skipped]
        return self._encoding.decode_bytes(kept).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its name's UTF-8); a byte-level
        token may be part of a character, which `decode` would show as U+FFFD."""
        if token_id not in self._known_ids:
            raise ValueError(f"token id {token_id} is not in this tokenizer's vocabulary")
        return self._encoding.decode_single_token_bytes(token_id)

    # ---- vocabulary ----------------------------------------------------------------------
    def token_id(self, name: str) -> int:
        """The id of a special token, e.g. `token_id("<|end_of_msg|>")`."""
        if name not in self._special_tokens:
            raise ValueError(f"{name!r} is not a special token of this tokenizer; named ones "
                             f"are e.g. {sorted(self._named_special_tokens())[:8]}")
        return self._special_tokens[name]

    @property
    def special_token_ids(self) -> frozenset[int]:
        """All special ids, the unnamed (reserved) slots included."""
        return self._special_ids

    @property
    def vocab_size(self) -> int:
        """One past the largest id (ids in gaps between ranks and specials are never produced)."""
        return self._vocab_size

    def _named_special_tokens(self) -> list[str]:
        return [t for t in self._special_tokens if not t.startswith("<|reserved_token_")]


def read_tiktoken_ranks(file: Path) -> dict[bytes, int]:
    """Parse a `tiktoken.model` file: `base64 rank` per line.

    Parsed here rather than with tiktoken's `load_tiktoken_bpe`, which caches file contents by
    path in a temp directory: a file rewritten at the same path would load stale ranks.
    """
    ranks: dict[bytes, int] = {}
    for line_number, line in enumerate(file.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{file}:{line_number}: expected 'base64-token rank', got "
                             f"{line[:60]!r}") from e
    if not ranks:
        raise ValueError(f"{file} holds no BPE ranks")
    return ranks


def special_tokens_from_config(config: dict, ranks: dict[bytes, int]) -> dict[str, int]:
    """Special token name -> id: the 256 slots after the BPE ranks, named from
    `added_tokens_decoder` or `<|reserved_token_{id}|>` (see the module docstring)."""
    named: dict[int, str] = {}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str):
            raise ValueError(f"tokenizer_config.json added_tokens_decoder[{key!r}] needs a "
                             f"'content' string, got {entry!r}")
        named[int(key)] = content
    first_slot = max(ranks.values()) + 1
    if named and min(named) >= first_slot + NUM_SPECIAL_SLOTS:
        first_slot = min(named)
    rank_ids = set(ranks.values())
    clashes = sorted(i for i in named if i in rank_ids)
    if clashes:
        raise ValueError(f"tokenizer_config.json names special tokens at ids {clashes[:5]} "
                         f"that are also BPE ranks in {TIKTOKEN_FILE}; the two files do not "
                         f"belong together")
    slots = {i: f"<|reserved_token_{i}|>"
             for i in range(first_slot, first_slot + NUM_SPECIAL_SLOTS)}
    slots.update(named)
    return {content: token_id for token_id, content in slots.items()}


def _token_content(token: str | dict | None) -> str | None:
    """`bos_token` / `eos_token` as HF writes them: a string or {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token


def _split_long_text(text: str) -> Iterator[str]:
    """Cut `text` into pieces of at most MAX_ENCODE_CHARS, also cutting any run of more than
    MAX_RUN_CHARS whitespace or non-whitespace characters."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        chunk = text[start:start + MAX_ENCODE_CHARS]
        piece_start, run_length = 0, 0
        previous_is_space: bool | None = None
        for i, char in enumerate(chunk):
            is_space = char.isspace()
            run_length = run_length + 1 if is_space == previous_is_space else 1
            previous_is_space = is_space
            if run_length > MAX_RUN_CHARS:
                yield chunk[piece_start:i]
                piece_start, run_length = i, 1
        yield chunk[piece_start:]
