"""Reading a checkpoint's text tensors from safetensors files, one file or sharded (MODEL_SPEC §3, §9 #16)."""

import json
import logging
import os

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

TEXT_PREFIX = "language_model."
_SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.", TEXT_PREFIX + "vision_tower.", TEXT_PREFIX + "mm_projector.")
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(model_dir: str | os.PathLike) -> dict[str, str]:
    """Map of tensor name -> safetensors file path.

    Trusts `model.safetensors.index.json`'s weight_map when present; otherwise reads every
    `*.safetensors` file of the directory (§9 #16).
    """
    model_dir = os.fspath(model_dir)
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path} has no weight_map object; expected {{'weight_map': {{name: file}}}}")
        return {name: os.path.join(model_dir, file) for name, file in weight_map.items()}
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files and no {INDEX_FILE} in {model_dir}; expected a checkpoint directory")
    locations: dict[str, str] = {}
    for file in files:
        path = os.path.join(model_dir, file)
        with safe_open(path, framework="pt") as handle:
            locations.update({name: path for name in handle.keys()})
    return locations


def read_text_tensors(model_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All text tensors, names without the `language_model.` prefix.

    Floating tensors (bf16 or f32 in the file) become float32 once, here (§9 #1); integer
    tensors (MXFP4 bytes) keep their dtype. Vision tensors are skipped.
    """
    by_file: dict[str, list[str]] = {}
    for name, path in checkpoint_files(model_dir).items():
        if not name.startswith(_SKIPPED_PREFIXES):
            by_file.setdefault(path, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for path, names in sorted(by_file.items()):
        if not os.path.isfile(path):
            raise ValueError(f"the weight_map names {path}, which does not exist; re-download the checkpoint")
        with safe_open(path, framework="pt") as handle:
            for name in names:
                tensor = handle.get_tensor(name)
                key = name[len(TEXT_PREFIX) :] if name.startswith(TEXT_PREFIX) else name
                tensors[key] = tensor.float() if tensor.is_floating_point() else tensor
    logger.debug("read %d text tensors from %s", len(tensors), model_dir)
    return tensors
