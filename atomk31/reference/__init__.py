"""The oracle: a plain float32 PyTorch forward of Kimi K3.1 straight from MODEL_SPEC.md.

One sequence, no cache, no batching, no kernels, and no imports from the rest of atomk31: it
carries its own config reading and number formats so that it cannot share a bug with the
engine. Every fast path is tested against it. The block functions take their weights as
explicit arguments so tests can call them directly.
"""

from atomk31.reference.attn_res import attn_res
from atomk31.reference.config import MlaDims, ReferenceConfig, load_config, parse_config
from atomk31.reference.formats import (
    dequantize_mxfp4,
    fake_quant_fp8_groups,
    fake_quant_mxfp4,
    quantize_mxfp4,
    round_to_e2m1,
    round_to_e4m3,
)
from atomk31.reference.indexer import (
    IndexerWeights,
    indexer_projections,
    indexer_scores,
    indexer_select,
    select_topk,
    simulate_index_quantization,
)
from atomk31.reference.kda import KdaState, KdaWeights, kda_gates, kda_layer, short_conv_silu
from atomk31.reference.kda_scan import kda_chunked, kda_recurrent
from atomk31.reference.mla import (
    MlaWeights,
    gated_mla,
    mla_attention_absorbed,
    mla_attention_expanded,
    mla_projections,
)
from atomk31.reference.mlp import MlpWeights, dense_mlp, situ_glu
from atomk31.reference.model import ReferenceModel
from atomk31.reference.moe import MoeWeights, latent_moe, route
from atomk31.reference.norms import l2_normalize, layer_norm, rms_norm
from atomk31.reference.weights import LayerWeights, ModelWeights, build_model_weights

__all__ = [
    "IndexerWeights",
    "KdaState",
    "KdaWeights",
    "LayerWeights",
    "MlaDims",
    "MlaWeights",
    "MlpWeights",
    "ModelWeights",
    "MoeWeights",
    "ReferenceConfig",
    "ReferenceModel",
    "attn_res",
    "build_model_weights",
    "dense_mlp",
    "dequantize_mxfp4",
    "fake_quant_fp8_groups",
    "fake_quant_mxfp4",
    "gated_mla",
    "indexer_projections",
    "indexer_scores",
    "indexer_select",
    "kda_chunked",
    "kda_gates",
    "kda_layer",
    "kda_recurrent",
    "l2_normalize",
    "latent_moe",
    "layer_norm",
    "load_config",
    "mla_attention_absorbed",
    "mla_attention_expanded",
    "mla_projections",
    "parse_config",
    "quantize_mxfp4",
    "rms_norm",
    "round_to_e2m1",
    "round_to_e4m3",
    "route",
    "select_topk",
    "short_conv_silu",
    "simulate_index_quantization",
    "situ_glu",
]
