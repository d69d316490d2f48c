"""The configs that `make_checkpoint` can generate: `tiny` and `proxy`.

Both are written like the real release's `config.json`: a root (`model_type: "kimi_k3"`) holding
a `text_config`, with the published `quantization_config` (MODEL_SPEC §3.4) inside the text
config, where K3 puts it (§2.1).

* `tiny`: MODEL_SPEC §2.4 verbatim (DEFINED HERE there): 8 layers of width 256 with the real
  per-head sizes, 16 experts, so every path runs on a CPU in seconds.
* `proxy`: the full model's layer widths (§2.3: hidden 7168, 96 MLA and KDA heads, indexer
  32 x 128 with top-k 2048, latent MoE 3584 / 3072, dense width 33792, vocabulary 163840) with
  only 8 layers and 64 experts, for GPU benchmarks at real matrix shapes (~23 GB on disk).
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any, Mapping

# MODEL_SPEC §3.4, verbatim: the published K3 layout, reused unchanged by K3.1.
QUANTIZATION_CONFIG: Mapping[str, Any] = MappingProxyType({
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
})

_ROOT = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"]}
_TEXT_HEADER = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
                "dtype": "bfloat16"}

# MODEL_SPEC §2.4.
_TINY_TEXT: dict[str, Any] = {
    **_TEXT_HEADER,
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
}

# MODEL_SPEC §2.3 with 8 layers (MLA at 1-based 4 and 8, by the §1 rule) and 64 experts.
_PROXY_TEXT: dict[str, Any] = {
    **_TEXT_HEADER,
    "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 8,
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "mla_use_nope": True, "mla_use_output_gate": True,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
    "linear_attn_config": {"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7],
                           "num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True},
    "intermediate_size": 33792, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "num_experts": 64, "num_experts_per_token": 16, "num_shared_experts": 2,
    "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": True,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 1.0,
    "topk_method": "noaux_tc", "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "attn_res_block_size": 12,
}


def _with_root(text: dict[str, Any], root_extra: dict[str, Any]) -> dict[str, Any]:
    text = {**text, "quantization_config": copy.deepcopy(dict(QUANTIZATION_CONFIG))}
    return {**_ROOT, **root_extra, "text_config": text}


# The proxy's widths in 3 layers: the dense first layer (KDA), a MoE KDA layer and a MoE MLA
# layer with the indexer (MLA at 1-based 3: the last layer, §1), 32 experts with the real 16
# active. About 9 GB; `make-checkpoint --device cuda` draws it in seconds (the real-width GPU
# tests).
_PROXY_MINI_TEXT: dict[str, Any] = {
    **_PROXY_TEXT, "num_hidden_layers": 3, "num_experts": 32,
    "linear_attn_config": {**_PROXY_TEXT["linear_attn_config"], "full_attn_layers": [3],
                           "kda_layers": [1, 2]},
}

# name -> config.json contents (root + text_config). Read-only: use preset_config() for a copy.
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "tiny": _with_root(_TINY_TEXT, {}),
    # The proxy keeps the real vocabulary, so it also keeps the real media placeholder id (§2.3).
    "proxy": _with_root(_PROXY_TEXT, {"media_placeholder_token_id": 163605}),
    "proxy-mini": _with_root(_PROXY_MINI_TEXT, {"media_placeholder_token_id": 163605}),
})


def preset_config(name: str) -> dict[str, Any]:
    """A fresh, mutable copy of the named preset's config.json contents."""
    if name not in PRESETS:
        raise ValueError(f"unknown checkpoint preset {name!r}; expected one of "
                         f"{sorted(PRESETS)}")
    return copy.deepcopy(dict(PRESETS[name]))
