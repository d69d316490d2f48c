"""Write random checkpoints: `make_checkpoint("tiny", seed=0, out="/tmp/tiny")`.

A checkpoint directory gets `config.json`, the weights (one `model.safetensors` when they fit
in one shard, else `model-0000i-of-0000N.safetensors` + `model.safetensors.index.json`,
MODEL_SPEC §9 #16), `generation_config.json` (eos = `<|end_of_msg|>`, CHAT_FORMAT.md §4) and the
tokenizer files. Names, shapes and dtypes come from `schema.expected_tensors`, the values from
`random_init` (BF16 weights, F32 small vectors, MXFP4 routed experts).

Memory: shards are planned from sizes alone, then drawn and written one at a time, so peak host
memory is about one shard (`max_shard_bytes`) plus one tensor's float32 draw, whatever the model
size. Determinism: one torch.Generator seeded with `seed` draws every parameter in plan order,
so the values do not depend on `max_shard_bytes`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from atomk31.checkpoint.presets import preset_config
from atomk31.checkpoint.random_init import PlannedParameter, draw, plan_parameters
from atomk31.checkpoint.shards import INDEX_FILE, SINGLE_FILE
from atomk31.checkpoint.tokenizer_writer import END_OF_MESSAGE, write_tokenizer
from atomk31.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_BYTES = 2 << 30
# Writes smaller than this take a second or two: no progress bar.
PROGRESS_MIN_BYTES = 256 << 20


def make_checkpoint(preset: str, seed: int, out: str | os.PathLike,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                    progress: bool = True, device: str | torch.device = "cpu") -> Path:
    """Write the named preset (presets.py: "tiny", "proxy", "proxy-mini") with random weights.

    Returns the output directory. Existing weight files of an earlier checkpoint in `out`
    (`model.safetensors`, `model-*-of-*.safetensors`, the index) are replaced. ``device``:
    where the weights are drawn ("cuda" draws a real-width checkpoint in seconds; a seed then
    gives other values than on the CPU).
    """
    return write_random_checkpoint(preset_config(preset), seed, out,
                                   max_shard_bytes=max_shard_bytes, progress=progress,
                                   device=device)


def write_random_checkpoint(config_json: dict[str, Any], seed: int, out: str | os.PathLike,
                            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                            progress: bool = True, device: str | torch.device = "cpu") -> Path:
    """Write a random checkpoint for any valid config.json contents (root + text_config or
    flat), e.g. a plain-K3 variant of tiny without the indexer fields."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    config = ModelConfig.from_dict(config_json, source="the config to write")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_weights(out)
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    specials = write_tokenizer(out, config.vocab_size)
    generation = {"bos_token_id": specials["[BOS]"], "eos_token_id": specials[END_OF_MESSAGE]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shards = plan_shards(plan_parameters(config), max_shard_bytes)
    _write_shards(shards, seed, out, progress, torch.device(device))
    logger.info("wrote a random checkpoint (seed %d, %d shard(s)) to %s", seed, len(shards), out)
    return out


def plan_shards(plan: list[PlannedParameter],
                max_shard_bytes: int) -> list[list[PlannedParameter]]:
    """Split the plan, in order, into shards of at most `max_shard_bytes` each. A parameter
    larger than the limit gets a shard of its own; an MXFP4 pair never straddles shards."""
    shards: list[list[PlannedParameter]] = [[]]
    used = 0
    for parameter in plan:
        if shards[-1] and used + parameter.nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(parameter)
        used += parameter.nbytes
    return shards


def shard_file_names(num_shards: int) -> list[str]:
    """`model.safetensors` for one shard, else `model-0000i-of-0000N.safetensors` (§9 #16)."""
    if num_shards == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{num_shards:05d}.safetensors" for i in range(1, num_shards + 1)]


def _write_shards(shards: list[list[PlannedParameter]], seed: int, out: Path,
                  progress: bool, device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(seed)
    total_bytes = sum(p.nbytes for shard in shards for p in shard)
    names = shard_file_names(len(shards))
    weight_map: dict[str, str] = {}
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="writing checkpoint",
               disable=not progress or total_bytes < PROGRESS_MIN_BYTES)
    with bar:
        for file_name, shard in zip(names, shards):
            tensors: dict[str, torch.Tensor] = {}
            for parameter in shard:
                drawn = draw(parameter, generator)
                tensors.update({name: t.cpu() for name, t in drawn.items()})
                bar.update(parameter.nbytes)
            save_file(tensors, out / file_name, metadata={"format": "pt"})
            weight_map.update({name: file_name for name in tensors})
            del tensors  # free the shard before drawing the next one
    if len(shards) > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _remove_old_weights(out: Path) -> None:
    """A stale index or shard from an earlier write would shadow or pollute the new one."""
    stale = [out / INDEX_FILE, out / SINGLE_FILE, *out.glob("model-*-of-*.safetensors")]
    for file in stale:
        if file.is_file():
            logger.info("replacing %s", file)
            file.unlink()
