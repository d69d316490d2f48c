"""Shared set-up of the demo tests: the demo tokenizer, written once per session."""

from __future__ import annotations

import pytest

from atomk31.checkpoint import Tokenizer
from atomk31.demo.model_config import demo_config
from atomk31.demo.tokenizer import write_demo_tokenizer


@pytest.fixture(scope="session")
def demo_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("demo-tokenizer")
    write_demo_tokenizer(out, demo_config()["text_config"]["vocab_size"])
    return out


@pytest.fixture(scope="session")
def demo_tokenizer(demo_tokenizer_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_tokenizer_dir)
