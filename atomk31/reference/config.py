"""The oracle's own reading of `config.json` (MODEL_SPEC §2, §9).

Independent of `atomk31.config` on purpose: the oracle must not share a parsing bug with the
engine. Accepts a root with `text_config` or a flat text config; `quantization_config` may sit
at either level (the reference never needs it: a tensor is MXFP4 iff it has `weight_packed`,
§3.4); `vision_config` is ignored. Every problem found is reported in one ValueError.
"""

import json
import os
from dataclasses import dataclass
from typing import Any

_SUPPORTED_HIDDEN_ACT = "situ"


@dataclass(frozen=True)
class MlaDims:
    """Per-head sizes of one gated MLA layer (§4.5)."""

    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int


@dataclass(frozen=True)
class ReferenceConfig:
    """The text-config fields the oracle uses; layer ids are 0-based (§1)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    # Gated MLA (§4.5)
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_output_gate: bool
    # Indexer (§4.6); index_topk None = plain K3, dense causal MLA (§9 #13)
    index_n_heads: int | None
    index_head_dim: int | None
    index_topk: int | None
    # KDA (§4.4)
    kda_layer_ids: tuple[int, ...]
    mla_layer_ids: tuple[int, ...]
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: float | None
    # FFN (§4.7-§4.9)
    intermediate_size: int
    situ_beta: float
    situ_linear_beta: float | None
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    routed_expert_hidden_size: int | None
    latent_moe_use_norm: bool
    moe_renormalize: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    # AttnRes (§4.3); None = plain pre-norm residual
    attn_res_block_size: int | None

    def is_mla_layer(self, layer: int) -> bool:
        return layer in self.mla_layer_ids

    def is_moe_layer(self, layer: int) -> bool:
        """§1: MoE iff l >= first_k_dense_replace and l % moe_layer_freq == 0."""
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def closes_attn_res_block(self, layer: int) -> bool:
        """§4.3: a block is banked at the attention site of layers with l % block_size == 0."""
        return self.attn_res_block_size is not None and layer % self.attn_res_block_size == 0

    @property
    def mla_dims(self) -> MlaDims:
        return MlaDims(
            num_heads=self.num_attention_heads,
            qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
            kv_lora_rank=self.kv_lora_rank,
        )


def text_config_of(raw: dict[str, Any]) -> dict[str, Any]:
    """The text config of a root (`text_config` inside) or flat config dict (§2.1)."""
    text = raw.get("text_config")
    return dict(text) if isinstance(text, dict) else dict(raw)


def _first_present(text: dict[str, Any], names: tuple[str, ...], default: Any = None) -> Any:
    """Value of the first of `names` present in `text` (K3 name first, then DeepSeek alias)."""
    for name in names:
        if name in text:
            return text[name]
    return default


def _layer_ids(linear: dict[str, Any], key: str, problems: list[str]) -> tuple[int, ...]:
    ids = linear.get(key)
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        problems.append(f"linear_attn_config.{key} must be a list of 1-based ints, got {ids!r}")
        return ()
    return tuple(i - 1 for i in ids)


def _check_layer_plan(kda: tuple[int, ...], mla: tuple[int, ...], num_layers: int, problems: list[str]) -> None:
    """§1: the two lists are disjoint and cover every layer exactly once."""
    if set(kda) & set(mla):
        overlap = sorted(i + 1 for i in set(kda) & set(mla))
        problems.append(f"kda_layers and full_attn_layers overlap at 1-based {overlap}")
    if sorted(kda + mla) != list(range(num_layers)):
        problems.append(
            f"kda_layers + full_attn_layers must cover 1..{num_layers} exactly once, "
            f"got {len(kda)} + {len(mla)} entries"
        )


def _check_supported(text: dict[str, Any], linear: dict[str, Any], problems: list[str]) -> None:
    """§9 #9 and §2.2 validation: variants the oracle does not implement."""
    if text.get("hidden_act") != _SUPPORTED_HIDDEN_ACT:
        problems.append(f"hidden_act must be 'situ', got {text.get('hidden_act')!r}")
    if text.get("mla_use_nope", True) is not True:
        problems.append("mla_use_nope must be true (the target MLA has no rotary), got false")
    if linear.get("use_full_rank_gate", True) is not True:
        problems.append("linear_attn_config.use_full_rank_gate must be true, got false")
    for name in ("num_expert_group", "topk_group", "n_group"):
        if text.get(name, 1) not in (1, None):
            problems.append(f"{name} must be 1 (grouped routing is not implemented), got {text[name]!r}")
    if text.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        problems.append(f"moe_router_activation_func must be 'sigmoid', got {text['moe_router_activation_func']!r}")
    block_size = text.get("attn_res_block_size")
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        problems.append(f"attn_res_block_size must be an int >= 1 or null, got {block_size!r}")
    if text.get("q_lora_rank") is None:
        problems.append("q_lora_rank must be set (the indexer reads the q-LoRA latent), got null")
    if "index_topk" in text:
        if not isinstance(text["index_topk"], int) or text["index_topk"] < 1:
            problems.append(f"index_topk must be an int >= 1, got {text['index_topk']!r}")
        if not isinstance(text.get("index_head_dim"), int) or text["index_head_dim"] % 128 != 0:
            problems.append(f"index_head_dim must be a multiple of 128, got {text.get('index_head_dim')!r}")
        if text.get("index_topk_freq", 1) not in (1, None):
            problems.append(f"index_topk_freq must be absent or 1, got {text['index_topk_freq']!r}")
        for name, value in text.items():
            if name.startswith("index") and "rope" in name and value not in (None, 0, False):
                problems.append(f"{name} must be absent, 0 or null (the indexer is NoPE), got {value!r}")


def parse_config(raw: dict[str, Any]) -> ReferenceConfig:
    """Build a ReferenceConfig from a parsed config.json; raises ValueError listing every problem."""
    text = text_config_of(raw)
    linear = text.get("linear_attn_config")
    problems: list[str] = []
    if not isinstance(linear, dict):
        raise ValueError("config needs text_config.linear_attn_config (a dict with kda_layers, full_attn_layers, ...)")
    _check_supported(text, linear, problems)
    try:
        num_layers = int(text["num_hidden_layers"])
        kda_ids = _layer_ids(linear, "kda_layers", problems)
        mla_ids = _layer_ids(linear, "full_attn_layers", problems)
        _check_layer_plan(kda_ids, mla_ids, num_layers, problems)
        has_indexer = "index_topk" in text
        situ_beta = text.get("activation_situ_beta")
        config = ReferenceConfig(
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            num_hidden_layers=num_layers,
            rms_norm_eps=float(text["rms_norm_eps"]),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            num_attention_heads=int(text["num_attention_heads"]),
            q_lora_rank=int(text["q_lora_rank"] or 0),
            kv_lora_rank=int(text["kv_lora_rank"]),
            qk_nope_head_dim=int(text["qk_nope_head_dim"]),
            qk_rope_head_dim=int(text["qk_rope_head_dim"]),
            v_head_dim=int(text["v_head_dim"]),
            mla_use_output_gate=bool(text.get("mla_use_output_gate", True)),
            index_n_heads=int(text["index_n_heads"]) if has_indexer else None,
            index_head_dim=int(text["index_head_dim"]) if has_indexer else None,
            index_topk=int(text["index_topk"]) if has_indexer else None,
            kda_layer_ids=tuple(sorted(kda_ids)),
            mla_layer_ids=tuple(sorted(mla_ids)),
            kda_num_heads=int(linear["num_heads"]),
            kda_head_dim=int(linear["head_dim"]),
            short_conv_kernel_size=int(linear["short_conv_kernel_size"]),
            gate_lower_bound=None if linear.get("gate_lower_bound") is None else float(linear["gate_lower_bound"]),
            intermediate_size=int(text["intermediate_size"]),
            situ_beta=1.0 if situ_beta is None else float(situ_beta),          # §9 #14
            situ_linear_beta=(
                None if text.get("activation_situ_linear_beta") is None else float(text["activation_situ_linear_beta"])
            ),
            num_experts=int(_first_present(text, ("num_experts", "n_routed_experts"))),
            num_experts_per_token=int(_first_present(text, ("num_experts_per_token", "num_experts_per_tok"))),
            num_shared_experts=int(_first_present(text, ("num_shared_experts", "n_shared_experts"), 0) or 0),
            moe_intermediate_size=int(text["moe_intermediate_size"]),
            routed_expert_hidden_size=(
                None if text.get("routed_expert_hidden_size") is None else int(text["routed_expert_hidden_size"])
            ),
            latent_moe_use_norm=bool(text.get("latent_moe_use_norm", False)),
            moe_renormalize=bool(_first_present(text, ("moe_renormalize", "norm_topk_prob"), False)),
            routed_scaling_factor=float(text.get("routed_scaling_factor", 1.0)),
            first_k_dense_replace=int(text.get("first_k_dense_replace", 0)),
            moe_layer_freq=int(text.get("moe_layer_freq", 1)),
            attn_res_block_size=(
                None if text.get("attn_res_block_size") is None else int(text["attn_res_block_size"])
            ),
        )
    except KeyError as error:
        problems.append(f"missing field {error.args[0]!r}")
        config = None
    except (TypeError, ValueError) as error:
        problems.append(f"malformed field: {error}")
        config = None
    if problems:
        raise ValueError("config.json is not a supported K3/K3.1 text config:\n  - " + "\n  - ".join(problems))
    assert config is not None, "config must be built when no problem was found"
    return config


def load_config(model_dir: str | os.PathLike) -> ReferenceConfig:
    """Read `<model_dir>/config.json` and parse it with `parse_config`."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"expected a model directory with config.json, found no {path}")
    with open(path, encoding="utf-8") as handle:
        return parse_config(json.load(handle))
