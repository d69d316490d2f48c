"""The tiny (MODEL_SPEC §2.4) and proxy (§2.3 widths, 8 layers, 64 experts) presets."""

import pytest

from atomk31.checkpoint import PRESETS, preset_config
from atomk31.checkpoint.presets import QUANTIZATION_CONFIG
from atomk31.config import ModelConfig

# MODEL_SPEC §3.4, typed out again here so a drift in presets.py cannot go unnoticed.
SPEC_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed", "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "targets": ["Linear"],
        "input_activations": None, "output_activations": None,
        "weights": {"type": "float", "num_bits": 4, "group_size": 32, "strategy": "group",
                    "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"}}},
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
               "re:.*vision_tower.*", "re:.*mm_projector.*"],
}


@pytest.mark.parametrize("name", ["tiny", "proxy"])
def test_preset_is_a_valid_root_plus_text_config(name: str) -> None:
    config_json = preset_config(name)
    assert config_json["model_type"] == "kimi_k3"
    assert config_json["architectures"] == ["KimiK3ForConditionalGeneration"]
    text = config_json["text_config"]
    assert text["model_type"] == "kimi_linear"
    assert text["quantization_config"] == SPEC_QUANTIZATION_CONFIG  # inside text_config, §2.1
    config = ModelConfig.from_dict(config_json)
    assert config.quantization_config == SPEC_QUANTIZATION_CONFIG
    assert config.mla_layer_ids == (3, 7) and config.kda_layer_ids == (0, 1, 2, 4, 5, 6)


def test_tiny_is_model_spec_2_4() -> None:
    config = ModelConfig.from_dict(preset_config("tiny"))
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (1024, 256, 8)
    assert config.max_position_embeddings == 4096
    assert (config.num_attention_heads, config.q_lora_rank, config.kv_lora_rank) == (4, 256, 512)
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim) == (128, 64, 128)
    assert (config.index_n_heads, config.index_head_dim, config.index_topk) == (4, 128, 64)
    assert (config.kda_num_heads, config.kda_head_dim, config.short_conv_kernel_size) == (4, 128, 4)
    assert config.gate_lower_bound == -5.0 and config.intermediate_size == 512
    assert (config.activation_situ_beta, config.activation_situ_linear_beta) == (4.0, 25.0)
    assert config.num_experts == 16 and config.num_experts_per_token == 4
    assert config.num_shared_experts == 2
    assert (config.moe_intermediate_size, config.routed_expert_hidden_size) == (128, 128)
    assert config.latent_moe_use_norm and config.moe_renormalize
    assert config.routed_scaling_factor == 1.0 and config.first_k_dense_replace == 1
    assert config.moe_layer_freq == 1 and config.attn_res_block_size == 3
    assert "media_placeholder_token_id" not in preset_config("tiny")


def test_proxy_has_the_full_model_widths() -> None:
    config_json = preset_config("proxy")
    config = ModelConfig.from_dict(config_json)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (163840, 7168, 8)
    assert config.max_position_embeddings == 1048576
    assert (config.num_attention_heads, config.q_lora_rank, config.kv_lora_rank) == (96, 1536, 512)
    assert (config.index_n_heads, config.index_head_dim, config.index_topk) == (32, 128, 2048)
    assert (config.kda_num_heads, config.kda_head_dim) == (96, 128)
    assert config.intermediate_size == 33792
    assert config.num_experts == 64 and config.num_experts_per_token == 16
    assert config.num_shared_experts == 2
    assert (config.routed_expert_hidden_size, config.moe_intermediate_size) == (3584, 3072)
    assert config.attn_res_block_size == 12
    assert config_json["media_placeholder_token_id"] == 163605


def test_preset_config_returns_independent_copies() -> None:
    first = preset_config("tiny")
    first["text_config"]["hidden_size"] = 1
    first["text_config"]["quantization_config"]["ignore"].append("x")
    assert preset_config("tiny")["text_config"]["hidden_size"] == 256
    assert PRESETS["tiny"]["text_config"]["quantization_config"] == SPEC_QUANTIZATION_CONFIG
    assert dict(QUANTIZATION_CONFIG)["ignore"] == SPEC_QUANTIZATION_CONFIG["ignore"]


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown checkpoint preset 'huge'; expected one of "
                                         r"\['proxy', 'proxy-mini', 'tiny'\]"):
        preset_config("huge")
