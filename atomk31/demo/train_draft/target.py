"""The frozen target of the distillation: the demo trainer's model with a checkpoint's weights,
run over a padded batch to give what the draft learns from.

`TargetOutputs` per token: the AttnRes prefix after each tapped layer (MODEL_SPEC §4.3, §5.4:
what the engine's `forward_with_taps` hands the draft), and the target's greedy next token
(argmax of its logits). The target runs with its shipped quantization (MXFP4 routed experts, FP8
MLA latents), the values the engine serves; the experts read from the checkpoint are MXFP4
values already, whose re-quantization at every forward (the trainer's straight-through path)
is an identity that costs a third of the forward on a CPU, so it is switched off. Dense causal
MLA: the demo sequences are
shorter than the indexer's top-k (256), where the sparse selection keeps every key anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from atomk31.config import ModelConfig
from atomk31.demo.train.export import read_checkpoint
from atomk31.demo.train.layers import attn_res
from atomk31.demo.train.model import DemoModel, ForwardOptions


@dataclass
class TargetOutputs:
    """aux [B, T, n*D] float32 (taps in `tap_layer_ids` order), greedy [B, T] int64 (the
    target's argmax after each position)."""

    aux: torch.Tensor
    greedy: torch.Tensor


class FrozenTarget:
    """A checkpoint of the demo architecture, frozen, with its embedding and LM head exposed
    (the draft shares both, §5.2)."""

    def __init__(self, checkpoint: Path, device: torch.device) -> None:
        self.config_json = json.loads((Path(checkpoint) / "config.json").read_text())
        self.config = ModelConfig.from_dict(self.config_json)
        self.model = DemoModel(self.config)
        read_checkpoint(self.model, Path(checkpoint))
        self.model.set_quantized(True)
        for moe in self.model.moe_layers():    # already on the MXFP4 grid: skip re-quantizing
            moe.quantize = False
        self.model.to(device).eval().requires_grad_(False)

    @property
    def embed(self) -> torch.Tensor:
        return self.model.model.embed_tokens.weight

    @property
    def lm_head(self) -> torch.Tensor:
        return self.model.lm_head.weight

    @property
    def final_norm(self) -> torch.Tensor:
        return self.model.model.norm.weight

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, token_mask: torch.Tensor,
            tap_layer_ids: tuple[int, ...]) -> TargetOutputs:
        """input_ids, token_mask [B, T] (right-padded) -> the taps and greedy tokens."""
        model = self.model
        options = ForwardOptions(sparse=False, token_mask=token_mask)
        prefix = model.model.embed_tokens(input_ids).float()
        blocks: list[torch.Tensor] = []
        taps: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(model.model.layers):
            prefix, _ = layer(blocks, prefix, options)
            if index in tap_layer_ids:
                taps[index] = prefix
        mixed = attn_res(blocks, prefix, model.model.output_attn_res_proj,
                         model.model.output_attn_res_norm)
        logits = model.logits(model.model.norm(mixed))
        aux = torch.cat([taps[i] for i in tap_layer_ids], dim=-1)
        return TargetOutputs(aux=aux, greedy=logits.argmax(dim=-1))
