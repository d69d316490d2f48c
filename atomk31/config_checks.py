"""Validation of a K3 / K3.1 config.json (MODEL_SPEC.md §2): field tables and the checks across
fields. Every check appends a message to `problems` instead of raising, so that ModelConfig can
report every problem at once."""

from __future__ import annotations

import json
import re
from typing import Any

# Keys HuggingFace writes into every config; they carry no model meaning here.
IGNORED_TEXT_KEYS = frozenset({
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "num_key_value_heads", "num_nextn_predict_layers", "attention_dropout", "attention_bias",
    "return_dict", "output_hidden_states", "output_attentions", "tie_word_embeddings",
})
IGNORED_ROOT_KEYS = frozenset({
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "media_placeholder_token_id",
    "vision_config", "ignore_index", "use_cache", "tie_word_embeddings",
})

# text_config fields: name -> (python type(s), required). `None` in a type tuple allows null.
TEXT_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "vocab_size": ((int,), True),
    "hidden_size": ((int,), True),
    "num_hidden_layers": ((int,), True),
    "max_position_embeddings": ((int,), True),
    "rms_norm_eps": ((float, int), True),
    "num_attention_heads": ((int,), True),
    "q_lora_rank": ((int,), True),
    "kv_lora_rank": ((int,), True),
    "qk_nope_head_dim": ((int,), True),
    "qk_rope_head_dim": ((int,), True),
    "v_head_dim": ((int,), True),
    "mla_use_nope": ((bool,), True),
    "mla_use_output_gate": ((bool,), True),
    "linear_attn_config": ((dict,), True),
    "intermediate_size": ((int,), True),
    "hidden_act": ((str,), True),
    "activation_situ_beta": ((float, int, type(None)), False),
    "activation_situ_linear_beta": ((float, int, type(None)), False),
    "num_experts": ((int,), True),
    "num_experts_per_token": ((int,), True),
    "num_shared_experts": ((int,), True),
    "moe_intermediate_size": ((int,), True),
    "routed_expert_hidden_size": ((int, type(None)), True),
    "latent_moe_use_norm": ((bool,), True),
    "moe_router_activation_func": ((str,), True),
    "moe_renormalize": ((bool,), True),
    "routed_scaling_factor": ((float, int), True),
    "topk_method": ((str,), True),
    "use_grouped_topk": ((bool,), False),
    "num_expert_group": ((int,), False),
    "topk_group": ((int,), False),
    "first_k_dense_replace": ((int,), True),
    "moe_layer_freq": ((int,), True),
    "attn_res_block_size": ((int, type(None)), True),
    "index_n_heads": ((int,), False),
    "index_head_dim": ((int,), False),
    "index_topk": ((int,), False),
    "index_topk_freq": ((int, type(None)), False),
    "index_key_norm": ((str,), False),
    "index_layers": ((list,), False),
    "quantization_config": ((dict, type(None)), False),
}
LINEAR_ATTN_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "full_attn_layers": ((list,), True),
    "kda_layers": ((list,), True),
    "num_heads": ((int,), True),
    "head_dim": ((int,), True),
    "short_conv_kernel_size": ((int,), True),
    "gate_lower_bound": ((float, int, type(None)), True),
    "use_full_rank_gate": ((bool,), True),
}
# Indexer fields that K3.1 must come with together (§2.2); absent altogether = plain K3 (§9 #13).
_INDEXER_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")
_INDEXER_ROPE_KEY = re.compile(r"^index.*rope.*$")


class ConfigError(ValueError):
    """A config.json (or engine option) that atomk31 cannot run; lists every problem found."""

    def __init__(self, problems: list[str], source: str = "config.json"):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} has {len(problems)} problem(s):\n{lines}")


def split_text_config(data: Any, problems: list[str]) -> dict:
    """Root + text_config, or a flat text config; quantization_config from either level."""
    if not isinstance(data, dict):
        problems.append(f"expected a JSON object, got {type(data).__name__}")
        return {}
    if "text_config" not in data:
        return dict(data)
    text = data["text_config"]
    if not isinstance(text, dict):
        problems.append(f"text_config: expected an object, got {type(text).__name__}")
        return {}
    for key in sorted(set(data) - IGNORED_ROOT_KEYS - {"text_config", "quantization_config"}):
        problems.append(f"{key}: unknown key at the root of the config")
    text = dict(text)
    if "quantization_config" not in text and "quantization_config" in data:
        text["quantization_config"] = data["quantization_config"]  # text level wins (§2.1)
    return text


def check_fields(obj: dict, spec: dict[str, tuple[tuple[type, ...], bool]],
                  ignored: frozenset[str], prefix: str, problems: list[str]) -> dict:
    values: dict[str, Any] = {}
    for key, (types, required) in spec.items():
        if key not in obj:
            if required:
                problems.append(f"{prefix}{key}: missing")
            continue
        value = obj[key]
        # bool is an int in Python; an int field must not take true/false.
        is_bad_bool = isinstance(value, bool) and bool not in types
        if is_bad_bool or not isinstance(value, types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{prefix}{key}: expected {names}, got {json.dumps(value)}")
            continue
        values[key] = value
    for key in sorted(set(obj) - set(spec) - ignored):
        if _INDEXER_ROPE_KEY.match(key) or key == "indexer_rope_interleave":
            if obj[key] not in (None, 0, False):
                problems.append(f"{prefix}{key}: the indexer has no rotary embedding (NoPE, "
                                f"MODEL_SPEC §2.2); got {json.dumps(obj[key])}, expected absent, 0 or null")
            continue
        problems.append(f"{prefix}{key}: unknown key (a typo? see MODEL_SPEC.md §2.2)")
    return values


def check_semantics(v: dict, lin: dict, problems: list[str]) -> None:
    """Checks across fields; each runs only when the fields it reads were valid, so one pass
    reports every problem (a missing or mistyped field was reported already)."""
    def has(*keys: str, source: dict = v) -> bool:
        return all(k in source for k in keys)

    if has("num_hidden_layers") and has("full_attn_layers", "kda_layers", source=lin):
        _check_layer_lists(v["num_hidden_layers"], lin["full_attn_layers"], lin["kda_layers"],
                           problems)
    if has("hidden_act") and v["hidden_act"] != "situ":
        problems.append(f"hidden_act: only \"situ\" is supported (§4.8), got {v['hidden_act']!r}")
    if has("mla_use_nope") and not v["mla_use_nope"]:
        problems.append("mla_use_nope: must be true (K3 MLA has no rotary embedding, §9 #9)")
    if has("use_full_rank_gate", source=lin) and not lin["use_full_rank_gate"]:
        problems.append("linear_attn_config.use_full_rank_gate: must be true (§9 #9)")
    if has("moe_router_activation_func") and v["moe_router_activation_func"] != "sigmoid":
        problems.append("moe_router_activation_func: only \"sigmoid\" is supported, got "
                        f"{v['moe_router_activation_func']!r}")
    if has("topk_method") and v["topk_method"] != "noaux_tc":
        problems.append(f"topk_method: only \"noaux_tc\" is supported, got {v['topk_method']!r}")
    for key in ("num_expert_group", "topk_group"):
        if v.get(key, 1) != 1:
            problems.append(f"{key}: must be 1 (grouped selection is degenerate in K3, §9 #9), "
                            f"got {v[key]}")
    for key in ("moe_intermediate_size", "routed_expert_hidden_size"):
        if v.get(key) is not None and v[key] % 32:
            problems.append(f"{key}: must be a multiple of 32 (MXFP4 groups of 32, §2.2), "
                            f"got {v[key]}")
    if has("num_experts_per_token", "num_experts") and v["num_experts_per_token"] > v["num_experts"]:
        problems.append(f"num_experts_per_token: {v['num_experts_per_token']} exceeds "
                        f"num_experts {v['num_experts']}")
    if v.get("attn_res_block_size") is not None and v["attn_res_block_size"] < 1:
        problems.append(f"attn_res_block_size: must be >= 1 or null, got {v['attn_res_block_size']}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings", "moe_layer_freq", "num_experts", "num_experts_per_token"):
        if has(key) and v[key] < 1:
            problems.append(f"{key}: must be >= 1, got {v[key]}")
    if has("short_conv_kernel_size", source=lin) and lin["short_conv_kernel_size"] < 1:
        problems.append("linear_attn_config.short_conv_kernel_size: must be >= 1, got "
                        f"{lin['short_conv_kernel_size']}")
    _check_indexer(v, lin, problems)


def _check_layer_lists(n: int, full: list, kda: list, problems: list[str]) -> None:
    """§1: the 1-based lists are disjoint and cover 1..N exactly once."""
    for name, ids in (("full_attn_layers", full), ("kda_layers", kda)):
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= n]
        if bad:
            problems.append(f"linear_attn_config.{name}: entries must be 1-based layer numbers "
                            f"in 1..{n}, got {bad}")
        dup = sorted({i for i in ids if ids.count(i) > 1}, key=str)
        if dup:
            problems.append(f"linear_attn_config.{name}: layers listed twice: {dup}")
    both = sorted(set(full) & set(kda), key=str)
    if both:
        problems.append(f"linear_attn_config: layers in both full_attn_layers and kda_layers: "
                        f"{both}")
    missing = sorted(set(range(1, n + 1)) - set(full) - set(kda))
    if missing:
        problems.append(f"linear_attn_config: layers in neither full_attn_layers nor kda_layers:"
                        f" {missing} (the lists must cover 1..{n} exactly once)")


def _check_indexer(v: dict, lin: dict, problems: list[str]) -> None:
    present = [k for k in _INDEXER_FIELDS if k in v]
    if not present:
        for key in ("index_topk_freq", "index_key_norm", "index_layers"):
            if key in v:
                problems.append(f"{key}: given without an indexer (index_topk is absent)")
        return

    for key in _INDEXER_FIELDS:
        if key not in v:
            problems.append(f"{key}: missing (K3.1's indexer needs {', '.join(_INDEXER_FIELDS)})")
    if v.get("index_head_dim") is not None and v["index_head_dim"] % 128:
        problems.append(f"index_head_dim: must be a multiple of 128, got {v['index_head_dim']}")
    if v.get("index_topk") is not None and v["index_topk"] < 1:
        problems.append(f"index_topk: must be >= 1, got {v['index_topk']}")
    if v.get("index_n_heads") is not None and v["index_n_heads"] < 1:
        problems.append(f"index_n_heads: must be >= 1, got {v['index_n_heads']}")
    if v.get("index_topk_freq") not in (None, 1):
        problems.append(f"index_topk_freq: top-k is not shared across layers in K3.1 (absent or "
                        f"1), got {v['index_topk_freq']}")
    norm = v.get("index_key_norm", "layernorm")
    if norm.lower().replace("_", "") != "layernorm":
        problems.append(f"index_key_norm: the indexer's keys use LayerNorm (§4.6), got {norm!r}")
    if ("index_layers" in v and "full_attn_layers" in lin
            and sorted(v["index_layers"], key=str) != sorted(lin["full_attn_layers"], key=str)):
        problems.append(f"index_layers: the sparse (indexer) layers must be the full-attention "
                        f"layers {sorted(lin['full_attn_layers'])}, got {v['index_layers']}")
    if _quantizes_indexer_to_fp8(v.get("quantization_config")):
        problems.append("quantization_config: FP8 indexer weights are not supported; the "
                        "indexer stays BF16 (MODEL_SPEC §3.2, §6.5): add \"re:.*indexer.*\" "
                        "to its ignore list")


def _quantizes_indexer_to_fp8(qc: dict | None) -> bool:
    if not qc:
        return False
    is_fp8 = qc.get("quant_method") == "fp8" or any(
        isinstance(g, dict) and (g.get("weights") or {}).get("num_bits") == 8
        and (g.get("weights") or {}).get("type") == "float"
        for g in (qc.get("config_groups") or {}).values())
    if not is_fp8:
        return False
    ignore = list(qc.get("ignore") or []) + list(qc.get("modules_to_not_convert") or [])
    probe = "language_model.model.layers.3.self_attn.indexer.wk"
    return not any((p[3:] and re.match(p[3:], probe)) if p.startswith("re:") else p in probe
                   for p in ignore)
