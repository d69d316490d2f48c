"""Every tensor of a DSpark draft checkpoint (MODEL_SPEC §5.2), its check, and its loading.

Draft names carry no `language_model.` prefix. `expected_draft_tensors(config)` is ordered as a
writer generates them: the context projection and norm, layer by layer (norms, ungated MLA,
SwiGLU MLP), the final norm and the Markov head's two low-rank factors. Optional tensors:
`confidence_head.proj.{weight,bias}` (loaded if present, never needed, §5.5) and a draft's own
`embed_tokens.weight` / `lm_head.weight`, which are ignored because the target's are shared
(§5.2). `load_draft_checkpoint` checks every name, shape and dtype from the shard headers first
and reports every problem in one CheckpointError, as the target's loader does.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open

from atomk31.checkpoint.errors import CheckpointError
from atomk31.checkpoint.schema import BF16, F32_OR_BF16, TensorSpec
from atomk31.checkpoint.shards import DTYPE_NAMES, StoredTensor, read_checkpoint_headers
from atomk31.speculative_config import DraftConfig

# Tensors a draft release may carry that the engine does not need (MODEL_SPEC §5.2, §5.5).
IGNORED_DRAFT_TENSORS = ("embed_tokens.weight", "lm_head.weight")


def expected_draft_tensors(config: DraftConfig) -> dict[str, TensorSpec]:
    """Every required tensor of a draft for `config`, in writing order."""
    d, h = config.hidden_size, config.num_attention_heads
    specs = {
        "context_proj.weight": TensorSpec((d, len(config.target_layer_ids)
                                           * config.target_hidden_size), BF16),
        "context_norm.weight": TensorSpec((d,), BF16),
    }
    for i in range(config.num_hidden_layers):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        specs.update({
            p + "input_layernorm.weight": TensorSpec((d,), BF16),
            p + "post_attention_layernorm.weight": TensorSpec((d,), BF16),
            a + "q_a_proj.weight": TensorSpec((config.q_lora_rank, d), BF16),
            a + "q_a_layernorm.weight": TensorSpec((config.q_lora_rank,), BF16),
            a + "q_b_proj.weight": TensorSpec(
                (h * (config.qk_nope_head_dim + config.qk_rope_head_dim), config.q_lora_rank),
                BF16),
            a + "kv_a_proj_with_mqa.weight": TensorSpec((config.latent_dim, d), BF16),
            a + "kv_a_layernorm.weight": TensorSpec((config.kv_lora_rank,), BF16),
            a + "kv_b_proj.weight": TensorSpec(
                (h * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank), BF16),
            a + "o_proj.weight": TensorSpec((d, h * config.v_head_dim), BF16),
            p + "mlp.gate_proj.weight": TensorSpec((config.intermediate_size, d), BF16),
            p + "mlp.up_proj.weight": TensorSpec((config.intermediate_size, d), BF16),
            p + "mlp.down_proj.weight": TensorSpec((d, config.intermediate_size), BF16),
        })
    specs["final_norm.weight"] = TensorSpec((d,), BF16)
    for factor in ("markov_w1", "markov_w2"):
        specs[f"markov_head.{factor}.weight"] = TensorSpec((config.vocab_size,
                                                            config.markov_rank), BF16)
    return specs


def optional_draft_tensors(config: DraftConfig) -> dict[str, TensorSpec]:
    """The confidence head (§5.5): used by no engine path, checked when present."""
    width = config.hidden_size + config.markov_rank
    return {"confidence_head.proj.weight": TensorSpec((1, width), F32_OR_BF16),
            "confidence_head.proj.bias": TensorSpec((1,), F32_OR_BF16)}


def check_draft_tensors(config: DraftConfig, stored: dict[str, StoredTensor],
                        source: str = "draft checkpoint") -> dict[str, TensorSpec]:
    """The spec of every tensor to load, by name; CheckpointError lists every problem."""
    required, optional = expected_draft_tensors(config), optional_draft_tensors(config)
    specs = {**required, **{n: s for n, s in optional.items() if n in stored}}
    missing = [name for name in required if name not in stored]
    unused = [name for name in stored if name not in specs and name not in IGNORED_DRAFT_TENSORS]
    mismatched = [_mismatch(name, specs[name], stored[name]) for name in specs
                  if name in stored and not (specs[name].accepts_shape(stored[name].shape)
                                             and specs[name].accepts_dtype(stored[name].dtype))]
    if missing or unused or mismatched:
        lines = [f"{source} does not match its config.json (MODEL_SPEC §5.2):"]
        for title, items in (("missing tensors", missing), ("unused tensors", unused),
                             ("shape/dtype mismatches", mismatched)):
            if items:
                lines.append(f"  {title} ({len(items)}):")
                lines.extend(f"    {item}" for item in items)
        lines.append("  fix: make the draft's config.json and its weights agree (regenerate it "
                     "with `atomk31 make-checkpoint --preset tiny-dspark`, or use the config it "
                     "was written for)")
        raise CheckpointError("\n".join(lines), missing=missing, unused=unused,
                              mismatched=mismatched)
    return specs


def load_draft_checkpoint(path: str | os.PathLike, config: DraftConfig,
                          device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every draft tensor the engine uses, by name, on `device` (checked before reading)."""
    stored = read_checkpoint_headers(path)
    specs = check_draft_tensors(config, stored, source=f"draft checkpoint {path}")
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict = {}
    for name in specs:
        by_file.setdefault(stored[name].file, []).append(name)
    for file, names in sorted(by_file.items()):
        with safe_open(file, framework="pt", device=str(torch.device(device))) as f:
            for name in names:
                tensors[name] = f.get_tensor(name)
    return tensors


def _mismatch(name: str, spec: TensorSpec, tensor: StoredTensor) -> str:
    dtypes = "|".join(DTYPE_NAMES.get(d, str(d)) for d in spec.dtypes)
    return (f"{name}: expected shape {list(spec.shape)}, dtype {dtypes}; found shape "
            f"{list(tensor.shape)}, dtype {tensor.dtype_name}")
