"""Which safetensors files a checkpoint has, and what their headers say.

MODEL_SPEC §9 #16: a reader trusts `model.safetensors.index.json`'s `weight_map` (tensor name ->
shard file); without one it reads `model.safetensors`, else every `*.safetensors` in the
directory. Only headers are read here (8-byte little-endian length + JSON), so a checkpoint of
any size is checked in milliseconds before a single weight is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from atomk31.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# A header larger than this is not a safetensors header (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000

# safetensors dtype names <-> torch dtypes (the ones a K3 checkpoint may hold, and neighbours).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
if hasattr(torch, "float8_e8m0fnu"):  # torch >= 2.7
    SAFETENSORS_DTYPES["F8_E8M0"] = torch.float8_e8m0fnu
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as a shard header describes it (nothing loaded)."""

    name: str
    file: Path
    dtype_name: str           # as written in the header, e.g. "BF16", "U8", "F8_E4M3"
    shape: tuple[int, ...]
    offset: int               # start of its bytes within the data section
    nbytes: int

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype, or None for a dtype atomk31 does not know."""
        return SAFETENSORS_DTYPES.get(self.dtype_name)


def read_header(file: Path) -> dict[str, StoredTensor]:
    """The tensors of one safetensors file, by name, from its header alone."""
    with open(file, "rb") as f:
        raw_length = f.read(8)
        if len(raw_length) < 8:
            raise CheckpointError(f"{file} is not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", raw_length)
        if length > _MAX_HEADER_BYTES:
            raise CheckpointError(f"{file} is not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{file} has an unreadable safetensors header: {e}") from e
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            tensors[name] = StoredTensor(name=name, file=file, dtype_name=entry["dtype"],
                                         shape=tuple(entry["shape"]), offset=start,
                                         nbytes=end - start)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{file}: header entry of {name} is not a safetensors tensor "
                                  f"entry (dtype, shape, data_offsets): {entry!r}") from e
    return tensors


def read_checkpoint_headers(path: str | os.PathLike) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint at `path` (a directory or one .safetensors file).

    Raises CheckpointError when there is nothing to read, when the index names a shard that is
    not there (listing each such shard and how many tensors it should hold), or when a tensor
    is in two files.
    """
    root = Path(path)
    if root.is_file():
        return read_header(root)
    if not root.is_dir():
        raise CheckpointError(f"no checkpoint at {root}: not a file or directory")
    if (root / INDEX_FILE).is_file():
        return _read_indexed(root)
    if (root / SINGLE_FILE).is_file():
        return read_header(root / SINGLE_FILE)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no checkpoint in {root}: expected {INDEX_FILE}, {SINGLE_FILE} or *.safetensors "
            f"files; pass the directory that holds the weights")
    logger.info("%s has no %s; reading all %d *.safetensors files", root, INDEX_FILE, len(files))
    tensors: dict[str, StoredTensor] = {}
    for file in files:
        for name, stored in read_header(file).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name} is in both {tensors[name].file.name} and "
                                      f"{file.name}; remove the stray file or add an index")
            tensors[name] = stored
    return tensors


def _read_indexed(root: Path) -> dict[str, StoredTensor]:
    index_path = root / INDEX_FILE
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path} is not a valid index (a JSON object with a "
                              f"'weight_map' of tensor name -> file): {e}") from e
    names_by_file: dict[str, list[str]] = {}
    for name, file_name in weight_map.items():
        names_by_file.setdefault(file_name, []).append(name)
    absent = [f for f in names_by_file if not (root / f).is_file()]
    if absent:
        lines = [f"  {f} ({len(names_by_file[f])} tensors, e.g. {names_by_file[f][0]})"
                 for f in sorted(absent)]
        raise CheckpointError(
            f"{index_path} maps tensors to {len(absent)} shard file(s) missing from {root}:\n"
            + "\n".join(lines) + "\nthe download is incomplete: fetch the missing shards")
    tensors: dict[str, StoredTensor] = {}
    not_held: list[str] = []
    for file_name in sorted(names_by_file):
        header = read_header(root / file_name)
        for name in names_by_file[file_name]:
            if name in header:
                tensors[name] = header[name]
            else:
                not_held.append(f"  {name} (index says {file_name})")
    if not_held:
        raise CheckpointError(
            f"{index_path} lists {len(not_held)} tensor(s) that their shard does not hold:\n"
            + "\n".join(not_held[:20])
            + (f"\n  ... and {len(not_held) - 20} more" if len(not_held) > 20 else "")
            + "\nthe index and the shards disagree: re-download or rewrite the index")
    return tensors
