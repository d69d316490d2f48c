"""The built-in model's config.json, and the toy size the trainer's tests use.

`demo`: K3.1's architecture at a size that ships inside the package (about 17 MB) and decodes
quickly on a CPU: 5 layers of width 256 (KDA at 1-based 1-3, gated MLA with the DSA indexer at
4 and 5: "every fourth layer plus the last", MODEL_SPEC §1), the real per-head sizes (KDA and
MLA heads of 128, latent 512 + 64, index heads of 128), a dense first layer and latent MoE with
16 MXFP4 routed experts and two shared experts, AttnRes blocks of two layers, a 2,048-token
vocabulary with split digits, a context of 16,384 tokens and `index_topk` 256, so a passkey
prompt of 8K tokens is answered through the indexer's selection. Two experts per token, not
four: the engine's CPU path dequantizes every chosen expert at every token, which made the
top-k most of the CPU decode time.

`toy`: the same layer types at the smallest size (2 layers: one KDA, one MLA), for the CPU test
that trains a few steps and loads what it wrote.
"""

from __future__ import annotations

import copy
from typing import Any

from atomk31.checkpoint.presets import QUANTIZATION_CONFIG, preset_config

DEMO_NAME = "atomk31-demo"

_DEMO_CHANGES: dict[str, Any] = {
    "vocab_size": 2048, "hidden_size": 256, "num_hidden_layers": 5,
    "max_position_embeddings": 16384,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256,
    "index_n_heads": 4, "index_head_dim": 128, "index_topk": 256,
    "linear_attn_config": {"full_attn_layers": [4, 5], "kda_layers": [1, 2, 3],
                           "num_heads": 4, "head_dim": 128, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True},
    "intermediate_size": 768,
    "num_experts": 16, "num_experts_per_token": 2, "num_shared_experts": 2,
    "moe_intermediate_size": 128, "routed_expert_hidden_size": 128,
    "attn_res_block_size": 2,
}

_TOY_CHANGES: dict[str, Any] = {
    "vocab_size": 2048, "hidden_size": 128, "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 128,
    "index_n_heads": 2, "index_head_dim": 128, "index_topk": 32,
    "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1],
                           "num_heads": 2, "head_dim": 128, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0, "use_full_rank_gate": True},
    "intermediate_size": 256,
    "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 2,
    "moe_intermediate_size": 64, "routed_expert_hidden_size": 64,
    "attn_res_block_size": 1,
}
SIZES = {"demo": _DEMO_CHANGES, "toy": _TOY_CHANGES}


def demo_config(size: str = "demo") -> dict[str, Any]:
    """config.json contents (root + text_config, published quantization_config) of `size`."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; expected one of {sorted(SIZES)}")
    config = preset_config("tiny")
    text = config["text_config"]
    text.update(copy.deepcopy(SIZES[size]))
    text["quantization_config"] = copy.deepcopy(dict(QUANTIZATION_CONFIG))
    return config
