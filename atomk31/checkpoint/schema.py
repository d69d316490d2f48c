"""Every tensor a K3 / K3.1 checkpoint holds for a given config: name, shape, allowed dtypes.

MODEL_SPEC §3 as data. Names carry the `language_model.` prefix; below `P = language_model.model.`
and `L = P + "layers.{l}."`. The dict returned by `expected_tensors` is ordered as a writer
generates it: embeddings, then layer by layer (AttnRes and layer norms, mixer, FFN), then the
output site, the final norm and the LM head.

Rules beyond the §3 tables (each cites its source):
* Routed experts are listed in their stored MXFP4 form, `experts.{e}.w{1,3,2}.weight_packed`
  (uint8 `[out, in/2]`) + `.weight_scale` (uint8 E8M0 `[out, in/32]`) (§3.3). The dequantized
  variant `experts.{e}.w*.weight` (`[out, in]`) is accepted instead, per expert matrix
  (`dequantized_expert_tensors`); the loader decides which form each matrix has.
* "f32|bf16" tensors accept both dtypes (§3 preamble, §8 #14); `A_log` accepts any shape with
  at least `num_heads` entries (§3.2 note, §9 #16).
* Indexer tensors exist only for K3.1 (`config.has_indexer`, §9 #13); AttnRes tensors only when
  `attn_res_block_size` is set (§4.3: null = plain pre-norm residual); `routed_expert_norm` only
  with `latent_moe_use_norm`; the latent projections only with `routed_expert_hidden_size`
  (§9 #10); MLA `g_proj` only with `mla_use_output_gate`; `lm_head` unless the text config ties
  word embeddings.
* Non-MoE layers use `mlp.{gate,up,down}_proj` of width `intermediate_size` (§9 #12).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atomk31.config import ModelConfig

TEXT_PREFIX = "language_model."
MODEL_PREFIX = "language_model.model."
# Tensors of the vision tower: a text engine skips them (§3), they are neither used nor "unused".
SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.")
# Expert matrices are stored MXFP4 in groups of 32 along the input dim (§3.3).
MXFP4_GROUP_SIZE = 32

BF16 = (torch.bfloat16,)
F32_OR_BF16 = (torch.float32, torch.bfloat16)
UINT8 = (torch.uint8,)


@dataclass(frozen=True)
class TensorSpec:
    """What one checkpoint tensor must look like.

    `shape` is exact unless `min_numel` is set: then any shape with at least that many entries
    passes (`A_log`, of which the first `num_heads` entries are used, §9 #16). `dtypes` lists the
    accepted dtypes, the preferred one (what the writer stores) first.
    """

    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    min_numel: int | None = None

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        if self.min_numel is None:
            return tuple(shape) == self.shape
        numel = 1
        for size in shape:
            numel *= size
        return numel >= self.min_numel

    def accepts_dtype(self, dtype: torch.dtype | None) -> bool:
        return dtype in self.dtypes

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor in its preferred dtype and nominal shape."""
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * self.dtypes[0].itemsize


def expected_tensors(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every text tensor of a checkpoint for `config` (MXFP4 expert form), in writing order."""
    specs: dict[str, TensorSpec] = {}
    d = config.hidden_size
    specs[MODEL_PREFIX + "embed_tokens.weight"] = TensorSpec((config.vocab_size, d), BF16)
    for layer in range(config.num_hidden_layers):
        prefix = f"{MODEL_PREFIX}layers.{layer}."
        specs.update(_layer_norm_tensors(config, prefix))
        if config.is_mla_layer(layer):
            specs.update(_mla_tensors(config, prefix + "self_attn."))
        else:
            specs.update(_kda_tensors(config, prefix + "self_attn."))
        if config.is_moe_layer(layer):
            specs.update(_moe_tensors(config, prefix + "block_sparse_moe."))
        else:
            specs.update(_dense_mlp_tensors(config, prefix + "mlp."))
    if config.attn_res_block_size is not None:
        specs[MODEL_PREFIX + "output_attn_res_norm.weight"] = TensorSpec((d,), BF16)
        specs[MODEL_PREFIX + "output_attn_res_proj.weight"] = TensorSpec((1, d), BF16)
    specs[MODEL_PREFIX + "norm.weight"] = TensorSpec((d,), BF16)
    if not ties_word_embeddings(config):
        specs[TEXT_PREFIX + "lm_head.weight"] = TensorSpec((config.vocab_size, d), BF16)
    return specs


def dequantized_expert_tensors(config: ModelConfig) -> dict[str, TensorSpec]:
    """The accepted dequantized form of every routed expert matrix: `...experts.{e}.w*.weight`
    with the logical `[out, in]` shape (§3.2), BF16 (or F32)."""
    specs: dict[str, TensorSpec] = {}
    for layer in range(config.num_hidden_layers):
        if not config.is_moe_layer(layer):
            continue
        prefix = f"{MODEL_PREFIX}layers.{layer}.block_sparse_moe.experts."
        for expert in range(config.num_experts):
            for matrix, shape in _expert_matrix_shapes(config).items():
                specs[f"{prefix}{expert}.{matrix}.weight"] = TensorSpec(shape, (torch.bfloat16,
                                                                                torch.float32))
    return specs


def packed_names_of(dequantized_name: str) -> tuple[str, str]:
    """`...w1.weight` -> (`...w1.weight_packed`, `...w1.weight_scale`)."""
    return dequantized_name + "_packed", dequantized_name + "_scale"


def is_indexer_tensor(name: str) -> bool:
    return ".self_attn.indexer." in name


def ties_word_embeddings(config: ModelConfig) -> bool:
    """True when the text config ties `lm_head` to `embed_tokens` (K3: false, §2.2)."""
    text = config.raw.get("text_config", config.raw)
    return bool(isinstance(text, dict) and text.get("tie_word_embeddings", False))


def _layer_norm_tensors(config: ModelConfig, prefix: str) -> dict[str, TensorSpec]:
    d = config.hidden_size
    specs: dict[str, TensorSpec] = {}
    if config.attn_res_block_size is not None:
        for site in ("self_attention", "mlp"):
            specs[f"{prefix}{site}_res_norm.weight"] = TensorSpec((d,), BF16)
            specs[f"{prefix}{site}_res_proj.weight"] = TensorSpec((1, d), BF16)
    specs[prefix + "input_layernorm.weight"] = TensorSpec((d,), BF16)
    specs[prefix + "post_attention_layernorm.weight"] = TensorSpec((d,), BF16)
    return specs


def _kda_tensors(config: ModelConfig, prefix: str) -> dict[str, TensorSpec]:
    """§3.2 KDA mixer: H heads of K = V = head_dim, causal conv width Kc."""
    d, h, k = config.hidden_size, config.kda_num_heads, config.kda_head_dim
    hk, kc = h * k, config.short_conv_kernel_size
    specs = {f"{prefix}{name}_proj.weight": TensorSpec((hk, d), BF16) for name in "qkv"}
    specs[prefix + "g_proj.weight"] = TensorSpec((hk, d), BF16)
    for name in "qkv":
        specs[f"{prefix}{name}_conv1d.weight"] = TensorSpec((hk, 1, kc), F32_OR_BF16)
    specs[prefix + "f_a_proj.weight"] = TensorSpec((k, d), BF16)
    specs[prefix + "f_b_proj.weight"] = TensorSpec((hk, k), BF16)
    specs[prefix + "b_proj.weight"] = TensorSpec((h, d), BF16)
    specs[prefix + "A_log"] = TensorSpec((h,), F32_OR_BF16, min_numel=h)
    specs[prefix + "dt_bias"] = TensorSpec((hk,), F32_OR_BF16)
    specs[prefix + "o_norm.weight"] = TensorSpec((k,), F32_OR_BF16)
    specs[prefix + "o_proj.weight"] = TensorSpec((d, hk), BF16)
    return specs


def _mla_tensors(config: ModelConfig, prefix: str) -> dict[str, TensorSpec]:
    """§3.2 gated MLA mixer, plus the DSA indexer under `self_attn.indexer.` for K3.1."""
    d, h = config.hidden_size, config.num_attention_heads
    r_q, r_kv = config.q_lora_rank, config.kv_lora_rank
    specs = {
        prefix + "q_a_proj.weight": TensorSpec((r_q, d), BF16),
        prefix + "q_a_layernorm.weight": TensorSpec((r_q,), BF16),
        prefix + "q_b_proj.weight": TensorSpec((h * config.qk_head_dim, r_q), BF16),
        prefix + "kv_a_proj_with_mqa.weight": TensorSpec((config.latent_dim, d), BF16),
        prefix + "kv_a_layernorm.weight": TensorSpec((r_kv,), BF16),
        prefix + "kv_b_proj.weight": TensorSpec(
            (h * (config.qk_nope_head_dim + config.v_head_dim), r_kv), BF16),
    }
    if config.mla_use_output_gate:
        specs[prefix + "g_proj.weight"] = TensorSpec((h * config.v_head_dim, d), BF16)
    specs[prefix + "o_proj.weight"] = TensorSpec((d, h * config.v_head_dim), BF16)
    if config.has_indexer:
        h_i, d_i = config.index_n_heads, config.index_head_dim
        assert h_i is not None and d_i is not None, "ModelConfig validates the indexer fields"
        indexer = prefix + "indexer."
        specs[indexer + "wq_b.weight"] = TensorSpec((h_i * d_i, r_q), BF16)
        specs[indexer + "wk.weight"] = TensorSpec((d_i, d), BF16)
        specs[indexer + "k_norm.weight"] = TensorSpec((d_i,), F32_OR_BF16)
        specs[indexer + "k_norm.bias"] = TensorSpec((d_i,), F32_OR_BF16)
        specs[indexer + "weights_proj.weight"] = TensorSpec((h_i, d), BF16)
    return specs


def _dense_mlp_tensors(config: ModelConfig, prefix: str) -> dict[str, TensorSpec]:
    d, i = config.hidden_size, config.intermediate_size
    return {
        prefix + "gate_proj.weight": TensorSpec((i, d), BF16),
        prefix + "up_proj.weight": TensorSpec((i, d), BF16),
        prefix + "down_proj.weight": TensorSpec((d, i), BF16),
    }


def _moe_tensors(config: ModelConfig, prefix: str) -> dict[str, TensorSpec]:
    """§3.2 latent MoE: router, latent projections and norm, shared experts, MXFP4 experts."""
    d, n = config.hidden_size, config.num_experts
    specs = {
        prefix + "gate.weight": TensorSpec((n, d), BF16),
        prefix + "gate.e_score_correction_bias": TensorSpec((n,), F32_OR_BF16),
    }
    latent = config.routed_expert_hidden_size
    if latent is not None:
        specs[prefix + "routed_expert_down_proj.weight"] = TensorSpec((latent, d), BF16)
        if config.latent_moe_use_norm:
            specs[prefix + "routed_expert_norm.weight"] = TensorSpec((latent,), F32_OR_BF16)
        specs[prefix + "routed_expert_up_proj.weight"] = TensorSpec((d, latent), BF16)
    if config.num_shared_experts > 0:
        shared_width = config.moe_intermediate_size * config.num_shared_experts
        shared = prefix + "shared_experts."
        specs[shared + "gate_proj.weight"] = TensorSpec((shared_width, d), BF16)
        specs[shared + "up_proj.weight"] = TensorSpec((shared_width, d), BF16)
        specs[shared + "down_proj.weight"] = TensorSpec((d, shared_width), BF16)
    matrices = _expert_matrix_shapes(config)
    for expert in range(n):
        for matrix, (rows, cols) in matrices.items():
            name = f"{prefix}experts.{expert}.{matrix}."
            specs[name + "weight_packed"] = TensorSpec((rows, cols // 2), UINT8)
            specs[name + "weight_scale"] = TensorSpec((rows, cols // MXFP4_GROUP_SIZE), UINT8)
    return specs


def _expert_matrix_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Logical `[out, in]` of one routed expert: w1 = gate, w3 = up, w2 = down (§3.2)."""
    width = config.routed_expert_hidden_size or config.hidden_size  # §9 #10: no latent -> x
    inner = config.moe_intermediate_size
    if width % MXFP4_GROUP_SIZE or inner % MXFP4_GROUP_SIZE:
        raise ValueError(
            f"routed experts are MXFP4 in groups of {MXFP4_GROUP_SIZE} along their input dims "
            f"(§3.3), so the expert input width ({width}) and moe_intermediate_size ({inner}) "
            f"must be multiples of {MXFP4_GROUP_SIZE}; fix config.json")
    return {"w1": (inner, width), "w3": (inner, width), "w2": (width, inner)}
