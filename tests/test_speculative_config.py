"""The speculative option and the DSpark draft config (atomk31/speculative_config.py): every
problem listed at once, the draft checked against the target, the builtin alias (issue 21)."""

import json

import pytest

from atomk31.checkpoint import preset_config
from atomk31.checkpoint.dspark_writer import draft_preset_config
from atomk31.config import ConfigError, EngineConfig, ModelConfig
from atomk31.speculative_config import (
    DraftConfig, builtin_draft_dir, resolve_speculative_config,
)

TARGET = ModelConfig.from_dict(preset_config("tiny"))


def draft_dir(tmp_path, edit=None):
    config = draft_preset_config("tiny-dspark")
    if edit:
        edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_tiny_dspark_is_valid_and_fits_the_tiny_target(tmp_path):
    config = DraftConfig.from_pretrained(draft_dir(tmp_path))
    assert config.target_layer_ids == (3, 4, 5, 6, 7) and config.latent_dim == 576
    assert config.rope_interleave and config.rope.factor == 4.0
    spec = resolve_speculative_config({"model": str(tmp_path), "num_speculative_tokens": 5},
                                      TARGET, 4096)
    assert (spec.method, spec.draft_sample_method, spec.num_speculative_tokens) == (
        "dspark", "probabilistic", 5)


def test_the_option_lists_every_problem():
    with pytest.raises(ConfigError) as info:
        EngineConfig(model="m", speculative_config={
            "num_speculative_tokens": 0, "method": "eagle", "draft_sample_method": "top",
            "draft_tp": 2})
    assert info.value.problems == [
        "speculative_config.model: missing",
        "speculative_config.draft_tp: unknown key (a typo? see MODEL_SPEC.md §2.2)",
        "speculative_config.method: must be one of dspark, got 'eagle'",
        "speculative_config.draft_sample_method: must be one of probabilistic, greedy, got "
        "'top'",
        "speculative_config.num_speculative_tokens: must be in 1..16, got 0",
    ]
    with pytest.raises(ConfigError, match="expected a JSON object, got list"):
        EngineConfig(model="m", speculative_config=[1])


def test_the_draft_is_checked_against_the_target_with_every_problem_listed(tmp_path):
    def edit(config):
        config.update(vocab_size=2048, hidden_size=128, target_hidden_size=512,
                      target_layer_ids=[3, 4, 5, 6, 9], mask_token_id=4000, kv_lora_rank=256,
                      max_position_embeddings=1024)
    with pytest.raises(ConfigError) as info:
        resolve_speculative_config({"model": str(draft_dir(tmp_path, edit)),
                                    "num_speculative_tokens": 3}, TARGET, 4096)
    assert info.value.problems == [
        "vocab_size 2048 differs from the target's 1024 (the draft shares the target's LM head)",
        "hidden_size 128 differs from the target's 256 (the draft shares the target's "
        "embedding and LM head)",
        "target_hidden_size 512 differs from the target's hidden_size 256",
        "target_layer_ids [9] are outside the target's layers 0..7",
        "mask_token_id 4000 is outside the target's vocabulary [0, 1024)",
        "kv_lora_rank + qk_rope_head_dim = 320 differs from the target's latent width 576 "
        "(draft rows live in the target's cache pages)",
        "max_position_embeddings 1024 is below the engine's context length 4096; lower "
        "--max-model-len",
    ]


def test_a_broken_draft_config_lists_every_problem(tmp_path):
    def edit(config):
        config.update(model_type="k3", hidden_act="gelu", qk_rope_head_dim=63, markov_rank=0,
                      target_layer_ids=[3, 4, 5, 6], rope_sclaing=1)
        config["rope_parameters"].update(rope_type="linear", factor=-1.0)
        del config["mask_token_id"]
    with pytest.raises(ConfigError) as info:
        DraftConfig.from_pretrained(draft_dir(tmp_path, edit))
    assert info.value.problems == [
        "mask_token_id: missing",
        "rope_sclaing: unknown key (a typo? see MODEL_SPEC.md §2.2)",
        "model_type: expected 'k3_dspark' (a DSpark draft, MODEL_SPEC §5.1), got 'k3'",
        "hidden_act: the draft's MLPs are SwiGLU (\"silu\", §5.2), got 'gelu'",
        "markov_rank: must be >= 1, got 0",
        "qk_rope_head_dim: rotary pairs need an even width, got 63",
        "target_layer_ids: 4 entries but num_target_layers is 5",
        "rope_parameters.rope_type: only \"yarn\" is supported (§5.3), got 'linear'",
        "rope_parameters.factor: must be > 0, got -1.0",
    ]


def test_a_missing_draft_directory_says_what_to_pass(tmp_path):
    with pytest.raises(ConfigError, match="no config.json at .*; pass the draft checkpoint's "
                                          "directory"):
        resolve_speculative_config({"model": str(tmp_path / "none"),
                                    "num_speculative_tokens": 3}, TARGET, 4096)


def test_builtin_names_the_shipped_draft_or_says_none_is_shipped(tmp_path):
    with pytest.raises(ConfigError, match="names the built-in model's DSpark draft, but this "
                                          "installation ships none"):
        builtin_draft_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert builtin_draft_dir(tmp_path) == tmp_path
