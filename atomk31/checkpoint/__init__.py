"""Checkpoints: loading and checking safetensors, writing random test checkpoints, tokenizer.

* `load_checkpoint(path, config)`: every tensor, checked against the config (one
  CheckpointError lists all problems), read shard by shard; experts stay MXFP4 as stored.
* `expected_tensors(config)`: name -> TensorSpec for every tensor of MODEL_SPEC §3.
* `make_checkpoint(preset, seed, out)`: a random `tiny` or `proxy` checkpoint (PRESETS),
  with config.json, generation_config.json and tokenizer files.
* `Tokenizer.from_pretrained(path)`: the Kimi tiktoken tokenizer (real or generated files).
"""

from atomk31.checkpoint.errors import CheckpointError
from atomk31.checkpoint.loader import iter_checkpoint, load_checkpoint
from atomk31.checkpoint.presets import PRESETS, preset_config
from atomk31.checkpoint.schema import TensorSpec, expected_tensors
from atomk31.checkpoint.tokenizer import Tokenizer
from atomk31.checkpoint.writer import make_checkpoint, write_random_checkpoint

__all__ = [
    "PRESETS",
    "CheckpointError",
    "TensorSpec",
    "Tokenizer",
    "expected_tensors",
    "iter_checkpoint",
    "load_checkpoint",
    "make_checkpoint",
    "preset_config",
    "write_random_checkpoint",
]
