"""Kimi K3.1 in engine form: the decoder stack with attention residuals (MODEL_SPEC §4.3).

`K31Model.forward(batch, kv_caches, kda_conv, kda_state, ops)` runs one engine step over a batch
that mixes prefill chunks and decodes with the kernels of ``ops`` (the engine's eager table, or
its graph table when the step is captured), and returns float32 logits for the tokens in
`batch.logits_indices` only. AttnRes is per token, so no cross-token state exists beyond the
caches: the depth blocks of a step live for that step alone.

Under tensor parallelism (``parallel``: ``distributed/parallel_context.py``) every rank builds
this model from its own slices of the checkpoint and runs the same forward; the embedding,
norms and AttnRes sites are replicated, the LM head is vocabulary-parallel and only the first
rank receives the logits.
"""

from __future__ import annotations

import torch

from atomk31.cache import MLACacheView
from atomk31.checkpoint.slices import CheckpointSlices
from atomk31.config import ModelConfig
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.batch import ForwardBatch
from atomk31.model.ffn import DenseMLP, LatentMoE
from atomk31.model.kda_layer import KDAMixer
from atomk31.model.mla_layer import MLAMixer
from atomk31.model.parallel_linear import VocabParallelLMHead
from atomk31.model.weights import MODEL_PREFIX, TEXT_PREFIX, WeightSource
from atomk31.ops import OpTable


class AttnResSite:
    """One AttnRes mixing site (§4.3): softmax over depth of w_p · rms_norm(V, w_n), then the
    consumer's norm. w_n * w_p is folded into one query vector at load."""

    def __init__(self, weights: WeightSource, res_prefix: str, out_norm_name: str, eps: float):
        w_n = weights.take_fp32(res_prefix + "_norm.weight")
        w_p = weights.take_fp32(res_prefix + "_proj.weight")[0]
        self.query = w_n * w_p
        self.out_norm = weights.take_fp32(out_norm_name)
        self.eps = eps

    def __call__(self, blocks: list[torch.Tensor], prefix: torch.Tensor,
                 ops: OpTable) -> torch.Tensor:
        candidates = torch.stack(blocks + [prefix])
        return ops.attn_res(candidates, self.query, self.out_norm, self.eps)


class DecoderLayer:
    def __init__(self, config: ModelConfig, weights: WeightSource, layer: int,
                 mla_index: int | None, kda_index: int | None, index_format: str,
                 fp8_variant: str, parallel: ParallelContext, dequantize_experts: bool = False):
        p = f"{MODEL_PREFIX}layers.{layer}."
        eps = config.rms_norm_eps
        self.layer = layer
        self.closes_block = config.closes_attn_res_block(layer)
        self.attn_site = AttnResSite(weights, p + "self_attention_res", p + "input_layernorm.weight",
                                     eps)
        self.mlp_site = AttnResSite(weights, p + "mlp_res", p + "post_attention_layernorm.weight",
                                    eps)
        self.mla_index = mla_index
        self.kda_index = kda_index
        if mla_index is not None:
            self.mixer = MLAMixer(config, weights, p, index_format, fp8_variant, parallel)
        else:
            self.mixer = KDAMixer(config, weights, p, kda_index, parallel)
        self.ffn = (LatentMoE(config, weights, p, parallel, dequantize_experts)
                    if config.is_moe_layer(layer)
                    else DenseMLP(config, weights, p + "mlp.", config.intermediate_size,
                                  parallel))

    @property
    def ops_called(self) -> tuple[str, ...]:
        ffn = self.ffn.ops_called if isinstance(self.ffn, LatentMoE) else DenseMLP.OPS
        return ("attn_res",) + self.mixer.OPS + ffn


class K31Model:
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor] | CheckpointSlices,
                 dtype: torch.dtype, device: torch.device, index_format: str = "fp8",
                 fp8_variant: str = "e4m3fn", parallel: ParallelContext | None = None,
                 online_quant_config: dict | None = None, dequantize_experts: bool = False):
        """``tensors``: loaded tensors, or a CheckpointSlices that reads this rank's slices as
        they are taken; ``online_quant_config``: PTPC-quantize eligible linears as they are
        taken (§6.5); ``dequantize_experts``: MXFP4 routed experts decoded once into ``dtype``
        (EngineConfig.dequantize_experts)."""
        parallel = parallel or ParallelContext.single()
        weights = WeightSource(tensors, dtype, device, online_quant_config, fp8_variant)
        self.config = config
        self.parallel = parallel
        self.dtype = dtype
        self.embed = weights.take(MODEL_PREFIX + "embed_tokens.weight")
        mla_ids, kda_ids = list(config.mla_layer_ids), list(config.kda_layer_ids)
        self.layers = [
            DecoderLayer(config, weights, layer,
                         mla_ids.index(layer) if layer in mla_ids else None,
                         kda_ids.index(layer) if layer in kda_ids else None,
                         index_format, fp8_variant, parallel, dequantize_experts)
            for layer in range(config.num_hidden_layers)
        ]
        self.output_site = AttnResSite(weights, MODEL_PREFIX + "output_attn_res",
                                       MODEL_PREFIX + "norm.weight", config.rms_norm_eps)
        self.lm_head = VocabParallelLMHead(weights, TEXT_PREFIX + "lm_head.weight",
                                           *parallel.layout.tp_range(config.vocab_size),
                                           parallel.tp)
        leftover = sorted(weights.tensors)
        if leftover:
            raise ValueError(f"checkpoint tensors not used by the model: {leftover[:8]}"
                             f"{' ...' if len(leftover) > 8 else ''}")

    @property
    def ops_called(self) -> set[str]:
        """Every op ``forward`` may call with these weights (graph steps need each to have an
        implementation a graph may capture)."""
        return {op for layer in self.layers for op in layer.ops_called}

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_caches: list[MLACacheView],
                kda_conv: torch.Tensor, kda_state: torch.Tensor, ops: OpTable) -> torch.Tensor:
        """-> float32 logits [len(batch.logits_indices), vocab]."""
        return self._forward(batch, kv_caches, kda_conv, kda_state, ops, ())[0]

    @torch.inference_mode()
    def forward_with_taps(self, batch: ForwardBatch, kv_caches: list[MLACacheView],
                          kda_conv: torch.Tensor, kda_state: torch.Tensor, ops: OpTable,
                          tap_layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits as `forward`, the AttnRes prefix after each layer of `tap_layer_ids` for
        every token, concatenated in that order [T, len(tap_layer_ids) * D]): the hidden states
        a DSpark draft reads (§4.3, §5.4)."""
        return self._forward(batch, kv_caches, kda_conv, kda_state, ops, tap_layer_ids)

    def _forward(self, batch: ForwardBatch, kv_caches: list[MLACacheView],
                 kda_conv: torch.Tensor, kda_state: torch.Tensor, ops: OpTable,
                 tap_layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        taps: dict[int, torch.Tensor] = {}
        prefix = self.embed[batch.input_ids]
        blocks: list[torch.Tensor] = []
        for layer in self.layers:
            x = layer.attn_site(blocks, prefix, ops)
            if layer.closes_block:                 # bank at the attention site (§4.3)
                blocks.append(prefix)
                prefix = None
            if layer.mla_index is not None:
                a = layer.mixer.forward(x, batch, kv_caches[layer.mla_index], ops)
            else:
                a = layer.mixer.forward(x, batch, kda_conv, kda_state, ops)
            prefix = a if prefix is None else _add(prefix, a)
            x = layer.mlp_site(blocks, prefix, ops)
            prefix = _add(prefix, layer.ffn.forward(x, ops))
            if layer.layer in tap_layer_ids:
                taps[layer.layer] = prefix
        rows = batch.logits_indices
        h = self.output_site([b[rows] for b in blocks], prefix[rows], ops)
        aux = torch.cat([taps[i] for i in tap_layer_ids], dim=-1) if tap_layer_ids else None
        return self.lm_head(h), aux


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Residual adds happen in fp32 and round once to the stream's dtype (§4.3)."""
    return (a.float() + b.float()).to(a.dtype)
