"""Turning a checkpoint's tensors into the oracle's per-block weights (MODEL_SPEC §3).

Names below are relative to `language_model.` (stripped on read). Every floating tensor is
float32; small vectors are flattened; MXFP4 experts are dequantized (a tensor is MXFP4 iff it
has `weight_packed`, §3.4).
"""

import logging
from dataclasses import dataclass

import torch

from atomk31.reference.config import ReferenceConfig
from atomk31.reference.formats import dequantize_mxfp4
from atomk31.reference.indexer import IndexerWeights
from atomk31.reference.kda import KdaWeights
from atomk31.reference.mla import MlaWeights
from atomk31.reference.mlp import MlpWeights
from atomk31.reference.moe import MoeWeights

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. Norm and AttnRes vectors are [D]; AttnRes ones are None when the
    config has no AttnRes. Exactly one mixer (kda, or mla [+ indexer]) and one FFN (mlp or moe)."""

    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    self_attention_res_norm: torch.Tensor | None
    self_attention_res_proj: torch.Tensor | None
    mlp_res_norm: torch.Tensor | None
    mlp_res_proj: torch.Tensor | None
    kda: KdaWeights | None
    mla: MlaWeights | None
    indexer: IndexerWeights | None
    mlp: MlpWeights | None
    moe: MoeWeights | None


@dataclass(frozen=True)
class ModelWeights:
    """The whole text model: embed_tokens, lm_head [V, D]; norm, output AttnRes vectors [D]."""

    embed_tokens: torch.Tensor
    norm: torch.Tensor
    output_attn_res_norm: torch.Tensor | None
    output_attn_res_proj: torch.Tensor | None
    lm_head: torch.Tensor
    layers: tuple[LayerWeights, ...]


class _TensorReader:
    """Looks tensors up by name, checks shapes, and remembers what was used."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def matrix(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.tensors:
            raise ValueError(f"checkpoint is missing tensor language_model.{name} (expected shape {list(shape)})")
        tensor = self.tensors[name]
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"tensor language_model.{name} must have shape {list(shape)}, got {list(tensor.shape)}")
        self.used.add(name)
        return tensor

    def vector(self, name: str, size: int, allow_longer: bool = False) -> torch.Tensor:
        """A small tensor flattened to [size]; `allow_longer` keeps the first `size` entries (A_log, §9 #16)."""
        if name not in self.tensors:
            raise ValueError(f"checkpoint is missing tensor language_model.{name} ({size} entries)")
        flat = self.tensors[name].reshape(-1)
        if flat.numel() != size and not (allow_longer and flat.numel() > size):
            shape = list(self.tensors[name].shape)
            raise ValueError(f"tensor language_model.{name} must have {size} entries, got shape {shape}")
        self.used.add(name)
        return flat[:size]

    def expert_matrix(self, name: str, shape: tuple[int, int]) -> torch.Tensor:
        """`name.weight_packed` + `name.weight_scale` (MXFP4, dequantized) or `name.weight`."""
        if self.has(name + ".weight_packed"):
            packed = self.matrix(name + ".weight_packed", (shape[0], shape[1] // 2))
            scale = self.matrix(name + ".weight_scale", (shape[0], shape[1] // 32))
            return dequantize_mxfp4(packed, scale)
        return self.matrix(name + ".weight", shape)


def _kda_weights(read: _TensorReader, prefix: str, config: ReferenceConfig) -> KdaWeights:
    hidden, heads, head_dim = config.hidden_size, config.kda_num_heads, config.kda_head_dim
    channels = heads * head_dim
    conv = (channels, config.short_conv_kernel_size)
    return KdaWeights(
        q_proj=read.matrix(prefix + "q_proj.weight", (channels, hidden)),
        k_proj=read.matrix(prefix + "k_proj.weight", (channels, hidden)),
        v_proj=read.matrix(prefix + "v_proj.weight", (channels, hidden)),
        g_proj=read.matrix(prefix + "g_proj.weight", (channels, hidden)),
        # Depthwise conv weights [C, 1, Kc] are read as w[c, j] = weight[c, 0, j] (§4.4).
        q_conv1d=read.vector(prefix + "q_conv1d.weight", channels * conv[1]).view(conv),
        k_conv1d=read.vector(prefix + "k_conv1d.weight", channels * conv[1]).view(conv),
        v_conv1d=read.vector(prefix + "v_conv1d.weight", channels * conv[1]).view(conv),
        f_a_proj=read.matrix(prefix + "f_a_proj.weight", (head_dim, hidden)),
        f_b_proj=read.matrix(prefix + "f_b_proj.weight", (channels, head_dim)),
        b_proj=read.matrix(prefix + "b_proj.weight", (heads, hidden)),
        A_log=read.vector(prefix + "A_log", heads, allow_longer=True),
        dt_bias=read.vector(prefix + "dt_bias", channels),
        o_norm=read.vector(prefix + "o_norm.weight", head_dim),
        o_proj=read.matrix(prefix + "o_proj.weight", (hidden, channels)),
    )


def _mla_weights(read: _TensorReader, prefix: str, config: ReferenceConfig) -> MlaWeights:
    d = config.mla_dims
    hidden, q_rank, kv_rank = config.hidden_size, config.q_lora_rank, config.kv_lora_rank
    q_width = d.num_heads * (d.qk_nope_head_dim + d.qk_rope_head_dim)
    kv_width = d.num_heads * (d.qk_nope_head_dim + d.v_head_dim)
    value_width = d.num_heads * d.v_head_dim
    gated = config.mla_use_output_gate
    return MlaWeights(
        q_a_proj=read.matrix(prefix + "q_a_proj.weight", (q_rank, hidden)),
        q_a_layernorm=read.vector(prefix + "q_a_layernorm.weight", q_rank),
        q_b_proj=read.matrix(prefix + "q_b_proj.weight", (q_width, q_rank)),
        kv_a_proj_with_mqa=read.matrix(prefix + "kv_a_proj_with_mqa.weight", (kv_rank + d.qk_rope_head_dim, hidden)),
        kv_a_layernorm=read.vector(prefix + "kv_a_layernorm.weight", kv_rank),
        kv_b_proj=read.matrix(prefix + "kv_b_proj.weight", (kv_width, kv_rank)),
        g_proj=read.matrix(prefix + "g_proj.weight", (value_width, hidden)) if gated else None,
        o_proj=read.matrix(prefix + "o_proj.weight", (hidden, value_width)),
    )


def _indexer_weights(read: _TensorReader, prefix: str, config: ReferenceConfig) -> IndexerWeights:
    heads, head_dim = config.index_n_heads, config.index_head_dim
    assert heads is not None and head_dim is not None, "indexer weights need index_n_heads and index_head_dim"
    return IndexerWeights(
        wq_b=read.matrix(prefix + "wq_b.weight", (heads * head_dim, config.q_lora_rank)),
        wk=read.matrix(prefix + "wk.weight", (head_dim, config.hidden_size)),
        k_norm_weight=read.vector(prefix + "k_norm.weight", head_dim),
        k_norm_bias=read.vector(prefix + "k_norm.bias", head_dim),
        weights_proj=read.matrix(prefix + "weights_proj.weight", (heads, config.hidden_size)),
    )


def _mlp_weights(read: _TensorReader, prefix: str, hidden: int, width: int) -> MlpWeights:
    return MlpWeights(
        gate_proj=read.matrix(prefix + "gate_proj.weight", (width, hidden)),
        up_proj=read.matrix(prefix + "up_proj.weight", (width, hidden)),
        down_proj=read.matrix(prefix + "down_proj.weight", (hidden, width)),
    )


def _stacked_experts(
    read: _TensorReader, prefix: str, matrix: str, num_experts: int, shape: tuple[int, int]
) -> torch.Tensor:
    """[E, out, in]: `experts.{e}.{matrix}` of every expert; w1 = gate, w3 = up, w2 = down (§3.2)."""
    return torch.stack([read.expert_matrix(f"{prefix}experts.{e}.{matrix}", shape) for e in range(num_experts)])


def _moe_weights(read: _TensorReader, prefix: str, config: ReferenceConfig) -> MoeWeights:
    hidden, experts, width = config.hidden_size, config.num_experts, config.moe_intermediate_size
    latent = config.routed_expert_hidden_size
    expert_in = hidden if latent is None else latent                    # §9 #10: no latent -> experts act on x
    has_bias = read.has(prefix + "gate.e_score_correction_bias")
    return MoeWeights(
        gate=read.matrix(prefix + "gate.weight", (experts, hidden)),
        e_score_correction_bias=read.vector(prefix + "gate.e_score_correction_bias", experts) if has_bias else None,
        routed_expert_down_proj=(
            None if latent is None else read.matrix(prefix + "routed_expert_down_proj.weight", (latent, hidden))
        ),
        routed_expert_norm=(
            read.vector(prefix + "routed_expert_norm.weight", latent)
            if latent is not None and config.latent_moe_use_norm
            else None
        ),
        routed_expert_up_proj=(
            None if latent is None else read.matrix(prefix + "routed_expert_up_proj.weight", (hidden, latent))
        ),
        experts_w1=_stacked_experts(read, prefix, "w1", experts, (width, expert_in)),
        experts_w3=_stacked_experts(read, prefix, "w3", experts, (width, expert_in)),
        experts_w2=_stacked_experts(read, prefix, "w2", experts, (expert_in, width)),
        shared_experts=(
            _mlp_weights(read, prefix + "shared_experts.", hidden, width * config.num_shared_experts)
            if config.num_shared_experts > 0
            else None
        ),
    )


def _attn_res_vector(read: _TensorReader, name: str, config: ReferenceConfig) -> torch.Tensor | None:
    """An AttnRes vector [D] (a [1, D] proj is flattened); None when the config has no AttnRes."""
    return None if config.attn_res_block_size is None else read.vector(name, config.hidden_size)


def _layer_weights(read: _TensorReader, layer: int, config: ReferenceConfig) -> LayerWeights:
    prefix, hidden = f"model.layers.{layer}.", config.hidden_size
    is_mla, is_moe = config.is_mla_layer(layer), config.is_moe_layer(layer)
    return LayerWeights(
        input_layernorm=read.vector(prefix + "input_layernorm.weight", hidden),
        post_attention_layernorm=read.vector(prefix + "post_attention_layernorm.weight", hidden),
        self_attention_res_norm=_attn_res_vector(read, prefix + "self_attention_res_norm.weight", config),
        self_attention_res_proj=_attn_res_vector(read, prefix + "self_attention_res_proj.weight", config),
        mlp_res_norm=_attn_res_vector(read, prefix + "mlp_res_norm.weight", config),
        mlp_res_proj=_attn_res_vector(read, prefix + "mlp_res_proj.weight", config),
        kda=None if is_mla else _kda_weights(read, prefix + "self_attn.", config),
        mla=_mla_weights(read, prefix + "self_attn.", config) if is_mla else None,
        indexer=(
            _indexer_weights(read, prefix + "self_attn.indexer.", config)
            if is_mla and config.index_topk is not None
            else None
        ),
        # §9 #12: every non-MoE layer (not only layer 0) has a dense MLP of width intermediate_size.
        mlp=None if is_moe else _mlp_weights(read, prefix + "mlp.", hidden, config.intermediate_size),
        moe=_moe_weights(read, prefix + "block_sparse_moe.", config) if is_moe else None,
    )


def build_model_weights(tensors: dict[str, torch.Tensor], config: ReferenceConfig) -> ModelWeights:
    """ModelWeights from text tensors (names without `language_model.`, floats already fp32)."""
    read = _TensorReader(tensors)
    vocab, hidden = config.vocab_size, config.hidden_size
    embed_tokens = read.matrix("model.embed_tokens.weight", (vocab, hidden))
    tied = config.tie_word_embeddings and not read.has("lm_head.weight")
    weights = ModelWeights(
        embed_tokens=embed_tokens,
        norm=read.vector("model.norm.weight", hidden),
        output_attn_res_norm=_attn_res_vector(read, "model.output_attn_res_norm.weight", config),
        output_attn_res_proj=_attn_res_vector(read, "model.output_attn_res_proj.weight", config),
        lm_head=embed_tokens if tied else read.matrix("lm_head.weight", (vocab, hidden)),
        layers=tuple(_layer_weights(read, layer, config) for layer in range(config.num_hidden_layers)),
    )
    unused = sorted(set(tensors) - read.used)
    if unused:
        logger.warning("%d checkpoint tensors are not used by the reference, e.g. %s", len(unused), unused[:3])
    return weights
