"""Taking tensors out of a loaded checkpoint for one layer (names as MODEL_SPEC.md §3)."""

from __future__ import annotations

import torch

from atomk31.model.linear import Linear

TEXT_PREFIX = "language_model."
MODEL_PREFIX = TEXT_PREFIX + "model."


class WeightSource:
    """The loaded (and already validated) checkpoint tensors, handed out once each.

    `take` pops a tensor so the weights of a layer are freed from the dict as the model is built,
    and converts it to the compute dtype on the target device. `take_fp32` is for small vectors
    that the spec computes in fp32 (gates, biases, norms of the KDA state, §3.2 "f32|bf16").
    """

    def __init__(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device):
        self.tensors = tensors
        self.dtype = dtype
        self.device = device

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = self.tensors.pop(name)
        return tensor.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def take_fp32(self, name: str) -> torch.Tensor:
        return self.take(name, torch.float32)

    def take_raw(self, name: str) -> torch.Tensor:
        """As stored (packed MXFP4 bytes, E8M0 scales): moved, never converted."""
        return self.tensors.pop(name).to(self.device).contiguous()

    def take_cat(self, names: list[str], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Several linears fused along the output dim, in the given order."""
        return torch.cat([self.take(n, dtype) for n in names], dim=0)

    def take_linear(self, names: str | list[str]) -> Linear:
        """One linear, or several fused along the output dim (in the given order), as stored:
        in the compute dtype, or FP8 + per-channel scales after PTPC quantization (§6.5)."""
        names = [names] if isinstance(names, str) else names
        scale_names = [n[: -len("weight")] + "weight_scale" for n in names]
        quantized = [s in self.tensors for s in scale_names]
        if not any(quantized):
            return Linear(self.take_cat(names), None)
        if not all(quantized):
            raise ValueError(f"fused linears {names} must all be PTPC-quantized or none; "
                             "adjust --online-quant-config's exclude_layer")
        weight = torch.cat([self.take_raw(n) for n in names], dim=0)
        scale = torch.cat([self.take_fp32(s) for s in scale_names], dim=0)
        return Linear(weight, scale)
