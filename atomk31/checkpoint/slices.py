"""A checkpoint read tensor by tensor, each whole or as one slice, straight onto a device.

    tensors = CheckpointSlices.open(path, config, device="cuda:3")
    w = tensors.pop("...q_b_proj.weight", Shard(0, 4608, 6912))    # reads these rows only

Each rank of a distributed engine builds its model shard from one of these: a layer asks for
exactly the rows or columns it holds (``model/weights.py``), so no rank reads, or holds, the
whole checkpoint. A slice is read with safetensors' ``get_slice`` from the memory-mapped
file: a row range is one contiguous read; a column range touches only those columns of each
row. The progress bar counts the bytes of the slices actually read. The whole checkpoint is
validated from its headers (``validate.check_tensors``) before the first byte is read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from tqdm import tqdm

from atomk31.checkpoint.shards import StoredTensor, read_checkpoint_headers
from atomk31.checkpoint.validate import check_tensors
from atomk31.config import ModelConfig

logger = logging.getLogger(__name__)

PROGRESS_MIN_BYTES = 256 << 20   # smaller loads finish in about a second: no bar


class Shard(NamedTuple):
    """Indices ``[start, stop)`` along dimension ``dim`` of a tensor."""

    dim: int
    start: int
    stop: int


class CheckpointSlices:
    """The not yet taken tensors of a checkpoint, by name (see the module docstring)."""

    def __init__(self, stored: dict[str, StoredTensor], device: str | torch.device = "cpu",
                 progress: bool = True, expected_bytes: int | None = None,
                 description: str = "loading checkpoint"):
        """``expected_bytes``: what this rank will read (the bar's total; default: every
        tensor whole, the single-device case)."""
        self._stored = dict(stored)
        self.device = torch.device(device)
        self._files: dict[Path, object] = {}
        self.bytes_read = 0
        total = expected_bytes if expected_bytes is not None else \
            sum(t.nbytes for t in stored.values())
        self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=description,
                         disable=not progress or total < PROGRESS_MIN_BYTES)

    @classmethod
    def open(cls, path: str | os.PathLike, config: ModelConfig,
             device: str | torch.device = "cpu", progress: bool = True,
             expected_bytes: int | None = None,
             description: str = "loading checkpoint") -> "CheckpointSlices":
        """Every text tensor of the checkpoint at ``path``, checked against ``config``."""
        stored = read_checkpoint_headers(path)
        specs = check_tensors(config, stored, source=f"checkpoint {path}")
        return cls({name: stored[name] for name in specs}, device, progress, expected_bytes,
                   description)

    def __contains__(self, name: object) -> bool:
        return name in self._stored

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._stored))

    def __len__(self) -> int:
        return len(self._stored)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._stored[name].shape

    def pop(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        """Read ``name`` (whole, or the ``shard`` of it) onto the device; it is then taken."""
        stored = self._stored.pop(name)
        handle = self._handle(stored.file)
        if shard is not None and (shard.start, shard.stop) == (0, stored.shape[shard.dim]):
            shard = None
        if shard is None:
            value = handle.get_tensor(name)
        else:
            index = [slice(None)] * len(stored.shape)
            index[shard.dim] = slice(shard.start, shard.stop)
            value = handle.get_slice(name)[tuple(index)]
        value = value.to(self.device)
        nbytes = value.numel() * value.element_size()
        self.bytes_read += nbytes
        self._bar.update(nbytes)
        return value

    def discard(self, name: str) -> None:
        """Take ``name`` without reading it (a tensor another rank holds)."""
        del self._stored[name]

    def close(self) -> None:
        """Close the files and the progress bar (tensors not taken are never read)."""
        self._files.clear()
        self._bar.close()
        logger.info("read %.3f GB of checkpoint tensors onto %s", self.bytes_read / 1e9,
                    self.device)

    def _handle(self, file: Path):
        if file not in self._files:
            # on a GPU straight onto it: a tensor's bytes are read as the bar counts them
            self._files[file] = safe_open(file, framework="pt", device=str(self.device))
        return self._files[file]
