"""Linear layers: the plain BF16 linear and the PTPC-FP8 scaled linear (MODEL_SPEC §6.5).

Contracts (M = tokens, K = in features, N = out features):

* ``linear(x [..., K], weight [N, K]) -> [..., N]``: ``x @ weight.T`` with fp32 accumulation,
  rounded once to x's dtype.
* ``ptpc_quantize(x [..., K], fp8_dtype) -> (x_q [..., K] fp8, x_scale fp32 [...])``: the
  dynamic per-token activation quantizer, ``x_scale = max(amax |x|, 1e-12) / fmax``,
  ``x_q = fp8(clamp(x / x_scale, -fmax, fmax))`` (RNE, saturating; fmax 448 for e4m3fn,
  240 for e4m3fnuz, §6.1).
* ``ptpc_linear_quantized(x_q, x_scale, w_fp8 [N, K], w_scale fp32 [N], out_dtype)
  -> [..., N]``: ``(x_q @ w_fp8.T) * x_scale[..., None] * w_scale`` with fp32 accumulation,
  one rounding to out_dtype. The products of FP8 values are exact in fp32, so backends
  differ only by summation order.
* ``ptpc_linear(x [..., K], w_fp8, w_scale) -> [..., N]`` in x's dtype: ``ptpc_quantize``
  then ``ptpc_linear_quantized``. ``w_fp8``/``w_scale`` come from
  ``atomk31.quant.ptpc.quantize_weight_ptpc`` (one scale per output channel).

Tests: torch implementations against float64 formulas (the quantizer bit-exact: its scale
and ``x / scale`` are correctly rounded fp32 quotients on every device). The Triton quantizer
equals the torch one bit for bit. The Triton GEMM is within 1e-6 relative of the torch op under
the interpreter (fp32 products); on GPUs the FP8 tensor cores sum with reduced precision
(Hopper's wgmma keeps ~14 bits of its running sum, promoted into fp32 every 128 K elements), so
the GPU tests bound its error relative to torch._scaled_mm's on the same inputs (at most
1.25x that, plus 1e-5), or by a fixed 3e-4 where _scaled_mm is missing
(tests/triton_kernels/test_ptpc_fp8.py).
"""

import torch

from atomk31.ops.registry import register
from atomk31.ops.requirements import needs_gpu, needs_hopper
from atomk31.quant.fp8 import PER_ROW_MIN_AMAX, divide_exactly


def linear_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [..., K]; weight: [N, K] -> [..., N] in x.dtype (fp32 accumulation)."""
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: expected x [..., K] and weight [N, K] with the same K, got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    return x @ weight.T


def ptpc_quantize_torch(
    x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8: x [..., K] -> (x_q [..., K] fp8_dtype, x_scale fp32 [...])."""
    _check_fp8_dtype("ptpc_quantize", fp8_dtype)
    if x.dim() == 0:
        raise ValueError("ptpc_quantize: x must have at least one dim [..., K]")
    fmax = torch.finfo(fp8_dtype).max
    xf = x.float()
    amax = xf.abs().amax(dim=-1) if x.shape[-1] else torch.zeros(x.shape[:-1], device=x.device)
    # divide_exactly: CUDA's division by a host scalar is off by an ulp for some amax
    scale = divide_exactly(amax.clamp_min(PER_ROW_MIN_AMAX), fmax)
    return (xf / scale[..., None]).clamp(-fmax, fmax).to(fp8_dtype), scale


def ptpc_linear_quantized_torch(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """x_q [..., K] fp8, x_scale [...], w_fp8 [N, K] fp8, w_scale [N] -> [..., N] out_dtype."""
    if w_fp8.dim() != 2 or x_q.dim() == 0 or x_q.shape[-1] != w_fp8.shape[1] or \
            w_scale.shape != (w_fp8.shape[0],) or x_scale.shape != x_q.shape[:-1]:
        raise ValueError(f"ptpc_linear: expected x_q [..., K], x_scale [...], w_fp8 [N, K] and "
                         f"w_scale [N], got {tuple(x_q.shape)}, {tuple(x_scale.shape)}, "
                         f"{tuple(w_fp8.shape)} and {tuple(w_scale.shape)}")
    y = (x_q.float() @ w_fp8.float().T) * x_scale.float()[..., None] * w_scale.float()
    return y.to(out_dtype)


def ptpc_linear_torch(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., N] in x.dtype through per-token FP8 activations."""
    x_q, x_scale = ptpc_quantize_torch(x, w_fp8.dtype)
    return ptpc_linear_quantized_torch(x_q, x_scale, w_fp8, w_scale, x.dtype)


def _check_fp8_dtype(op: str, fp8_dtype: torch.dtype) -> None:
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"{op}: fp8_dtype must be torch.float8_e4m3fn or "
                         f"torch.float8_e4m3fnuz (§6.1), got {fp8_dtype}")


_PTPC = "atomk31.triton_kernels.ptpc_fp8"
# The sm_90 tile rules of the hopper target, per step (ptpc_fp8_config.HopperGemmRule).
_HOPPER_RULES = {"eager": "atomk31.triton_kernels.ptpc_fp8_config:HOPPER_EAGER_RULE",
                 "graph": "atomk31.triton_kernels.ptpc_fp8_config:HOPPER_GRAPH_RULE"}

register("linear", "torch", linear_torch)
register("ptpc_quantize", "torch", ptpc_quantize_torch)
register("ptpc_quantize", "triton", f"{_PTPC}:ptpc_quantize_triton", why_not=needs_gpu)
register("ptpc_linear_quantized", "torch", ptpc_linear_quantized_torch)
register("ptpc_linear_quantized", "triton", f"{_PTPC}:ptpc_linear_quantized_triton",
         why_not=needs_gpu)
register("ptpc_linear", "torch", ptpc_linear_torch)
register("ptpc_linear", "triton", f"{_PTPC}:ptpc_linear_triton", why_not=needs_gpu)
register("ptpc_linear", "hopper", f"{_PTPC}:ptpc_linear_triton", why_not=needs_hopper,
         step_config=_HOPPER_RULES)
