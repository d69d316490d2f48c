"""Load a safetensors checkpoint, checked against its config, shard by shard.

    tensors = load_checkpoint("/ckpt/tiny", ModelConfig.from_pretrained("/ckpt/tiny"))

Order of work: (1) find the files (MODEL_SPEC §9 #16: `model.safetensors.index.json`'s
weight_map, else `model.safetensors`, else every `*.safetensors`); (2) read only their headers and
check every name, shape and dtype against `schema.expected_tensors(config)`, raising one
CheckpointError that lists every problem; (3) read the tensors one shard at a time, in file
order, straight onto `device`. Routed experts stay as stored (MXFP4 `weight_packed` +
`weight_scale` uint8, or the dequantized variant): no conversion happens here.

`iter_checkpoint` yields `(name, tensor)` pairs as they are read, so an engine can place or
convert each tensor and drop it before the next one arrives: a 23 GB proxy never needs 23 GB
of host memory at once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from atomk31.checkpoint.shards import StoredTensor, read_checkpoint_headers
from atomk31.checkpoint.validate import check_tensors
from atomk31.config import ModelConfig

logger = logging.getLogger(__name__)

# Loads smaller than this finish in about a second: no progress bar.
PROGRESS_MIN_BYTES = 256 << 20


def load_checkpoint(path: str | os.PathLike, config: ModelConfig,
                    device: str | torch.device = "cpu",
                    dtype_map: dict[torch.dtype, torch.dtype] | None = None,
                    progress: bool = True) -> dict[str, torch.Tensor]:
    """Every text tensor of the checkpoint at `path`, by name, on `device`.

    Args:
        path: checkpoint directory (or a single .safetensors file).
        config: the model config the checkpoint must match (every tensor is checked).
        device: where tensors are placed as they are read ("cpu", "cuda:0", ...).
        dtype_map: optional stored dtype -> dtype conversions applied after checking, e.g.
            `{torch.bfloat16: torch.float32}`. uint8 (MXFP4 packed data and E8M0 scales) cannot
            be mapped: it is not a number format that a cast can convert.
        progress: show a progress bar (only for loads of at least 256 MiB).

    Returns:
        name -> tensor, with shapes and dtypes as `schema.expected_tensors` states them
        (vision tower tensors are skipped).

    Raises:
        CheckpointError: no weights found, an index naming absent shards, or any missing,
            unused, mismatched or rejected tensor (all listed in one message).
    """
    return dict(iter_checkpoint(path, config, device=device, dtype_map=dtype_map,
                                progress=progress))


def iter_checkpoint(path: str | os.PathLike, config: ModelConfig,
                    device: str | torch.device = "cpu",
                    dtype_map: dict[torch.dtype, torch.dtype] | None = None,
                    progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Like load_checkpoint, but yields `(name, tensor)` one at a time, shard by shard.

    The whole checkpoint is checked before this returns, so an error surfaces at the call,
    never halfway through a load.
    """
    _check_dtype_map(dtype_map)
    stored = read_checkpoint_headers(path)
    specs = check_tensors(config, stored, source=f"checkpoint {path}")
    wanted = [stored[name] for name in specs]
    return _read_tensors(wanted, str(torch.device(device)), dtype_map or {}, progress)


def _read_tensors(wanted: list[StoredTensor], device: str,
                  dtype_map: dict[torch.dtype, torch.dtype],
                  progress: bool) -> Iterator[tuple[str, torch.Tensor]]:
    by_file: dict[Path, list[StoredTensor]] = {}
    for tensor in wanted:
        by_file.setdefault(tensor.file, []).append(tensor)
    total_bytes = sum(t.nbytes for t in wanted)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="loading checkpoint",
               disable=not progress or total_bytes < PROGRESS_MIN_BYTES)
    logger.info("loading %d tensors (%.2f GB) from %d file(s) onto %s", len(wanted),
                total_bytes / 1e9, len(by_file), device)
    with bar:
        for file in sorted(by_file):
            with safe_open(file, framework="pt", device=device) as f:
                # Data-section order: the file is read front to back.
                for tensor in sorted(by_file[file], key=lambda t: t.offset):
                    value = f.get_tensor(tensor.name)
                    if value.dtype in dtype_map:
                        value = value.to(dtype_map[value.dtype])
                    yield tensor.name, value
                    bar.update(tensor.nbytes)


def _check_dtype_map(dtype_map: dict[torch.dtype, torch.dtype] | None) -> None:
    for source, target in (dtype_map or {}).items():
        if not isinstance(source, torch.dtype) or not isinstance(target, torch.dtype):
            raise ValueError(f"dtype_map must map torch dtypes to torch dtypes, got "
                             f"{source!r} -> {target!r}")
        if source == torch.uint8:
            raise ValueError("dtype_map cannot convert torch.uint8: those tensors are MXFP4 "
                             "packed codes and E8M0 scales; dequantize them with "
                             "atomk31.quant.dequantize_mxfp4 instead")
