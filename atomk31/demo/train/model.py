"""The trainer's K3.1: embeddings, decoder layers with AttnRes, final norm and LM head
(MODEL_SPEC §4.3). `state_dict()` names are the checkpoint's without `language_model.`, except
the stacked routed experts (`block_sparse_moe.experts_w{1,3,2}`), which export.py splits per
expert and packs as MXFP4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from atomk31.config import ModelConfig
from atomk31.demo.train.kda import KdaMixer, init_kda_conv
from atomk31.demo.train.layers import DenseMlp, RMSNorm, attn_res, res_proj
from atomk31.demo.train.mla import GatedMla
from atomk31.demo.train.moe import LatentMoe


@dataclass
class ForwardOptions:
    """How one forward runs: `sparse` MLA through the indexer's top-k (else dense causal);
    `kl_rows` / `kl_valid` [B, R]: query rows whose attention trains the indexer (None: no KL);
    `token_mask` [B, T]: real tokens (padding excluded from the experts' load statistics)."""

    sparse: bool = False
    kl_rows: torch.Tensor | None = None
    kl_valid: torch.Tensor | None = None
    token_mask: torch.Tensor | None = None


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.index = index
        self.closes_block = config.closes_attn_res_block(index)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attention_res_norm = RMSNorm(hidden, eps)
        self.self_attention_res_proj = res_proj(hidden)
        self.mlp_res_norm = RMSNorm(hidden, eps)
        self.mlp_res_proj = res_proj(hidden)
        self.self_attn = GatedMla(config) if config.is_mla_layer(index) else KdaMixer(config)
        if config.is_moe_layer(index):
            self.block_sparse_moe = LatentMoe(config)
        else:
            self.mlp = DenseMlp(hidden, config.intermediate_size, config.activation_situ_beta,
                                config.activation_situ_linear_beta)

    def forward(self, blocks: list[torch.Tensor], prefix: torch.Tensor, options: ForwardOptions
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer of §4.3's loop; banks `prefix` into `blocks` when this layer closes a block.
        Returns (the new prefix, the indexer's KL loss or None)."""
        x = self.input_layernorm(attn_res(blocks, prefix, self.self_attention_res_proj,
                                          self.self_attention_res_norm))
        if self.closes_block:
            blocks.append(prefix)
            prefix = None
        loss = None
        if isinstance(self.self_attn, GatedMla):
            mixed, loss = self.self_attn(x, options.sparse, options.kl_rows, options.kl_valid)
        else:
            mixed = self.self_attn(x)
        prefix = mixed.float() if prefix is None else prefix + mixed.float()
        x = self.post_attention_layernorm(attn_res(blocks, prefix, self.mlp_res_proj,
                                                   self.mlp_res_norm))
        ffn = self.block_sparse_moe(x, options.token_mask) if hasattr(self, "block_sparse_moe") \
            else self.mlp(x)
        return prefix + ffn.float(), loss


class Backbone(nn.Module):
    """`model.*`: embeddings, layers, the output AttnRes site and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.output_attn_res_norm = RMSNorm(hidden, eps)
        self.output_attn_res_proj = res_proj(hidden)
        self.norm = RMSNorm(hidden, eps)


class DemoModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fan-in init (N(0, 1/in)) for every linear; output projections of each sublayer a
        further 1/sqrt(2 N) so the prefix sum of 2N sublayers starts near the embedding's
        scale; embeddings N(0, 1); AttnRes pseudo-queries zero (uniform first mix)."""
        depth_scale = 1 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name.endswith("_res_proj"):
                std = module.in_features**-0.5
                if name.endswith(("o_proj", "down_proj", "routed_expert_up_proj")):
                    std *= depth_scale
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, nn.Conv1d):
                init_kda_conv(module)
        nn.init.normal_(self.model.embed_tokens.weight, std=1.0)

    def moe_layers(self) -> list[LatentMoe]:
        return [m for m in self.modules() if isinstance(m, LatentMoe)]

    def mla_layers(self) -> list[GatedMla]:
        return [m for m in self.modules() if isinstance(m, GatedMla)]

    def set_quantized(self, quantize: bool) -> None:
        """Routed experts at their MXFP4 values and MLA latents at FP8 values (the shipped
        weights, the GPU cache), or full precision."""
        for module in (*self.moe_layers(), *self.mla_layers()):
            module.quantize = quantize

    def kda_layers(self) -> list[KdaMixer]:
        return [m for m in self.modules() if isinstance(m, KdaMixer)]

    def forward(self, input_ids: torch.Tensor, options: ForwardOptions
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids [B, T] -> (final hidden states [B, T, D] float32, indexer KL losses)."""
        prefix = self.model.embed_tokens(input_ids).float()
        blocks: list[torch.Tensor] = []
        losses = []
        for layer in self.model.layers:
            prefix, loss = layer(blocks, prefix, options)
            if loss is not None:
                losses.append(loss)
        mixed = attn_res(blocks, prefix, self.model.output_attn_res_proj,
                         self.model.output_attn_res_norm)
        return self.model.norm(mixed), losses

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
