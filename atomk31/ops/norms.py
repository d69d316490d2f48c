"""Normalisations: RMSNorm, gated RMSNorm (KDA output) and LayerNorm (indexer keys).

Contract (MODEL_SPEC §4.2, §4.4):

* ``rms_norm(x [..., n], weight [n], eps) -> [..., n]``:
  ``weight * x / sqrt(mean(x^2) + eps)`` over the last dim; the weight multiplies (no "1 + w").
* ``gated_rms_norm(x [T, H, V], gate [T, H, V], weight [V], eps) -> [T, H, V]``:
  ``rms_norm(x, weight, eps) * sigmoid(gate)``, per head over V with one weight shared by all
  heads (KDA ``o_norm``, §4.4). Any leading dims are accepted as long as x and gate agree.
* ``layer_norm(x [..., n], weight [n], bias [n], eps) -> [..., n]``:
  ``weight * (x - mean) / sqrt(var + eps) + bias`` with the biased variance.

Inputs may be any float dtype; every norm computes in fp32 (statistics and products) and
rounds once to ``x.dtype`` at the end (§4.1). Epsilons come from the caller (§9 #3: 1e-5 for
RMSNorms except the MLA latent norms, 1e-6 for LayerNorm). Tests: fp32 results within 1e-6
relative of a per-row loop; BF16 outputs equal the fp32 result rounded once.
"""

import torch

from atomk31.ops.registry import register
from atomk31.ops.requirements import all_of, needs_compute, needs_gpu, needs_rocm


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim. x: [..., n]; weight: [n] -> [..., n] in x.dtype."""
    _check_weight("rms_norm", x, weight, "weight")
    return _rms_norm_fp32(x, weight, eps).to(x.dtype)


def gated_rms_norm_torch(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """KDA output norm (§4.4). x, gate: [T, H, V]; weight: [V] -> [T, H, V] in x.dtype.

    Fused form: the sigmoid gate multiplies the fp32 norm before the single rounding.
    """
    if gate.shape != x.shape:
        raise ValueError(
            f"gated_rms_norm: gate must have the shape of x {tuple(x.shape)}, "
            f"got {tuple(gate.shape)}"
        )
    _check_weight("gated_rms_norm", x, weight, "weight")
    return (_rms_norm_fp32(x, weight, eps) * torch.sigmoid(gate.float())).to(x.dtype)


def layer_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim with biased variance. x: [..., n]; weight, bias: [n]."""
    _check_weight("layer_norm", x, weight, "weight")
    _check_weight("layer_norm", x, bias, "bias")
    xf = x.float()
    centred = xf - xf.mean(dim=-1, keepdim=True)
    variance = centred.square().mean(dim=-1, keepdim=True)  # biased, as §4.2
    y = centred * torch.rsqrt(variance + eps) * weight.float() + bias.float()
    return y.to(x.dtype)


def _rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps) * weight.float()


def _check_weight(op: str, x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dim() == 0 or weight.shape != (x.shape[-1],):
        raise ValueError(
            f"{op}: {name} must have shape [{x.shape[-1] if x.dim() else 'n'}] "
            f"(the last dim of x {tuple(x.shape)}), got {tuple(weight.shape)}"
        )


register("rms_norm", "torch", rms_norm_torch)
register("rms_norm", "amd", "atomk31.ops.amd_adapters:rms_norm_aiter",
         why_not=all_of(needs_rocm(("gfx950", "gfx942"), "aiter"),
                        needs_compute(torch.bfloat16, torch.float16)))
register("gated_rms_norm", "torch", gated_rms_norm_torch)
register("gated_rms_norm", "triton", "atomk31.triton_kernels.gated_rms_norm:gated_rms_norm_triton",
         why_not=needs_gpu)
register("layer_norm", "torch", layer_norm_torch)
