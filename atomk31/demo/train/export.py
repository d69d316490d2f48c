"""Writing the trainer's model as a release-format checkpoint (MODEL_SPEC §3), and reading one
back into it (`--init-from`, to continue training from shipped weights).

Names get the `language_model.` prefix; dtypes are the schema's preferred ones (BF16 weights,
F32 small vectors); the stacked routed experts become `experts.{e}.w{1,3,2}.weight_packed` and
`.weight_scale` (MXFP4, §3.3) with the quantizer the trainer's quantization-aware forward uses,
so the shipped values are the ones the model was trained and selected with. The directory gets
config.json, generation_config.json (eos = `<|end_of_msg|>`), the demo tokenizer and
`model.safetensors`, and is checked with the engine's checkpoint loader before it is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from atomk31.checkpoint import expected_tensors, load_checkpoint
from atomk31.checkpoint.schema import TEXT_PREFIX
from atomk31.checkpoint.tokenizer import TIKTOKEN_FILE, TOKENIZER_CONFIG_FILE
from atomk31.checkpoint.tokenizer_writer import END_OF_MESSAGE
from atomk31.config import ModelConfig
from atomk31.demo.train.model import DemoModel
from atomk31.quant import dequantize_mxfp4, quantize_mxfp4

_EXPERT_MATRICES = {"experts_w1": "w1", "experts_w3": "w3", "experts_w2": "w2"}


def checkpoint_tensors(model: DemoModel) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor of `model`, named and typed as the schema says."""
    specs = expected_tensors(model.config)
    tensors: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        stem, _, leaf = name.rpartition(".")
        if leaf in _EXPERT_MATRICES:
            for expert, matrix in enumerate(value.detach().float().cpu()):
                packed, scales = quantize_mxfp4(matrix)
                base = f"{TEXT_PREFIX}{stem}.experts.{expert}.{_EXPERT_MATRICES[leaf]}"
                tensors[base + ".weight_packed"], tensors[base + ".weight_scale"] = packed, scales
            continue
        full = TEXT_PREFIX + name
        if full not in specs:
            raise ValueError(f"the trainer's parameter {name} has no checkpoint tensor "
                             f"{full}; the model and MODEL_SPEC §3 disagree")
        tensors[full] = value.detach().cpu().to(specs[full].dtypes[0]).contiguous()
    missing = sorted(set(specs) - set(tensors))
    if missing:
        raise ValueError(f"the trainer's model lacks checkpoint tensors, e.g. {missing[:3]}")
    return tensors


def write_checkpoint(model: DemoModel, config_json: dict[str, Any], tokenizer_dir: Path,
                     out: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the checkpoint into `out` atomically (a sibling temp dir, checked, then renamed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    (staging / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    for file in (TIKTOKEN_FILE, TOKENIZER_CONFIG_FILE):
        shutil.copy(tokenizer_dir / file, staging / file)
    specials = json.loads((tokenizer_dir / TOKENIZER_CONFIG_FILE).read_text())["added_tokens_decoder"]
    ids = {entry["content"]: int(token_id) for token_id, entry in specials.items()}
    generation = {"bos_token_id": ids["[BOS]"], "eos_token_id": ids[END_OF_MESSAGE]}
    (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file(checkpoint_tensors(model), staging / "model.safetensors",
              metadata={"format": "pt", **(metadata or {})})
    load_checkpoint(staging, ModelConfig.from_dict(config_json), progress=False)  # raises if off
    staging.chmod(0o755)                       # mkdtemp makes it private; a checkpoint is shared
    for file in staging.iterdir():
        file.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return out


def read_checkpoint(model: DemoModel, path: Path) -> None:
    """Load the weights of the checkpoint at `path` (written by `write_checkpoint` for the same
    config) into `model`: BF16 values as float32 masters, experts dequantized from MXFP4."""
    tensors = load_file(Path(path) / "model.safetensors")
    state = {}
    for name, value in model.state_dict().items():
        stem, _, leaf = name.rpartition(".")
        if leaf in _EXPERT_MATRICES:
            base = f"{TEXT_PREFIX}{stem}.experts.{{}}.{_EXPERT_MATRICES[leaf]}"
            state[name] = torch.stack([
                dequantize_mxfp4(tensors[base.format(e) + ".weight_packed"],
                                 tensors[base.format(e) + ".weight_scale"])
                for e in range(value.shape[0])])
        elif TEXT_PREFIX + name in tensors:
            stored = tensors[TEXT_PREFIX + name]
            if stored.numel() != value.numel():
                raise ValueError(f"{path}: {TEXT_PREFIX + name} has shape {list(stored.shape)}, "
                                 f"the model's is {list(value.shape)}; the checkpoint was written "
                                 f"for another config")
            state[name] = stored.float().reshape(value.shape)
        else:
            raise ValueError(f"{path} has no tensor {TEXT_PREFIX + name}; the checkpoint was "
                             f"written for another config")
    model.load_state_dict(state)
