"""Taking tensors out of a checkpoint for one layer (names as MODEL_SPEC.md §3).

A layer takes each tensor it needs once, whole or as the ``Shard`` its rank holds (the rows of
its heads, the columns of a row-parallel linear's input, ...): the layer knows how it is split
(``parallel_linear.py``), so the source stays generic. The source is either a dict of loaded
tensors (tests, and the single-device path of older callers) or a `CheckpointSlices`, which
reads each slice from the safetensors files only when it is taken.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import torch

from atomk31.checkpoint.slices import CheckpointSlices, Shard
from atomk31.model.linear import Linear
from atomk31.quant.ptpc import (
    SCALE_SUFFIX, is_ptpc_eligible, parse_online_quant_config, quantize_weight_ptpc,
)

TEXT_PREFIX = "language_model."
MODEL_PREFIX = TEXT_PREFIX + "model."

__all__ = ["MODEL_PREFIX", "TEXT_PREFIX", "Shard", "WeightSource"]


class WeightSource:
    """The (already validated) checkpoint tensors, handed out once each.

    `take` removes a tensor from the source, so the weights of a layer are freed as the model
    is built, and converts it to the compute dtype on the target device. `take_fp32` is for
    small vectors that the spec computes in fp32 (gates, biases, norms of the KDA state, §3.2
    "f32|bf16"). ``online_quant_config`` (ATOM's JSON, §6.5): PTPC-quantize every eligible
    linear as it is taken, slice by slice (a row-parallel slice gets per-output-channel scales
    of its own columns).
    """

    def __init__(self, tensors: MutableMapping[str, torch.Tensor] | CheckpointSlices,
                 dtype: torch.dtype, device: torch.device,
                 online_quant_config: dict | None = None, fp8_variant: str = "e4m3fn"):
        self.tensors = tensors
        self.dtype = dtype
        self.device = device
        self.quant = (parse_online_quant_config(online_quant_config)
                      if online_quant_config is not None else None)
        self.fp8_variant = fp8_variant

    def has(self, name: str) -> bool:
        return name in self.tensors

    def discard(self, name: str) -> None:
        """Drop ``name`` unread if the source has it (another rank's expert)."""
        if name in self.tensors:
            if isinstance(self.tensors, CheckpointSlices):
                self.tensors.discard(name)
            else:
                del self.tensors[name]

    def _pop(self, name: str, shard: Shard | None) -> torch.Tensor:
        if isinstance(self.tensors, CheckpointSlices):
            return self.tensors.pop(name, shard)
        tensor = self.tensors.pop(name)
        if shard is None:
            return tensor
        return tensor.narrow(shard.dim, shard.start, shard.stop - shard.start)

    def take(self, name: str, dtype: torch.dtype | None = None,
             shard: Shard | None = None) -> torch.Tensor:
        tensor = self._pop(name, shard)
        return tensor.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def take_fp32(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        return self.take(name, torch.float32, shard)

    def take_raw(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        """As stored (packed MXFP4 bytes, E8M0 scales): moved, never converted."""
        return self._pop(name, shard).to(self.device).contiguous()

    def take_cat(self, names: list[str], dtype: torch.dtype | None = None,
                 shard: Shard | None = None) -> torch.Tensor:
        """Several linears fused along the output dim, in the given order (each sliced by
        ``shard`` first)."""
        return torch.cat([self.take(n, dtype, shard) for n in names], dim=0)

    def take_linear(self, names: str | list[str], shard: Shard | None = None) -> Linear:
        """One linear, or several fused along the output dim (in the given order, each sliced
        by ``shard``): in the compute dtype, or FP8 + per-channel scales after PTPC
        quantization (§6.5), done here or already in the source."""
        names = [names] if isinstance(names, str) else names
        scale_names = [n[: -len("weight")] + SCALE_SUFFIX for n in names]
        quantized = [s in self.tensors for s in scale_names]
        if any(quantized):
            return self._take_prequantized(names, scale_names, quantized, shard)
        parts = [self._pop(n, shard) for n in names]
        if self.quant is not None and all(is_ptpc_eligible(n, p, self.quant)
                                          for n, p in zip(names, parts)):
            pairs = [quantize_weight_ptpc(p.to(self.device), self.fp8_variant) for p in parts]
            return Linear(torch.cat([w for w, _ in pairs]).contiguous(),
                          torch.cat([s for _, s in pairs]).contiguous())
        if self.quant is not None and any(is_ptpc_eligible(n, p, self.quant)
                                          for n, p in zip(names, parts)):
            raise ValueError(f"fused linears {names} must all be PTPC-quantized or none; "
                             "adjust --online-quant-config's exclude_layer")
        weight = torch.cat([p.to(device=self.device, dtype=self.dtype) for p in parts], dim=0)
        return Linear(weight.contiguous(), None)

    def _take_prequantized(self, names: list[str], scale_names: list[str],
                           quantized: list[bool], shard: Shard | None) -> Linear:
        if not all(quantized):
            raise ValueError(f"fused linears {names} must all be PTPC-quantized or none; "
                             "adjust --online-quant-config's exclude_layer")
        if shard is not None and shard.dim != 0:
            raise ValueError(f"{names[0]} was PTPC-quantized over its whole input; a "
                             "row-parallel slice needs its own scales: pass the online quant "
                             "config to the model instead of pre-quantized tensors")
        weight = torch.cat([self.take_raw(n, shard) for n in names], dim=0)
        scale_shard = None if shard is None else Shard(0, shard.start, shard.stop)
        scale = torch.cat([self.take_fp32(s, scale_shard) for s in scale_names], dim=0)
        return Linear(weight, scale)
