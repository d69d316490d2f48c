"""The config.json of the built-in model's draft, and the toy size the trainer's test uses.

`demo`: two layers of width 256 (the target's width, which the shared embedding and LM head
require), four MLA heads of the target's per-head sizes (latent 512 + 64, so the draft's rows fit
the target's cache rows), a SwiGLU of 512 and a rank-64 Markov head: 3.5M parameters
(7 MB in BF16) that a 30-minute CPU run trains to a useful acceptance length. Taps on all five
target layers (0-based 0..4; both AttnRes blocks and both MLA layers). YaRN θ 10000 × 4 over
4096 positions covers the target's 16,384. The mask token is a reserved special slot of the
demo tokenizer, which no text encodes to.

`toy`: one layer with a SwiGLU of 128 and rank 8, for the test that trains a few steps.
"""

from __future__ import annotations

from typing import Any

from atomk31.checkpoint import Tokenizer

DRAFT_SIZES = ("demo", "toy")


def mask_token_of(tokenizer: Tokenizer, vocab_size: int) -> int:
    """The highest id the tokenizer names `<|reserved_token_{id}|>`: a slot no text produces."""
    for token_id in range(vocab_size - 1, -1, -1):
        if tokenizer.decode([token_id]) == f"<|reserved_token_{token_id}|>":
            return token_id
    raise ValueError("the target's tokenizer has no reserved special slot for the draft's mask "
                     "token; give the draft a tokenizer with free special slots")


def draft_config(size: str, target: dict[str, Any], mask_token_id: int) -> dict[str, Any]:
    """The draft config.json for a target config.json (its text_config is read)."""
    if size not in DRAFT_SIZES:
        raise ValueError(f"unknown draft size {size!r}; expected one of {DRAFT_SIZES}")
    text = target.get("text_config", target)
    layers, width, rank = (2, 512, 64) if size == "demo" else (1, 128, 8)
    return {
        "model_type": "k3_dspark", "architectures": ["K3DSparkModel"], "dtype": "bfloat16",
        "hidden_size": text["hidden_size"], "num_hidden_layers": layers,
        "num_attention_heads": text["num_attention_heads"], "q_lora_rank": text["q_lora_rank"],
        "kv_lora_rank": text["kv_lora_rank"], "qk_nope_head_dim": text["qk_nope_head_dim"],
        "qk_rope_head_dim": text["qk_rope_head_dim"], "v_head_dim": text["v_head_dim"],
        "intermediate_size": width, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "vocab_size": text["vocab_size"],
        "max_position_embeddings": text["max_position_embeddings"],
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings":
                                text["max_position_embeddings"] // 4,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                            "mscale_all_dim": 1.0},
        "rope_interleave": True,
        "target_hidden_size": text["hidden_size"],
        "num_target_layers": min(5, text["num_hidden_layers"]),
        "target_layer_ids": list(range(text["num_hidden_layers"]))[-5:],
        "mask_token_id": mask_token_id, "markov_rank": rank,
    }
