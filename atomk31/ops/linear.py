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

Shape classes of ``ptpc_linear`` and ``ptpc_linear_quantized`` (M = rows of x, by the call's
own shapes; the measurements behind them: benchmarks/NOTES.md, "PTPC: shape classes"):

* ``few_rows`` (M < 128: decode): the Triton pointer kernel everywhere; its decode tiles split
  K until the weight streams through every SM, and its launch costs the least host time.
* ``narrow`` (M >= 128, N < 1024: kv_a's 576 columns): the pointer kernel, whose split K fills
  the GPU where 128-column tiles cannot.
* ``small_gemm`` (M >= 128, N >= 1024, under 5e10 FLOP): the hopper target's Gluon kernel in
  graph steps, where it beats the pointer kernel; eager steps keep the pointer kernel, because
  a Gluon launch costs more host time than such a GEMM takes on the GPU.
* ``large_gemm`` (M >= 128, N >= 1024, 5e10 FLOP or more: prefill): the Gluon kernel in both
  steps, at torch._scaled_mm's speed where the pointer kernel reaches ~0.7 of it.

Tests: torch implementations against float64 formulas (the quantizer bit-exact: its scale
and ``x / scale`` are correctly rounded fp32 quotients on every device). The Triton quantizer
equals the torch one bit for bit. The Triton GEMM is within 1e-6 relative of the torch op under
the interpreter (fp32 products); on GPUs the FP8 tensor cores sum with reduced precision
(Hopper's wgmma keeps ~14 bits of its running sum, promoted into fp32 every 128 K elements), so
the GPU tests bound each kernel's error relative to torch._scaled_mm's on the same inputs (at
most 1.25x that, plus 1e-5), or by a fixed 3e-4 where _scaled_mm is missing
(tests/triton_kernels/test_ptpc_fp8.py, tests/gluon_kernels/hopper/test_ptpc_fp8.py).
"""

import torch

from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import all_of, needs_gpu, needs_hopper
from atomk31.ops.target import KernelContext
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
    check_ptpc_linear_quantized(x_q, x_scale, w_fp8, w_scale, out_dtype)
    y = (x_q.float() @ w_fp8.float().T) * x_scale.float()[..., None] * w_scale.float()
    return y.to(out_dtype)


def ptpc_linear_torch(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., N] in x.dtype through per-token FP8 activations."""
    check_ptpc_linear(x, w_fp8, w_scale)
    x_q, x_scale = ptpc_quantize_torch(x, w_fp8.dtype)
    return ptpc_linear_quantized_torch(x_q, x_scale, w_fp8, w_scale, x.dtype)


def _check_fp8_dtype(op: str, fp8_dtype: torch.dtype) -> None:
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"{op}: fp8_dtype must be torch.float8_e4m3fn or "
                         f"torch.float8_e4m3fnuz (§6.1), got {fp8_dtype}")


def check_ptpc_linear_quantized(x_q: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor,
                                w_scale: torch.Tensor,
                                out_dtype: torch.dtype = torch.bfloat16) -> None:
    """The host-side argument check of `ptpc_linear_quantized` (shapes and dtypes only)."""
    if w_fp8.dim() != 2 or x_q.dim() == 0 or x_q.shape[-1] != w_fp8.shape[1] or \
            w_scale.shape != (w_fp8.shape[0],) or x_scale.shape != x_q.shape[:-1]:
        raise ValueError(f"ptpc_linear: expected x_q [..., K], x_scale [...], w_fp8 [N, K] and "
                         f"w_scale [N], got {tuple(x_q.shape)}, {tuple(x_scale.shape)}, "
                         f"{tuple(w_fp8.shape)} and {tuple(w_scale.shape)}")
    _check_fp8_dtype("ptpc_linear", w_fp8.dtype)
    if x_q.dtype != w_fp8.dtype:
        raise ValueError(f"ptpc_linear: x_q and w_fp8 must share their FP8 dtype, got "
                         f"{x_q.dtype} and {w_fp8.dtype}")


def check_ptpc_linear(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> None:
    """The host-side argument check of `ptpc_linear` (shapes and dtypes only)."""
    if w_fp8.dim() != 2 or x.dim() == 0 or x.shape[-1] != w_fp8.shape[1] or \
            w_scale.shape != (w_fp8.shape[0],):
        raise ValueError(f"ptpc_linear: expected x [..., K], w_fp8 [N, K] and w_scale [N], got "
                         f"{tuple(x.shape)}, {tuple(w_fp8.shape)} and {tuple(w_scale.shape)}")
    _check_fp8_dtype("ptpc_linear", w_fp8.dtype)


# The shape classes (module docstring): rows from which a call has "many rows", output
# features below which such a call is "narrow", and the work from which it is a large GEMM.
MANY_ROWS = 128
NARROW_OUT_FEATURES = 1024
LARGE_GEMM_FLOP = 5e10
PTPC_SHAPES = {
    "few_rows": f"fewer than {MANY_ROWS} rows (decode)",
    "narrow": f"{MANY_ROWS} rows or more, fewer than {NARROW_OUT_FEATURES} output features",
    "small_gemm": f"{MANY_ROWS} rows or more, {NARROW_OUT_FEATURES}+ output features, under "
                  f"{LARGE_GEMM_FLOP:.0e} FLOP",
    "large_gemm": f"{MANY_ROWS} rows or more, {NARROW_OUT_FEATURES}+ output features, "
                  f"{LARGE_GEMM_FLOP:.0e} FLOP or more",
}


def ptpc_shape(rows: int, out_features: int, in_features: int) -> str:
    """The shape class of an [rows, in_features] x [out_features, in_features] GEMM."""
    if rows < MANY_ROWS:
        return "few_rows"
    if out_features < NARROW_OUT_FEATURES:
        return "narrow"
    return "large_gemm" if 2 * rows * out_features * in_features >= LARGE_GEMM_FLOP \
        else "small_gemm"


def ptpc_linear_shape(x: torch.Tensor, w_fp8: torch.Tensor, *args, **kwargs) -> str:
    return ptpc_shape(x.numel() // max(x.shape[-1], 1), *w_fp8.shape)


def ptpc_linear_quantized_shape(x_q: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor,
                                *args, **kwargs) -> str:
    return ptpc_shape(x_q.numel() // max(x_q.shape[-1], 1), *w_fp8.shape)


def needs_e4m3fn(context: KernelContext) -> str | None:
    """The Gluon kernel's wgmma reads OCP e4m3fn (the weights' FP8 variant on the target)."""
    variant = context.target.fp8_variant
    return None if variant == "e4m3fn" else f"takes e4m3fn operands, {context.target.name} " \
                                            f"runs {variant}"


_PTPC = "atomk31.triton_kernels.ptpc_fp8"
_GLUON = "gluon_kernels.hopper.ptpc_fp8_launch"
_GLUON_SHAPES = ("small_gemm", "large_gemm")
_GLUON_NOT_IN_EAGER = {"small_gemm": "a Gluon launch costs ~0.1-0.2 ms more host time than the "
                                     "pointer kernel's, more than such a GEMM's GPU time"}

register("linear", "torch", linear_torch)
register("ptpc_quantize", "torch", ptpc_quantize_torch)
register("ptpc_quantize", "triton", f"{_PTPC}:ptpc_quantize_triton", why_not=needs_gpu)
define_op("ptpc_linear", shapes=PTPC_SHAPES, classify=ptpc_linear_shape,
          check=check_ptpc_linear)
register("ptpc_linear", "torch", ptpc_linear_torch)
register("ptpc_linear", "triton", f"{_PTPC}:ptpc_linear_triton", why_not=needs_gpu)
register("ptpc_linear", "hopper", f"{_GLUON}:ptpc_linear_hopper",
         why_not=all_of(needs_hopper, needs_e4m3fn), shapes=_GLUON_SHAPES,
         not_in_eager=_GLUON_NOT_IN_EAGER)
define_op("ptpc_linear_quantized", shapes=PTPC_SHAPES, classify=ptpc_linear_quantized_shape,
          check=check_ptpc_linear_quantized)
register("ptpc_linear_quantized", "torch", ptpc_linear_quantized_torch)
register("ptpc_linear_quantized", "triton", f"{_PTPC}:ptpc_linear_quantized_triton",
         why_not=needs_gpu)
register("ptpc_linear_quantized", "hopper", f"{_GLUON}:ptpc_linear_quantized_hopper",
         why_not=all_of(needs_hopper, needs_e4m3fn), shapes=_GLUON_SHAPES,
         not_in_eager=_GLUON_NOT_IN_EAGER)
