"""Random tiny checkpoints in the MODEL_SPEC §3 layout for the reference tests (config §2.4).

The writer is the tests' own (no engine checkpoint writer): weights ~ N(0, 1/fan_in), norms
near 1, MXFP4 experts packed with the reference's quantizer. Small vectors alternate between
F32 and BF16 and A_log is padded to head_dim entries, as published fixtures do (§3.2).
"""

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from atomk31.reference import ReferenceModel, dequantize_mxfp4, quantize_mxfp4

QUANTIZATION_CONFIG = {
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

TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 8,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "mla_use_nope": True, "mla_use_output_gate": True,
    "index_n_heads": 4, "index_head_dim": 128, "index_topk": 64,
    "linear_attn_config": {"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7],
                           "num_heads": 4, "head_dim": 128, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True},
    "intermediate_size": 512, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
    "moe_intermediate_size": 128, "routed_expert_hidden_size": 128, "latent_moe_use_norm": True,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 1.0,
    "topk_method": "noaux_tc", "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "attn_res_block_size": 3,
    "quantization_config": QUANTIZATION_CONFIG,
}


def tiny_root_config(overrides: dict[str, Any] | None = None, removed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The §2.4 root config; `overrides` replace text-config fields, `removed` deletes them."""
    text = copy.deepcopy(TINY_TEXT_CONFIG)
    text.update(copy.deepcopy(overrides or {}))
    for name in removed:
        text.pop(name, None)
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
            "text_config": text, "vision_config": {"model_type": "moonvit"}}


class _RandomTensors:
    """Collects checkpoint tensors with a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.tensors: dict[str, torch.Tensor] = {}

    def normal(self, shape: tuple[int, ...], std: float) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator) * std

    def linear(self, name: str, out_features: int, in_features: int) -> None:
        self.tensors[name] = self.normal((out_features, in_features), in_features**-0.5).bfloat16()

    def norm(self, name: str, size: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.tensors[name] = (1.0 + self.normal((size,), 0.1)).to(dtype)

    def expert(self, name: str, out_features: int, in_features: int, packed: bool) -> None:
        weight = self.normal((out_features, in_features), in_features**-0.5)
        weight_packed, weight_scale = quantize_mxfp4(weight)
        if packed:
            self.tensors[name + ".weight_packed"] = weight_packed
            self.tensors[name + ".weight_scale"] = weight_scale
        else:
            self.tensors[name + ".weight"] = dequantize_mxfp4(weight_packed, weight_scale).bfloat16()


def _write_kda(out: _RandomTensors, a: str, text: dict[str, Any]) -> None:
    linear = text["linear_attn_config"]
    hidden, heads, head_dim = text["hidden_size"], linear["num_heads"], linear["head_dim"]
    width, channels = linear["short_conv_kernel_size"], heads * head_dim
    for proj in ("q_proj", "k_proj", "v_proj", "g_proj"):
        out.linear(a + proj + ".weight", channels, hidden)
    for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
        out.tensors[a + conv + ".weight"] = out.normal((channels, 1, width), 0.5).bfloat16()
    out.linear(a + "f_a_proj.weight", head_dim, hidden)
    out.linear(a + "f_b_proj.weight", channels, head_dim)
    out.linear(a + "b_proj.weight", heads, hidden)
    # A_log padded to head_dim entries; only the first num_heads are used (§3.2).
    out.tensors[a + "A_log"] = torch.log(torch.rand(head_dim, generator=out.generator) * 1.5 + 0.5)
    out.tensors[a + "dt_bias"] = torch.rand(channels, generator=out.generator) * 2.0 - 3.0
    out.norm(a + "o_norm.weight", head_dim, torch.float32)
    out.linear(a + "o_proj.weight", hidden, channels)


def _write_mla(out: _RandomTensors, a: str, text: dict[str, Any]) -> None:
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    q_rank, kv_rank = text["q_lora_rank"], text["kv_lora_rank"]
    nope, lane, value = text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"]
    out.linear(a + "q_a_proj.weight", q_rank, hidden)
    out.norm(a + "q_a_layernorm.weight", q_rank)
    out.linear(a + "q_b_proj.weight", heads * (nope + lane), q_rank)
    out.linear(a + "kv_a_proj_with_mqa.weight", kv_rank + lane, hidden)
    out.norm(a + "kv_a_layernorm.weight", kv_rank)
    out.linear(a + "kv_b_proj.weight", heads * (nope + value), kv_rank)
    out.linear(a + "g_proj.weight", heads * value, hidden)
    out.linear(a + "o_proj.weight", hidden, heads * value)
    if "index_topk" in text:
        index_heads, index_dim = text["index_n_heads"], text["index_head_dim"]
        out.linear(a + "indexer.wq_b.weight", index_heads * index_dim, q_rank)
        out.linear(a + "indexer.wk.weight", index_dim, hidden)
        out.norm(a + "indexer.k_norm.weight", index_dim, torch.float32)
        out.tensors[a + "indexer.k_norm.bias"] = out.normal((index_dim,), 0.1)
        out.linear(a + "indexer.weights_proj.weight", index_heads, hidden)


def _write_moe(out: _RandomTensors, e: str, text: dict[str, Any], packed: bool) -> None:
    hidden, experts, width = text["hidden_size"], text["num_experts"], text["moe_intermediate_size"]
    latent = text["routed_expert_hidden_size"]
    expert_in = hidden if latent is None else latent
    out.linear(e + "gate.weight", experts, hidden)
    out.tensors[e + "gate.e_score_correction_bias"] = out.normal((experts,), 0.1)
    if latent is not None:
        out.linear(e + "routed_expert_down_proj.weight", latent, hidden)
        out.norm(e + "routed_expert_norm.weight", latent, torch.float32)
        out.linear(e + "routed_expert_up_proj.weight", hidden, latent)
    shared = width * text["num_shared_experts"]
    out.linear(e + "shared_experts.gate_proj.weight", shared, hidden)
    out.linear(e + "shared_experts.up_proj.weight", shared, hidden)
    out.linear(e + "shared_experts.down_proj.weight", hidden, shared)
    for expert in range(experts):
        out.expert(f"{e}experts.{expert}.w1", width, expert_in, packed)
        out.expert(f"{e}experts.{expert}.w3", width, expert_in, packed)
        out.expert(f"{e}experts.{expert}.w2", expert_in, width, packed)


def random_text_tensors(root: dict[str, Any], seed: int = 0, packed_experts: bool = True) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (names with `language_model.`) for the text config inside `root`."""
    text = root["text_config"]
    out = _RandomTensors(seed)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    has_attn_res = text.get("attn_res_block_size") is not None
    p = "language_model.model."
    out.tensors[p + "embed_tokens.weight"] = out.normal((vocab, hidden), 1.0).bfloat16()
    out.norm(p + "norm.weight", hidden)
    if has_attn_res:
        out.norm(p + "output_attn_res_norm.weight", hidden)
        out.linear(p + "output_attn_res_proj.weight", 1, hidden)
    out.linear("language_model.lm_head.weight", vocab, hidden)
    mla_layers = {i - 1 for i in text["linear_attn_config"]["full_attn_layers"]}
    for layer in range(text["num_hidden_layers"]):
        prefix = f"{p}layers.{layer}."
        out.norm(prefix + "input_layernorm.weight", hidden)
        out.norm(prefix + "post_attention_layernorm.weight", hidden)
        if has_attn_res:
            for site in ("self_attention", "mlp"):
                out.norm(prefix + f"{site}_res_norm.weight", hidden)
                out.linear(prefix + f"{site}_res_proj.weight", 1, hidden)
        if layer in mla_layers:
            _write_mla(out, prefix + "self_attn.", text)
        else:
            _write_kda(out, prefix + "self_attn.", text)
        if layer >= text["first_k_dense_replace"]:
            _write_moe(out, prefix + "block_sparse_moe.", text, packed_experts)
        else:
            out.linear(prefix + "mlp.gate_proj.weight", text["intermediate_size"], hidden)
            out.linear(prefix + "mlp.up_proj.weight", text["intermediate_size"], hidden)
            out.linear(prefix + "mlp.down_proj.weight", hidden, text["intermediate_size"])
    out.tensors["vision_tower.patch_embed.weight"] = out.normal((4, 4), 1.0)   # must be skipped
    return out.tensors


def write_checkpoint(
    directory: Path, root: dict[str, Any], tensors: dict[str, torch.Tensor], num_shards: int = 1
) -> Path:
    """config.json plus one model.safetensors, or `num_shards` shards with an index (§9 #16)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(root, indent=1))
    if num_shards == 1:
        save_file(tensors, os.fspath(directory / "model.safetensors"))
        return directory
    names = sorted(tensors)
    weight_map = {}
    for shard in range(num_shards):
        file = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::num_shards]}
        save_file(part, os.fspath(directory / file))
        weight_map.update({name: file for name in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


TinyCheckpointWriter = Callable[..., Path]
TinyConfigFactory = Callable[..., dict[str, Any]]


@pytest.fixture(scope="session")
def make_tiny_config() -> TinyConfigFactory:
    """Factory: make_tiny_config(overrides=None, removed=()) -> a fresh §2.4 root config dict."""
    return tiny_root_config


@pytest.fixture(scope="session")
def make_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpointWriter:
    """Factory: make_tiny_checkpoint(name, overrides=None, removed=(), seed=0, packed_experts=True, num_shards=1)."""

    def make(
        name: str,
        overrides: dict[str, Any] | None = None,
        removed: tuple[str, ...] = (),
        seed: int = 0,
        packed_experts: bool = True,
        num_shards: int = 1,
    ) -> Path:
        root = tiny_root_config(overrides, removed)
        tensors = random_text_tensors(root, seed, packed_experts)
        return write_checkpoint(tmp_path_factory.mktemp(name), root, tensors, num_shards)

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_tiny_checkpoint: TinyCheckpointWriter) -> Path:
    return make_tiny_checkpoint("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path) -> ReferenceModel:
    return ReferenceModel.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_prompt() -> torch.Tensor:
    """100 tokens: longer than the tiny index_topk (64), so the indexer is active."""
    return torch.randint(0, 1024, (100,), generator=torch.Generator().manual_seed(1))
