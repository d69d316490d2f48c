"""ModelConfig and EngineConfig validation: every problem reported at once, by key (issue #2)."""

import json

import pytest

from atomk31.checkpoint import preset_config
from atomk31.config import ConfigError, EngineConfig, ModelConfig


def tiny() -> dict:
    return preset_config("tiny")


def problems_of(config: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict(config)
    return info.value.problems


def test_tiny_and_proxy_presets_are_valid():
    config = ModelConfig.from_dict(tiny())
    assert config.mla_layer_ids == (3, 7)
    assert config.kda_layer_ids == (0, 1, 2, 4, 5, 6)
    assert [layer for layer in range(8) if config.closes_attn_res_block(layer)] == [0, 3, 6]
    assert not config.is_moe_layer(0) and config.is_moe_layer(1)
    assert config.has_indexer and config.latent_dim == 576
    proxy = ModelConfig.from_dict(preset_config("proxy"))
    assert proxy.hidden_size == 7168 and proxy.num_experts == 64


def test_flat_text_config_and_quantization_config_at_root_are_accepted():
    root = tiny()
    text = root["text_config"]
    quant = text.pop("quantization_config")
    flat = ModelConfig.from_dict({**text, "quantization_config": quant})
    nested = ModelConfig.from_dict({**root, "quantization_config": quant})
    assert flat.quantization_config == nested.quantization_config == quant


def test_from_pretrained_reads_the_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny()))
    assert ModelConfig.from_pretrained(tmp_path).num_hidden_layers == 8
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)


def test_every_problem_is_reported_at_once_by_key():
    config = tiny()
    text = config["text_config"]
    del text["vocab_size"]
    text["hidden_sise"] = 256
    text["index_rope_head_dim"] = 64
    text["index_key_norm"] = "rmsnorm"
    text["index_topk_freq"] = 2
    text["index_layers"] = [4]
    text["hidden_act"] = "silu"
    text["num_attention_heads"] = "4"
    text["linear_attn_config"]["kda_layers"] = [1, 2, 3, 4, 6, 7]
    text["quantization_config"] = {"quant_method": "fp8", "ignore": ["lm_head"]}
    problems = problems_of(config)
    expected = [
        "vocab_size: missing",
        "hidden_sise: unknown key",
        "index_rope_head_dim: the indexer has no rotary embedding",
        "num_attention_heads: expected int, got \"4\"",
        "index_key_norm: the indexer's keys use LayerNorm",
        "index_topk_freq: top-k is not shared across layers",
        "index_layers: the sparse (indexer) layers must be the full-attention layers [4, 8]",
        "hidden_act: only \"situ\" is supported",
        "linear_attn_config: layers in both full_attn_layers and kda_layers: [4]",
        "linear_attn_config: layers in neither full_attn_layers nor kda_layers: [5]",
        "quantization_config: FP8 indexer weights are not supported",
    ]
    for message in expected:
        assert any(p.startswith(message) for p in problems), (message, problems)
    assert len(problems) == len(expected), problems


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["linear_attn_config"].update(full_attn_layers=[4, 8, 8]),
     "linear_attn_config.full_attn_layers: layers listed twice: [8]"),
    (lambda t: t["linear_attn_config"].update(kda_layers=[0, 1, 2, 3, 5, 6, 7]),
     "linear_attn_config.kda_layers: entries must be 1-based layer numbers in 1..8, got [0]"),
    (lambda t: t.update(index_head_dim=96), "index_head_dim: must be a multiple of 128, got 96"),
    (lambda t: t.update(index_topk=0), "index_topk: must be >= 1, got 0"),
    (lambda t: t.pop("index_n_heads"), "index_n_heads: missing (K3.1's indexer needs"),
    (lambda t: t.update(mla_use_nope=False), "mla_use_nope: must be true"),
    (lambda t: t["linear_attn_config"].update(use_full_rank_gate=False),
     "linear_attn_config.use_full_rank_gate: must be true"),
    (lambda t: t.update(num_expert_group=8), "num_expert_group: must be 1"),
    (lambda t: t.update(moe_intermediate_size=100), "moe_intermediate_size: must be a multiple of 32"),
    (lambda t: t.update(moe_router_activation_func="softmax"),
     "moe_router_activation_func: only \"sigmoid\" is supported"),
    (lambda t: t.update(mla_use_output_gate=1), "mla_use_output_gate: expected bool, got 1"),
    (lambda t: t.update(vocab_size=True), "vocab_size: expected int, got true"),
    (lambda t: t["linear_attn_config"].update(conv_size=4),
     "linear_attn_config.conv_size: unknown key"),
])
def test_single_problem_messages(edit, message):
    config = tiny()
    edit(config["text_config"])
    problems = problems_of(config)
    assert any(p.startswith(message) for p in problems), problems


def test_fp8_quantization_that_excludes_the_indexer_is_accepted():
    config = tiny()
    config["text_config"]["quantization_config"] = {
        "quant_method": "fp8", "ignore": ["re:.*indexer.*", "lm_head"]}
    ModelConfig.from_dict(config)


def test_plain_k3_without_indexer_is_accepted():
    config = tiny()
    for key in ("index_n_heads", "index_head_dim", "index_topk"):
        del config["text_config"][key]
    assert not ModelConfig.from_dict(config).has_indexer


def test_unknown_root_key_is_reported():
    config = tiny()
    config["text_confg"] = {}
    assert problems_of(config) == ["text_confg: unknown key at the root of the config"]


def test_engine_config_lists_every_bad_option():
    with pytest.raises(ConfigError) as info:
        EngineConfig(model="m", block_size=96, dtype="fp16", kv_cache_dtype="int8",
                     max_num_seqs=0, gpu_memory_utilization=1.5)
    assert info.value.problems == [
        "block_size must be a power of two, got 96; pass --block-size 64 or 128",
        "dtype must be one of auto, bfloat16, float32, got 'fp16'",
        "kv_cache_dtype must be one of auto, fp8, bf16, fp32, got 'int8'",
        "max_num_seqs must be >= 1, got 0",
        "gpu_memory_utilization must be in (0, 1], got 1.5",
    ]
