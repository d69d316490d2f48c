"""expected_tensors: every tensor of MODEL_SPEC §3 for a config, and the config-driven variants."""

import pytest
import torch

from atomk31.checkpoint import TensorSpec, expected_tensors, preset_config
from atomk31.checkpoint.schema import dequantized_expert_tensors
from atomk31.config import ModelConfig
from k31_config import k31_pro_config

P = "language_model.model."


def _config(preset: str = "tiny", **text_changes) -> ModelConfig:
    config_json = preset_config(preset)
    for key, value in text_changes.items():
        if value is None and key.startswith("index_"):
            config_json["text_config"].pop(key)
        else:
            config_json["text_config"][key] = value
    return ModelConfig.from_dict(config_json)


def test_tiny_tensor_count_and_order() -> None:
    specs = expected_tensors(_config())
    # 5 global + 8 x 6 per-layer norms/AttnRes + 6 KDA x 14 + 2 MLA x (8 + 5 indexer)
    # + 1 dense x 3 + 7 MoE x (8 + 16 experts x 3 matrices x 2 tensors).
    assert len(specs) == 5 + 48 + 84 + 26 + 3 + 7 * (8 + 96) == 894
    names = list(specs)
    assert names[0] == P + "embed_tokens.weight" and names[-1] == "language_model.lm_head.weight"
    first_layer_1 = names.index(P + "layers.1.self_attention_res_norm.weight")
    assert all(".layers.0." in n for n in names[1:first_layer_1])  # written layer by layer


def test_tiny_shapes_and_dtypes_follow_section_3() -> None:
    specs = expected_tensors(_config())
    bf16, f32_or_bf16, u8 = (torch.bfloat16,), (torch.float32, torch.bfloat16), (torch.uint8,)
    expected = {
        "layers.0.self_attn.q_proj.weight": ((512, 256), bf16),
        "layers.0.self_attn.q_conv1d.weight": ((512, 1, 4), f32_or_bf16),
        "layers.0.self_attn.f_a_proj.weight": ((128, 256), bf16),
        "layers.0.self_attn.f_b_proj.weight": ((512, 128), bf16),
        "layers.0.self_attn.b_proj.weight": ((4, 256), bf16),
        "layers.0.self_attn.dt_bias": ((512,), f32_or_bf16),
        "layers.0.self_attn.o_norm.weight": ((128,), f32_or_bf16),
        "layers.0.self_attn.o_proj.weight": ((256, 512), bf16),
        "layers.0.mlp.down_proj.weight": ((256, 512), bf16),
        "layers.3.self_attn.q_b_proj.weight": ((4 * 192, 256), bf16),
        "layers.3.self_attn.kv_a_proj_with_mqa.weight": ((576, 256), bf16),
        "layers.3.self_attn.kv_b_proj.weight": ((4 * 256, 512), bf16),
        "layers.3.self_attn.g_proj.weight": ((512, 256), bf16),
        "layers.3.self_attn.indexer.wq_b.weight": ((512, 256), bf16),
        "layers.3.self_attn.indexer.wk.weight": ((128, 256), bf16),
        "layers.3.self_attn.indexer.k_norm.bias": ((128,), f32_or_bf16),
        "layers.3.self_attn.indexer.weights_proj.weight": ((4, 256), bf16),
        "layers.3.self_attention_res_proj.weight": ((1, 256), bf16),
        "layers.7.block_sparse_moe.gate.weight": ((16, 256), bf16),
        "layers.7.block_sparse_moe.gate.e_score_correction_bias": ((16,), f32_or_bf16),
        "layers.7.block_sparse_moe.routed_expert_norm.weight": ((128,), f32_or_bf16),
        "layers.7.block_sparse_moe.shared_experts.gate_proj.weight": ((256, 256), bf16),
        "layers.7.block_sparse_moe.experts.15.w1.weight_packed": ((128, 64), u8),
        "layers.7.block_sparse_moe.experts.15.w2.weight_scale": ((128, 4), u8),
    }
    for name, (shape, dtypes) in expected.items():
        assert specs[P + name] == TensorSpec(shape, dtypes, specs[P + name].min_numel), name
    assert specs[P + "layers.0.self_attn.A_log"].min_numel == 4


def test_proxy_total_bytes() -> None:
    specs = expected_tensors(_config("proxy"))
    d, v, h, hk, kc = 7168, 163840, 96, 96 * 128, 4
    global_bytes = 2 * (2 * v * d) + 3 * 2 * d
    per_layer = 6 * 2 * d
    kda = (4 * hk * d + 128 * d + hk * 128 + h * d + d * hk) * 2 + (3 * hk * kc + h + hk + 128) * 4
    indexer = (32 * 128 * 1536 + 128 * d + 32 * d) * 2 + 2 * 128 * 4
    mla = (1536 * d + 1536 + h * 192 * 1536 + 576 * d + 512 + h * 256 * 512 + 2 * hk * d) * 2
    dense = 3 * 33792 * d * 2
    experts = 64 * 3 * 3072 * 3584 * 17 // 32  # 4 bits + one E8M0 byte per 32 values
    moe = (64 * d + 2 * 3584 * d + 3 * 6144 * d) * 2 + (64 + 3584) * 4 + experts
    total = global_bytes + 8 * per_layer + 6 * kda + 2 * (mla + indexer) + dense + 7 * moe
    assert sum(spec.nbytes for spec in specs.values()) == total
    assert 20e9 < total < 25e9
    assert len(specs) == 5 + 48 + 6 * 14 + 2 * 13 + 3 + 7 * (8 + 64 * 6)


def test_plain_k3_has_no_indexer_tensors() -> None:
    specs = expected_tensors(_config(index_n_heads=None, index_head_dim=None, index_topk=None))
    assert not any(".indexer." in name for name in specs)
    assert P + "layers.3.self_attn.kv_b_proj.weight" in specs


def test_no_attn_res_tensors_without_attn_res() -> None:
    specs = expected_tensors(_config(attn_res_block_size=None))
    assert not any("_res_" in name for name in specs)
    assert P + "layers.0.input_layernorm.weight" in specs


def test_experts_without_a_latent_act_on_the_hidden_size() -> None:
    specs = expected_tensors(_config(routed_expert_hidden_size=None))
    moe = P + "layers.1.block_sparse_moe."
    assert moe + "routed_expert_down_proj.weight" not in specs
    assert moe + "routed_expert_norm.weight" not in specs
    assert specs[moe + "experts.0.w1.weight_packed"].shape == (128, 256 // 2)
    assert specs[moe + "experts.0.w2.weight_packed"].shape == (256, 128 // 2)


def test_optional_tensors_follow_their_flags() -> None:
    no_norm = expected_tensors(_config(latent_moe_use_norm=False))
    assert P + "layers.1.block_sparse_moe.routed_expert_norm.weight" not in no_norm
    assert P + "layers.1.block_sparse_moe.routed_expert_up_proj.weight" in no_norm
    no_gate = expected_tensors(_config(mla_use_output_gate=False))
    assert P + "layers.3.self_attn.g_proj.weight" not in no_gate
    assert P + "layers.2.self_attn.g_proj.weight" in no_gate      # the KDA output gate stays
    no_shared = expected_tensors(_config(num_shared_experts=0))
    assert not any("shared_experts" in name for name in no_shared)
    tied = expected_tensors(_config(tie_word_embeddings=True))
    assert "language_model.lm_head.weight" not in tied


def test_non_moe_layers_beyond_the_first_use_a_dense_mlp() -> None:
    specs = expected_tensors(_config(moe_layer_freq=2))             # MoE on even layers only
    assert P + "layers.1.mlp.gate_proj.weight" in specs
    assert P + "layers.2.block_sparse_moe.gate.weight" in specs


def test_dequantized_expert_form_has_logical_shapes() -> None:
    dense = dequantized_expert_tensors(_config("proxy"))
    assert len(dense) == 7 * 64 * 3
    assert dense[P + "layers.1.block_sparse_moe.experts.0.w1.weight"].shape == (3072, 3584)
    assert dense[P + "layers.7.block_sparse_moe.experts.63.w2.weight"].shape == (3584, 3072)


def test_expert_width_not_a_multiple_of_32_is_refused() -> None:
    config_json = preset_config("tiny")
    config_json["text_config"].update(routed_expert_hidden_size=None, hidden_size=240)
    with pytest.raises(ValueError, match=r"expert input width \(240\) .* multiples of 32"):
        expected_tensors(ModelConfig.from_dict(config_json))


def test_tensor_spec_shape_rules() -> None:
    exact = TensorSpec((4, 2), (torch.bfloat16,))
    assert exact.accepts_shape((4, 2)) and not exact.accepts_shape((2, 4))
    at_least = TensorSpec((4,), (torch.float32,), min_numel=4)
    assert at_least.accepts_shape((1, 1, 4, 1)) and at_least.accepts_shape((128,))
    assert not at_least.accepts_shape((3,)) and not at_least.accepts_shape((0,))
    assert exact.nbytes == 16 and at_least.nbytes == 16


def test_full_k3_1_pro_is_1_56_tb() -> None:
    """MODEL_SPEC §7.4's sanity check: §3's shapes for 93 layers and 896 experts total 1.56 TB."""
    specs = expected_tensors(ModelConfig.from_dict(k31_pro_config()))
    assert len(specs) == 5 + 93 * 6 + 69 * 14 + 24 * 13 + 3 + 92 * (8 + 896 * 6)
    assert 1.555e12 < sum(spec.nbytes for spec in specs.values()) < 1.565e12
