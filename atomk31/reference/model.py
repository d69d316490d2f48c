"""ReferenceModel: the whole K3/K3.1 text model of one sequence in float32 (MODEL_SPEC §4.3, §9).

No cache, no batching, no kernels: every forward recomputes the sequence from its first token
with the block functions of this package. The engine is judged against it.
"""

import logging
import os
from typing import Any

import torch

from atomk31.reference.attn_res import attn_res
from atomk31.reference.config import ReferenceConfig, load_config
from atomk31.reference.formats import FP8_VARIANTS
from atomk31.reference.indexer import INDEX_KEY_FORMATS
from atomk31.reference.kda import kda_layer
from atomk31.reference.mla import LATENT_FORMATS, gated_mla
from atomk31.reference.mlp import dense_mlp
from atomk31.reference.moe import latent_moe
from atomk31.reference.norms import root_mean_square
from atomk31.reference.safetensors_io import read_text_tensors
from atomk31.reference.weights import LayerWeights, ModelWeights, build_model_weights

logger = logging.getLogger(__name__)


class ReferenceModel:
    """The oracle. `index_key_format` ("exact" | "fp8" | "mxfp4") simulates the index-key cache,
    `latent_format` ("exact" | "fp8") the MLA latent cache (static scale 1.0, §9 #15), both with
    the E4M3 variant `fp8_variant` ("e4m3fn" | "e4m3fnuz")."""

    def __init__(
        self,
        config: ReferenceConfig,
        weights: ModelWeights,
        index_key_format: str = "exact",
        latent_format: str = "exact",
        fp8_variant: str = "e4m3fn",
    ) -> None:
        if index_key_format not in INDEX_KEY_FORMATS:
            raise ValueError(f"index_key_format must be one of {INDEX_KEY_FORMATS}, got {index_key_format!r}")
        if latent_format not in LATENT_FORMATS:
            raise ValueError(f"latent_format must be one of {LATENT_FORMATS}, got {latent_format!r}")
        if fp8_variant not in FP8_VARIANTS:
            raise ValueError(f"fp8_variant must be one of {FP8_VARIANTS}, got {fp8_variant!r}")
        self.config = config
        self.weights = weights
        self.index_key_format = index_key_format
        self.latent_format = latent_format
        self.fp8_variant = fp8_variant

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        index_key_format: str = "exact",
        latent_format: str = "exact",
        fp8_variant: str = "e4m3fn",
    ) -> "ReferenceModel":
        """Load config.json and the safetensors weights (one file or sharded) of `path`."""
        config = load_config(path)
        weights = build_model_weights(read_text_tensors(path), config)
        logger.info("loaded reference model from %s (%d layers)", os.fspath(path), config.num_hidden_layers)
        return cls(config, weights, index_key_format, latent_format, fp8_variant)

    def _token_tensor(self, token_ids: torch.Tensor | list[int]) -> torch.Tensor:
        ids = torch.as_tensor(token_ids)
        if ids.dim() != 1 or (ids.numel() and (ids.is_floating_point() or ids.is_complex())):
            raise ValueError(
                f"token_ids must be a 1-D integer sequence of one request, got shape {list(ids.shape)}, {ids.dtype}"
            )
        ids = ids.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got min {int(ids.min())}, max {int(ids.max())}"
            )
        return ids

    def _mixer(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        config = self.config
        if layer.kda is not None:
            output, _ = kda_layer(x, layer.kda, config.gate_lower_bound, config.rms_norm_eps)
            return output
        assert layer.mla is not None, "a layer without KDA weights must have MLA weights"
        return gated_mla(
            x,
            layer.mla,
            config.mla_dims,
            indexer=layer.indexer,
            index_topk=config.index_topk,
            index_key_format=self.index_key_format,
            latent_format=self.latent_format,
            fp8_variant=self.fp8_variant,
        )

    def _ffn(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        config = self.config
        if layer.moe is None:
            assert layer.mlp is not None, "a layer without MoE weights must have dense MLP weights"
            return dense_mlp(x, layer.mlp, config.situ_beta, config.situ_linear_beta)
        return latent_moe(
            x,
            layer.moe,
            config.num_experts_per_token,
            config.moe_renormalize,
            config.routed_scaling_factor,
            config.rms_norm_eps,
            config.situ_beta,
            config.situ_linear_beta,
        )

    def forward(
        self,
        token_ids: torch.Tensor | list[int],
        trace: list[dict[str, Any]] | None = None,
        output_prefixes: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits [T, V] (float32) of one sequence token_ids [T] at positions 0..T-1.

        `trace`, if given, receives one dict per layer: layer, kind ("kda" | "mla") and the RMS
        over all tokens and channels of the mixer output, the FFN output and the prefix after
        the layer. `output_prefixes`, if given, receives the AttnRes prefix after each layer
        ([T, D] each; the "hidden state after layer l" that DSpark consumes, §4.3).
        """
        ids = self._token_tensor(token_ids)
        config, weights, eps = self.config, self.weights, self.config.rms_norm_eps
        prefix: torch.Tensor | None = weights.embed_tokens[ids]            # [T, D]
        blocks: list[torch.Tensor] = []
        for index, layer in enumerate(weights.layers):
            assert prefix is not None, "the prefix is only empty between banking and the mixer"
            x = attn_res(
                blocks, prefix, layer.self_attention_res_proj, layer.self_attention_res_norm, layer.input_layernorm, eps
            )
            if config.closes_attn_res_block(index):
                blocks.append(prefix)                   # bank after mixing: the prefix was a candidate
                prefix = None
            mixer_output = self._mixer(layer, x)
            prefix = mixer_output if prefix is None else prefix + mixer_output
            x = attn_res(blocks, prefix, layer.mlp_res_proj, layer.mlp_res_norm, layer.post_attention_layernorm, eps)
            ffn_output = self._ffn(layer, x)
            prefix = prefix + ffn_output
            if output_prefixes is not None:
                output_prefixes.append(prefix)
            if trace is not None:
                trace.append(
                    {
                        "layer": index,
                        "kind": "kda" if layer.kda is not None else "mla",
                        "mixer_out_rms": root_mean_square(mixer_output),
                        "ffn_out_rms": root_mean_square(ffn_output),
                        "prefix_rms": root_mean_square(prefix),
                    }
                )
        assert prefix is not None, "every layer leaves a prefix"
        hidden = attn_res(blocks, prefix, weights.output_attn_res_proj, weights.output_attn_res_norm, weights.norm, eps)
        return hidden @ weights.lm_head.T

    def hidden_states(self, token_ids: torch.Tensor | list[int]) -> list[torch.Tensor]:
        """The AttnRes prefix after every layer: num_hidden_layers tensors [T, D] (§4.3)."""
        prefixes: list[torch.Tensor] = []
        self.forward(token_ids, output_prefixes=prefixes)
        return prefixes

    def greedy(self, token_ids: torch.Tensor | list[int], n: int) -> list[int]:
        """`n` new tokens by argmax (ties -> lowest id), re-running forward on the growing sequence."""
        if n < 0:
            raise ValueError(f"n must be >= 0 new tokens, got {n}")
        tokens = self._token_tensor(token_ids).tolist()
        if n > 0 and not tokens:
            raise ValueError("greedy needs at least one prompt token to predict from, got an empty prompt")
        generated: list[int] = []
        for _ in range(n):
            logits = self.forward(torch.tensor(tokens, dtype=torch.long))
            next_token = int(torch.argmax(logits[-1]))   # torch.argmax returns the first maximum
            tokens.append(next_token)
            generated.append(next_token)
        return generated
