"""Where the shipped checkpoint of the built-in model lives, and whether it is there.

The trained weights are package data in `atomk31/demo/weights/` (config.json, tokenizer files,
model.safetensors, train_result.json). Until a training run's checkpoint is placed there, the
directory holds no weights and the default model stays the random tiny checkpoint (cli.py).
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tiktoken.model", "tokenizer_config.json")


def shipped_checkpoint() -> Path | None:
    """The shipped checkpoint directory, or None when the package holds no trained weights."""
    if all((SHIPPED_DIR / name).is_file() for name in _REQUIRED_FILES):
        return SHIPPED_DIR
    return None
