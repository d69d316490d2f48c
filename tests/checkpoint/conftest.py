"""Fixtures: edited copies of the session's tiny checkpoint (tests/conftest.py).

Helpers are fixtures (not importable functions) so the suite also runs under
`--import-mode=importlib`.
"""

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atomk31.config import ModelConfig

@pytest.fixture
def tiny_tensors(tiny_checkpoint: Path) -> dict[str, torch.Tensor]:
    """All tensors of the tiny checkpoint, read directly with safetensors (a fresh dict)."""
    return load_file(tiny_checkpoint / "model.safetensors")


@pytest.fixture
def write_variant(tiny_checkpoint: Path,
                  tmp_path: Path) -> Callable[[dict[str, torch.Tensor]], Path]:
    """write_variant(tensors) -> a new checkpoint directory holding the tiny checkpoint's
    config and tokenizer files and the given tensors (one model.safetensors)."""
    def write(tensors: dict[str, torch.Tensor]) -> Path:
        out = tmp_path / "variant"
        out.mkdir()
        for file in tiny_checkpoint.iterdir():
            if not file.name.startswith("model"):
                shutil.copy(file, out / file.name)
        save_file(tensors, out / "model.safetensors")
        return out
    return write


@pytest.fixture(scope="session")
def tiny_config(tiny_checkpoint: Path) -> ModelConfig:
    return ModelConfig.from_pretrained(tiny_checkpoint)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Run this folder's tests on one intra-op thread, then restore the setting.

    The tensors here are small, so a second thread buys nothing, and on a busy 2-core machine
    OpenMP's spin-waiting made a 0.1 s tiny forward take 40+ s with two threads.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
