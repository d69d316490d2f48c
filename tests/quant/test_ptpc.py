"""PTPC-FP8 online quantizer (MODEL_SPEC §6.5): weight scales, eligibility, ATOM's config."""

import pytest
import torch

from atomk31.quant.ptpc import (
    is_ptpc_eligible, matches_exclude, parse_online_quant_config, quantize_linears_ptpc,
    quantize_weight_ptpc,
)

ATOM_CONFIG = {"global_quant_config": "ptpc_fp8",
               "exclude_layer": ["lm_head", "model.embed_tokens", "*self_attn.[qkv]_conv1d*",
                                 "*block_sparse_moe.experts*",
                                 "*block_sparse_moe.routed_expert_*"]}
L = "language_model.model.layers.3."


@pytest.mark.parametrize("variant,fmax", [("e4m3fn", 448.0), ("e4m3fnuz", 240.0)])
def test_quantize_weight_ptpc_one_scale_per_output_channel(variant, fmax):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(5, 33, generator=generator) * torch.tensor([1.0, 10.0, 0.01, 3.0, 0.0])[:, None]
    w_q, w_scale = quantize_weight_ptpc(weight.bfloat16(), variant)
    w = weight.bfloat16().float()
    expected_scale = w.abs().amax(1).clamp_min(1e-12) / fmax
    assert torch.equal(w_scale, expected_scale)
    assert torch.equal(w_q.float(), (w / expected_scale[:, None]).clamp(-fmax, fmax)
                       .to(w_q.dtype).float())
    assert w_q[:4].float().abs().amax(1).eq(fmax).all()        # each row's amax maps to fmax
    assert torch.equal(w_q[4].float(), torch.zeros(33))        # a zero row stays zero, no NaN
    relative = ((w_q.float() * w_scale[:, None] - w).abs().amax(1)[:4] / w.abs().amax(1)[:4])
    assert (relative <= 2 ** -4).all()                         # half an e4m3 step at most


def test_eligibility_follows_the_spec_exclusions_and_the_config():
    config = parse_online_quant_config(ATOM_CONFIG)
    matrix = torch.zeros(4, 4, dtype=torch.bfloat16)
    eligible = [L + "self_attn.q_proj.weight", L + "self_attn.f_b_proj.weight",
                L + "self_attn.kv_b_proj.weight", L + "block_sparse_moe.shared_experts.down_proj.weight",
                "language_model.model.layers.0.mlp.gate_proj.weight"]
    excluded = ["language_model.lm_head.weight", "language_model.model.embed_tokens.weight",
                L + "self_attn.q_conv1d.weight", L + "block_sparse_moe.experts.7.w1.weight",
                L + "block_sparse_moe.routed_expert_down_proj.weight",
                L + "block_sparse_moe.gate.weight", L + "self_attn.b_proj.weight",
                L + "self_attention_res_proj.weight", L + "self_attn.indexer.wk.weight",
                L + "self_attn.indexer.weights_proj.weight"]
    assert all(is_ptpc_eligible(n, matrix, config) for n in eligible)
    assert not any(is_ptpc_eligible(n, matrix, config) for n in excluded)
    assert not is_ptpc_eligible(L + "input_layernorm.weight", torch.zeros(4), config)
    assert not is_ptpc_eligible(L + "self_attn.q_proj.weight", matrix.to(torch.uint8), config)


def test_exclude_entries_match_like_atom():
    assert matches_exclude("lm_head", "lm_head") and not matches_exclude("lm_head_x", "lm_head")
    assert matches_exclude("model.layers.1.self_attn.q_proj", "model.layers.1")
    assert matches_exclude("model.layers.1.self_attn.k_conv1d", "*self_attn.[qkv]_conv1d*")
    assert matches_exclude("model.layers.2.mlp.down_proj", r"re:layers\.2\.mlp")
    assert not matches_exclude("model.layers.12.mlp.down_proj", r"re:layers\.2\.mlp")
    config = parse_online_quant_config({"global_quant_config": "ptpc_fp8",
                                        "exclude_layer": ["model.layers.3.self_attn.o_proj"]})
    assert not is_ptpc_eligible(L + "self_attn.o_proj.weight", torch.zeros(2, 2), config)


def test_quantize_linears_ptpc_adds_scales_and_passes_the_rest():
    weights = {L + "self_attn.q_proj.weight": torch.randn(8, 16).bfloat16(),
               L + "self_attn.b_proj.weight": torch.randn(2, 16).bfloat16(),
               L + "self_attn.A_log": torch.randn(2)}
    out = quantize_linears_ptpc(weights, ATOM_CONFIG)
    assert out[L + "self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert out[L + "self_attn.q_proj.weight_scale"].shape == (8,)
    assert out[L + "self_attn.b_proj.weight"] is weights[L + "self_attn.b_proj.weight"]
    assert out[L + "self_attn.A_log"] is weights[L + "self_attn.A_log"]
    assert len(out) == 4


def test_parse_online_quant_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="global_quant_config must be 'ptpc_fp8'"):
        parse_online_quant_config({"global_quant_config": "fp8"})
    with pytest.raises(ValueError, match=r"unknown keys \['exclude'\]"):
        parse_online_quant_config({"global_quant_config": "ptpc_fp8", "exclude": []})
    with pytest.raises(ValueError, match="exclude_layer must be a list of strings"):
        parse_online_quant_config({"global_quant_config": "ptpc_fp8", "exclude_layer": "lm_head"})
