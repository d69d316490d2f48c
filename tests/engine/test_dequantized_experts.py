"""MXFP4 experts dequantized once at load (EngineConfig.dequantize_experts): the decision, and
the engine's logits, which must not change (the decode is exact in the compute dtype)."""

import pytest
import torch

import atomk31.config as config_module
from atomk31 import LLM, SamplingParams
from atomk31.checkpoint import preset_config
from atomk31.config import ConfigError, EngineConfig, ModelConfig

CPU = torch.device("cpu")


def tiny() -> ModelConfig:
    return ModelConfig.from_dict(preset_config("tiny"))


def resolved(**options):
    return EngineConfig(model="m", **options).resolve(tiny(), CPU)


def test_auto_dequantizes_for_torch_kernels_on_cpu_only():
    assert resolved().dequantize_experts
    assert resolved(kernel_backend="torch").dequantize_experts
    assert not resolved(kernel_backend="triton").dequantize_experts   # the kernels read MXFP4
    assert not resolved(dequantize_experts="off").dequantize_experts
    assert resolved(kernel_backend="triton", dequantize_experts="on").dequantize_experts


def test_auto_keeps_mxfp4_past_the_byte_limit(monkeypatch):
    config = tiny()
    size = config.dequantized_expert_bytes(4)
    # the tiny preset: 7 MoE layers (of 8; the first is dense) x 16 experts x w1, w2, w3, fp32
    per_expert = 3 * config.moe_intermediate_size * config.routed_expert_hidden_size * 4
    moe_layers = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    assert moe_layers == 7 and size == moe_layers * config.num_experts * per_expert
    assert config.dequantized_expert_bytes(4, ranks=2) == -(-size // 2)
    monkeypatch.setattr(config_module, "CPU_DEQUANTIZED_EXPERTS_MAX_BYTES", size - 1)
    assert not resolved().dequantize_experts
    monkeypatch.setattr(config_module, "CPU_DEQUANTIZED_EXPERTS_MAX_BYTES", size)
    assert resolved().dequantize_experts


def test_a_bad_value_is_reported():
    with pytest.raises(ConfigError, match="dequantize_experts must be one of auto, on, off, "
                                          "got 'yes'"):
        EngineConfig(model="m", dequantize_experts="yes")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dequantized_experts_give_the_same_logits(tiny_checkpoint, record_logits, pools_free,
                                                  dtype):
    prompt = list(range(3, 40))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    runs = {}
    for mode in ("off", "on"):
        llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", dtype=dtype,
                  dequantize_experts=mode)
        moe = [layer.ffn for layer in llm.engine.model.layers if hasattr(layer.ffn, "is_mxfp4")]
        assert moe and all(m.is_mxfp4 == (mode == "off") for m in moe)
        if mode == "on":
            assert all(m.w13.dtype == llm.engine.config.compute_dtype for m in moe)
            assert not hasattr(moe[0], "w13_packed")
        recorder = record_logits(llm)
        out = llm.generate([prompt], params)[0]
        runs[mode] = (out.outputs[0].token_ids, recorder.sequence_logits(out.request_id))
        pools_free(llm)
    assert runs["on"][0] == runs["off"][0]
    assert torch.equal(runs["on"][1], runs["off"][1])


def test_the_flag_reaches_the_engine_config():
    import argparse

    from server.launch import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--dequantize-experts", "off"]),
                                   "m").dequantize_experts == "off"
    assert engine_config_from_args(parser.parse_args([]), "m").dequantize_experts == "auto"
