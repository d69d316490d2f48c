"""A linear layer of the engine: `y = x @ W.T` in the compute dtype, or PTPC-FP8 (§6.5).

A checkpoint dict that went through the online quantizer (`atomk31.quant.ptpc`) carries an FP8
`X.weight` plus `X.weight_scale` (one fp32 scale per output channel); such a linear quantizes
its input per token at run time and multiplies in FP8 (`ops.ptpc_linear`).
"""

from __future__ import annotations

import torch

from atomk31.ops import OpTable


class Linear:
    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor | None):
        self.weight = weight                # [N, K]: compute dtype, or FP8 with weight_scale
        self.weight_scale = weight_scale    # fp32 [N] or None

    @property
    def is_fp8(self) -> bool:
        return self.weight_scale is not None

    def __call__(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        if self.weight_scale is None:
            return x @ self.weight.T
        return ops.ptpc_linear(x, self.weight, self.weight_scale)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype` (for weights used other than as a linear, e.g. MLA's absorbed
        kv_b: an FP8 one is then weight-only quantized)."""
        if self.weight_scale is None:
            return self.weight.to(dtype)
        return (self.weight.float() * self.weight_scale[:, None]).to(dtype)
