"""Speculative decoding options: the `--speculative-config` JSON and the DSpark draft's config.

`--speculative-config '{"model": DIR, "num_speculative_tokens": 5, "method": "dspark",
"draft_sample_method": "probabilistic"}'` (or `LLM(speculative_config={...})`) names a DSpark
draft checkpoint (MODEL_SPEC §5). `config.py` checks the option's shape when the EngineConfig
is built (`speculative_option_problems`) and, once the target's ModelConfig is known, reads the
draft's config.json and checks it against the target (`resolve_speculative_config`): every
problem of both is listed in one ConfigError.

Decisions where MODEL_SPEC §5 is silent:
- `method` defaults to "dspark" (the only method) and `draft_sample_method` to "probabilistic"
  (drafts of sampled requests drawn from the Markov head's processed distribution, §5.5);
  "greedy" drafts the argmax for every request. Greedy requests always draft the argmax.
- `num_speculative_tokens` is 1..MAX_SPECULATIVE_TOKENS.
- `"model": "builtin"` names the built-in model's draft, shipped beside its weights
  (`builtin_draft_dir`).
- The draft's `hidden_size` must equal the target's (it shares the target's embedding and LM
  head, §5.2), and `kv_lora_rank + qk_rope_head_dim` the target's latent width (its rows live in
  the target's cache pages in the target's latent format, §5.4).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomk31.config_checks import ConfigError, check_fields

SPECULATIVE_METHODS = ("dspark",)
DRAFT_SAMPLE_METHODS = ("probabilistic", "greedy")
MAX_SPECULATIVE_TOKENS = 16
BUILTIN_DRAFT = "builtin"
# Where the built-in model's trained draft is shipped (the trainer of the built-in model writes
# it beside the target's weights).
BUILTIN_DRAFT_DIR = Path(__file__).resolve().parent / "demo" / "weights" / "dspark"
_BUILTIN_DRAFT_FILES = ("config.json", "model.safetensors")

SPECULATIVE_OPTION_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "model": ((str,), True),
    "num_speculative_tokens": ((int,), True),
    "method": ((str,), False),
    "draft_sample_method": ((str,), False),
}

# Keys HuggingFace writes into every config; they carry no model meaning here.
_IGNORED_DRAFT_KEYS = frozenset({
    "architectures", "dtype", "torch_dtype", "transformers_version", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "tie_word_embeddings", "attention_bias", "attention_dropout",
})
DRAFT_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "model_type": ((str,), True),
    "hidden_size": ((int,), True),
    "num_hidden_layers": ((int,), True),
    "num_attention_heads": ((int,), True),
    "q_lora_rank": ((int,), True),
    "kv_lora_rank": ((int,), True),
    "qk_nope_head_dim": ((int,), True),
    "qk_rope_head_dim": ((int,), True),
    "v_head_dim": ((int,), True),
    "intermediate_size": ((int,), True),
    "hidden_act": ((str,), True),
    "rms_norm_eps": ((float, int), True),
    "vocab_size": ((int,), True),
    "max_position_embeddings": ((int,), True),
    "rope_parameters": ((dict,), True),
    "rope_interleave": ((bool,), False),
    "target_hidden_size": ((int,), True),
    "num_target_layers": ((int,), True),
    "target_layer_ids": ((list,), True),
    "mask_token_id": ((int,), True),
    "markov_rank": ((int,), True),
}
ROPE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "rope_type": ((str,), True),
    "rope_theta": ((float, int), True),
    "factor": ((float, int), True),
    "original_max_position_embeddings": ((int,), True),
    "beta_fast": ((float, int), True),
    "beta_slow": ((float, int), True),
    "mscale": ((float, int), True),
    "mscale_all_dim": ((float, int), True),
}
DRAFT_MODEL_TYPE = "k3_dspark"
_POSITIVE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
                    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                    "intermediate_size", "vocab_size", "max_position_embeddings",
                    "target_hidden_size", "num_target_layers", "markov_rank")


@dataclass(frozen=True)
class YarnRope:
    """The draft's YaRN rotary embedding ("deepseek_yarn", MODEL_SPEC §5.3)."""

    theta: float
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float


@dataclass(frozen=True)
class DraftConfig:
    """A DSpark draft's config.json (MODEL_SPEC §5.1), validated; layer ids are 0-based."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    max_position_embeddings: int
    rope: YarnRope
    rope_interleave: bool
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    markov_rank: int

    @property
    def latent_dim(self) -> int:
        """Width of one cached draft row: c (kv_lora_rank) ‖ rotated k_r (qk_rope_head_dim)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "DraftConfig":
        """Read and validate `<path>/config.json` (or `path` itself if it is a file)."""
        p = Path(path)
        file = p / "config.json" if p.is_dir() else p
        if not file.is_file():
            raise ConfigError([f"no config.json at {file}; pass the draft checkpoint's "
                               "directory as the speculative config's \"model\""],
                              source="speculative_config")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError([f"not valid JSON: {e}"], source=str(file)) from e
        return cls.from_dict(data, source=str(file))

    @classmethod
    def from_dict(cls, data: Any, source: str = "draft config.json") -> "DraftConfig":
        problems: list[str] = []
        if not isinstance(data, dict):
            raise ConfigError([f"expected a JSON object, got {type(data).__name__}"], source)
        values = check_fields(data, DRAFT_FIELDS, _IGNORED_DRAFT_KEYS, "", problems)
        rope = data.get("rope_parameters")
        rope_values = (check_fields(rope, ROPE_FIELDS, frozenset(), "rope_parameters.", problems)
                       if isinstance(rope, dict) else {})
        _check_draft_semantics(values, rope_values, problems)
        if problems:
            raise ConfigError(problems, source)
        return cls(
            **{name: values[name] for name in (
                "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "intermediate_size", "vocab_size", "max_position_embeddings",
                "target_hidden_size", "mask_token_id", "markov_rank")},
            rms_norm_eps=float(values["rms_norm_eps"]),
            rope=YarnRope(float(rope_values["rope_theta"]), float(rope_values["factor"]),
                          rope_values["original_max_position_embeddings"],
                          float(rope_values["beta_fast"]), float(rope_values["beta_slow"]),
                          float(rope_values["mscale"]), float(rope_values["mscale_all_dim"])),
            rope_interleave=values.get("rope_interleave", True),   # §5.3: absent = interleaved
            target_layer_ids=tuple(values["target_layer_ids"]),
        )

    def problems_against(self, target: "ModelConfig", max_model_len: int) -> list[str]:
        """What keeps this draft from drafting for `target` (MODEL_SPEC §5.2, §5.4)."""
        problems = []
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab_size {self.vocab_size} differs from the target's "
                            f"{target.vocab_size} (the draft shares the target's LM head)")
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden_size {self.hidden_size} differs from the target's "
                            f"{target.hidden_size} (the draft shares the target's embedding "
                            "and LM head)")
        if self.target_hidden_size != target.hidden_size:
            problems.append(f"target_hidden_size {self.target_hidden_size} differs from the "
                            f"target's hidden_size {target.hidden_size}")
        outside = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if outside:
            problems.append(f"target_layer_ids {outside} are outside the target's layers "
                            f"0..{target.num_hidden_layers - 1}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} is outside the target's "
                            f"vocabulary [0, {target.vocab_size})")
        if self.latent_dim != target.latent_dim:
            problems.append(f"kv_lora_rank + qk_rope_head_dim = {self.latent_dim} differs from "
                            f"the target's latent width {target.latent_dim} (draft rows live "
                            "in the target's cache pages)")
        if self.max_position_embeddings < max_model_len:
            problems.append(f"max_position_embeddings {self.max_position_embeddings} is below "
                            f"the engine's context length {max_model_len}; lower "
                            "--max-model-len")
        return problems


def _check_draft_semantics(v: dict, rope: dict, problems: list[str]) -> None:
    if v.get("model_type", DRAFT_MODEL_TYPE) != DRAFT_MODEL_TYPE:
        problems.append(f"model_type: expected {DRAFT_MODEL_TYPE!r} (a DSpark draft, "
                        f"MODEL_SPEC §5.1), got {v['model_type']!r}")
    if v.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act: the draft's MLPs are SwiGLU (\"silu\", §5.2), got "
                        f"{v['hidden_act']!r}")
    for key in _POSITIVE_FIELDS:
        if key in v and v[key] < 1:
            problems.append(f"{key}: must be >= 1, got {v[key]}")
    if v.get("qk_rope_head_dim", 2) % 2:
        problems.append(f"qk_rope_head_dim: rotary pairs need an even width, got "
                        f"{v['qk_rope_head_dim']}")
    ids = v.get("target_layer_ids")
    if ids is not None:
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            problems.append(f"target_layer_ids: expected 0-based layer numbers, got {ids}")
        elif len(set(ids)) != len(ids):
            problems.append(f"target_layer_ids: layers listed twice: {ids}")
        elif "num_target_layers" in v and len(ids) != v["num_target_layers"]:
            problems.append(f"target_layer_ids: {len(ids)} entries but num_target_layers is "
                            f"{v['num_target_layers']}")
    if rope.get("rope_type", "yarn") != "yarn":
        problems.append(f"rope_parameters.rope_type: only \"yarn\" is supported (§5.3), got "
                        f"{rope['rope_type']!r}")
    for key in ("rope_theta", "factor", "original_max_position_embeddings"):
        if key in rope and rope[key] <= 0:
            problems.append(f"rope_parameters.{key}: must be > 0, got {rope[key]}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """The resolved speculative option: the draft's directory and config, and how it runs."""

    model: str
    num_speculative_tokens: int
    method: str
    draft_sample_method: str
    draft: DraftConfig


def speculative_option_problems(options: Any) -> list[str]:
    """Problems with the `--speculative-config` JSON itself (no file is read)."""
    if not isinstance(options, dict):
        return [f"speculative_config: expected a JSON object, got {type(options).__name__}"]
    problems: list[str] = []
    if isinstance(options.get("model"), os.PathLike):
        options = {**options, "model": os.fspath(options["model"])}
    values = check_fields(options, SPECULATIVE_OPTION_FIELDS, frozenset(),
                          "speculative_config.", problems)
    method = values.get("method", "dspark")
    if method not in SPECULATIVE_METHODS:
        problems.append(f"speculative_config.method: must be one of "
                        f"{', '.join(SPECULATIVE_METHODS)}, got {method!r}")
    sample = values.get("draft_sample_method", "probabilistic")
    if sample not in DRAFT_SAMPLE_METHODS:
        problems.append(f"speculative_config.draft_sample_method: must be one of "
                        f"{', '.join(DRAFT_SAMPLE_METHODS)}, got {sample!r}")
    count = values.get("num_speculative_tokens")
    if count is not None and not 1 <= count <= MAX_SPECULATIVE_TOKENS:
        problems.append(f"speculative_config.num_speculative_tokens: must be in "
                        f"1..{MAX_SPECULATIVE_TOKENS}, got {count}")
    return problems


def resolve_speculative_config(options: dict, target: "ModelConfig",
                               max_model_len: int) -> SpeculativeConfig:
    """Read the draft named by `options` and check it against `target`; ConfigError lists
    every problem. `options` passed `speculative_option_problems` already."""
    model = options["model"]
    directory = builtin_draft_dir() if model == BUILTIN_DRAFT else Path(model)
    draft = DraftConfig.from_pretrained(directory)
    problems = draft.problems_against(target, max_model_len)
    if problems:
        raise ConfigError(problems, source=f"draft {directory} against the target")
    return SpeculativeConfig(str(directory), options["num_speculative_tokens"],
                             options.get("method", "dspark"),
                             options.get("draft_sample_method", "probabilistic"), draft)


def builtin_draft_dir(directory: Path = BUILTIN_DRAFT_DIR) -> Path:
    """The built-in model's shipped DSpark draft (`"model": "builtin"`); ConfigError when this
    installation ships none."""
    if all((directory / name).is_file() for name in _BUILTIN_DRAFT_FILES):
        return directory
    raise ConfigError([f"\"model\": \"builtin\" names the built-in model's DSpark draft, but "
                       f"this installation ships none (no {' and '.join(_BUILTIN_DRAFT_FILES)} "
                       f"in {directory}); pass a draft checkpoint directory instead (e.g. one "
                       "written by `atomk31 make-checkpoint --preset tiny-dspark`)"],
                      source="speculative_config")
