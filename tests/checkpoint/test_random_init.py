"""The parameter plan (no data) and the random draws of generated checkpoints."""

import math

import pytest
import torch

from atomk31.checkpoint import expected_tensors, preset_config
from atomk31.checkpoint.random_init import (
    InitRule,
    PlannedParameter,
    draw,
    init_rule,
    plan_parameters,
)
from atomk31.checkpoint.schema import TensorSpec
from atomk31.config import ModelConfig
from atomk31.quant import dequantize_mxfp4

P = "language_model.model."


def _plan(preset: str) -> tuple[list[PlannedParameter], dict[str, TensorSpec]]:
    config = ModelConfig.from_dict(preset_config(preset))
    return plan_parameters(config), expected_tensors(config)


@pytest.mark.parametrize("preset", ["tiny", "proxy"])
def test_plan_matches_the_schema(preset: str) -> None:
    plan, specs = _plan(preset)
    planned = [(name, shape, dtype) for p in plan
               for name, shape, dtype in zip(p.names, p.shapes, p.dtypes)]
    assert [name for name, _, _ in planned] == list(specs)          # same names, same order
    for name, shape, dtype in planned:
        assert specs[name].accepts_shape(shape) and dtype == specs[name].dtypes[0], name
    assert sum(p.nbytes for p in plan) == sum(s.nbytes for s in specs.values())


def test_proxy_plan_is_about_23_gb_with_one_draw_per_expert_matrix() -> None:
    plan, _ = _plan("proxy")
    mxfp4 = [p for p in plan if p.is_mxfp4]
    assert len(mxfp4) == 7 * 64 * 3
    assert mxfp4[0].draw_shape == (3072, 3584) and mxfp4[2].draw_shape == (3584, 3072)
    assert mxfp4[0].names[0].endswith("experts.0.w1.weight_packed")
    assert mxfp4[0].names[1].endswith("experts.0.w1.weight_scale")
    assert sum(p.nbytes for p in plan) == 22_873_732_096


def test_small_vectors_are_written_f32_and_the_rest_bf16() -> None:
    plan, _ = _plan("tiny")
    dtypes = {p.names[0]: p.dtypes[0] for p in plan if not p.is_mxfp4}
    assert dtypes[P + "layers.0.self_attn.A_log"] == torch.float32
    assert dtypes[P + "layers.0.self_attn.q_conv1d.weight"] == torch.float32
    assert dtypes[P + "layers.3.self_attn.indexer.k_norm.bias"] == torch.float32
    assert dtypes[P + "layers.1.block_sparse_moe.gate.e_score_correction_bias"] == torch.float32
    assert dtypes[P + "layers.3.self_attn.q_a_layernorm.weight"] == torch.bfloat16
    assert dtypes["language_model.lm_head.weight"] == torch.bfloat16


def _drawn(names: list[str]) -> dict[str, torch.Tensor]:
    plan, _ = _plan("tiny")
    generator = torch.Generator().manual_seed(0)
    by_name = {p.names[0]: p for p in plan}
    out = {}
    for name in names:
        out.update(draw(by_name[name], generator))
    return out


def test_linears_are_scaled_by_fan_in() -> None:
    names = [P + "layers.0.self_attn.q_proj.weight", P + "layers.0.mlp.down_proj.weight",
             P + "layers.3.self_attn.kv_b_proj.weight", P + "layers.0.self_attn.q_conv1d.weight",
             P + "layers.3.self_attention_res_proj.weight"]
    for name, tensor in _drawn(names).items():
        fan_in = tensor.shape[-1]
        std = tensor.float().std().item()
        assert abs(std * math.sqrt(fan_in) - 1) < 0.1, (name, std)


def test_norm_weights_near_one_and_gates_spread() -> None:
    layer = P + "layers.0.self_attn."
    drawn = _drawn([P + "layers.0.input_layernorm.weight", layer + "A_log", layer + "dt_bias",
                    P + "embed_tokens.weight"])
    norm = drawn[P + "layers.0.input_layernorm.weight"].float()
    assert abs(norm.mean().item() - 1) < 0.01 and 0.005 < norm.std().item() < 0.05
    rates = drawn[layer + "A_log"].exp()
    assert rates.min() >= 1 and rates.max() <= 16 and rates.shape == (4,)
    dt_bias = drawn[layer + "dt_bias"]
    assert dt_bias.min() >= -4 and dt_bias.max() <= 0 and dt_bias.std() > 0.5
    assert abs(drawn[P + "embed_tokens.weight"].float().std().item() - 1) < 0.05


def test_experts_are_quantized_fan_in_scaled_draws() -> None:
    name = P + "layers.1.block_sparse_moe.experts.0.w2.weight_packed"
    drawn = _drawn([name])
    packed, scale = drawn[name], drawn[name.replace("_packed", "_scale")]
    assert packed.dtype == scale.dtype == torch.uint8
    weight = dequantize_mxfp4(packed, scale)                          # [128, 128]
    assert abs(weight.std().item() * math.sqrt(128) - 1) < 0.15


def test_draws_are_deterministic_and_chunked_draws_fill_everything(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import atomk31.checkpoint.random_init as random_init

    parameter = PlannedParameter(names=("x",), shapes=((37, 5),), dtypes=(torch.float32,),
                                 draw_shape=(37, 5), rule=InitRule("uniform", low=2.0, high=3.0))
    first = draw(parameter, torch.Generator().manual_seed(7))["x"]
    again = draw(parameter, torch.Generator().manual_seed(7))["x"]
    other = draw(parameter, torch.Generator().manual_seed(8))["x"]
    assert torch.equal(first, again) and not torch.equal(first, other)
    monkeypatch.setattr(random_init, "MAX_DRAW_ELEMENTS", 10)         # 2 rows per chunk
    chunked = draw(parameter, torch.Generator().manual_seed(7))["x"]
    generator = torch.Generator().manual_seed(7)
    rows = [torch.rand((min(2, 37 - start), 5), generator=generator) + 2
            for start in range(0, 37, 2)]
    assert torch.equal(chunked, torch.cat(rows))                       # every row, in order


def test_unknown_one_dimensional_tensor_has_no_rule() -> None:
    with pytest.raises(ValueError, match="no init rule for .*mystery of shape \\[8\\]"):
        init_rule("language_model.model.mystery", TensorSpec((8,), (torch.float32,)))
