"""Random DSpark draft checkpoints: `make_draft_checkpoint("tiny-dspark", seed=0, out=DIR)`.

A draft directory holds `config.json` (MODEL_SPEC §5.1 fields) and `model.safetensors` with the
tensors of `dspark_schema.expected_draft_tensors`, drawn with the target's init rules
(`random_init.init_rule`: linears N(0, 1/fan-in), norm weights 1 + N(0, 0.02²)), BF16, from one
generator seeded with `seed` in schema order. No tokenizer: the draft uses the target's.

Presets:
* `tiny-dspark`: MODEL_SPEC §5.8 verbatim (DEFINED HERE there), the draft of the `tiny` target:
  2 layers of width 256, rank-32 Markov head, taps on target layers 3..7, mask token 1023,
  YaRN θ 10000 × 4 over 1024 positions (= the tiny target's 4096).
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import torch
from safetensors.torch import save_file

from atomk31.checkpoint.dspark_schema import check_draft_tensors, expected_draft_tensors
from atomk31.checkpoint.random_init import PlannedParameter, draw, init_rule
from atomk31.checkpoint.shards import SINGLE_FILE, read_checkpoint_headers
from atomk31.speculative_config import DraftConfig

logger = logging.getLogger(__name__)

_TINY_DSPARK: dict[str, Any] = {
    "model_type": "k3_dspark", "architectures": ["K3DSparkModel"], "dtype": "bfloat16",
    "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "q_lora_rank": 256, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "intermediate_size": 512, "hidden_act": "silu", "rms_norm_eps": 1e-05,
    "vocab_size": 1024, "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                        "original_max_position_embeddings": 1024, "beta_fast": 32,
                        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_interleave": True,
    "target_hidden_size": 256, "num_target_layers": 5, "target_layer_ids": [3, 4, 5, 6, 7],
    "mask_token_id": 1023, "markov_rank": 32,
}

# name -> draft config.json contents. Read-only: use draft_preset_config() for a copy.
DRAFT_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"tiny-dspark": _TINY_DSPARK})


def draft_preset_config(name: str) -> dict[str, Any]:
    """A fresh, mutable copy of the named draft preset's config.json contents."""
    if name not in DRAFT_PRESETS:
        raise ValueError(f"unknown draft preset {name!r}; expected one of {sorted(DRAFT_PRESETS)}")
    return copy.deepcopy(dict(DRAFT_PRESETS[name]))


def make_draft_checkpoint(preset: str, seed: int, out: str | os.PathLike,
                          device: str | torch.device = "cpu") -> Path:
    """Write the named draft preset with random weights into `out`; returns `out`."""
    return write_random_draft(draft_preset_config(preset), seed, out, device)


def write_random_draft(config_json: dict[str, Any], seed: int, out: str | os.PathLike,
                       device: str | torch.device = "cpu") -> Path:
    """Write a random draft for any valid draft config.json contents."""
    config = DraftConfig.from_dict(config_json, source="the draft config to write")
    generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, spec in expected_draft_tensors(config).items():
        parameter = PlannedParameter(names=(name,), shapes=(spec.shape,),
                                     dtypes=(spec.dtypes[0],), draw_shape=spec.shape,
                                     rule=init_rule(name, spec))
        tensors.update({n: t.cpu() for n, t in draw(parameter, generator).items()})
    write_draft(config_json, tensors, out)
    logger.info("wrote a random DSpark draft (seed %d) to %s", seed, out)
    return Path(out)


def write_draft(config_json: dict[str, Any], tensors: Mapping[str, torch.Tensor],
                out: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> Path:
    """Write a draft's config.json and its tensors (the schema's tensors cast to its dtype)
    into `out`, then check what was written as the engine's loader does (CheckpointError)."""
    config = DraftConfig.from_dict(config_json, source="the draft config to write")
    specs = expected_draft_tensors(config)
    typed = {name: value.detach().cpu().to(specs[name].dtypes[0] if name in specs
                                           else value.dtype).contiguous()
             for name, value in tensors.items()}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    save_file(typed, out / SINGLE_FILE, metadata={"format": "pt", **(metadata or {})})
    check_draft_tensors(config, read_checkpoint_headers(out), source=f"the draft written to {out}")
    return out
