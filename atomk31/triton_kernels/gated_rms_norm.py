"""Gated RMSNorm of the KDA output in Triton (MODEL_SPEC §4.4 ``o_norm``), optionally emitting
PTPC-FP8 activations for o_proj (§6.5).

``gated_rms_norm``: contract of ``atomk31/ops/norms.py``:
``y = rms_norm(x, weight, eps) * sigmoid(gate)`` per row of V (one weight shared by all
heads), fp32 math, one rounding to x's dtype.

``gated_rms_norm_fp8``: the same rows for all H heads of a token in one program, rounded to
x's dtype first (so it equals the unfused norm followed by the per-token quantizer exactly),
then quantized with one scale per token: ``s = max(amax, 1e-12) / fmax``,
``q = fp8(clamp(y / s, -fmax, fmax))``. Returns ``(q [T, H*V] fp8, s fp32 [T])`` for
``ptpc_linear_quantized``.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import runs_on_interpreter

from atomk31.triton_kernels.ptpc_fp8 import min_normal_exponent, round_to_e4m3_grid

# §6.5: the dynamic per-token activation scale floors amax at 1e-12.
MIN_AMAX = tl.constexpr(1e-12)


@triton.jit
def _gated_rms_rows(x_ptr, gate_ptr, weight_ptr, rows, m_rows, o_v, m_v, eps,
                    V: tl.constexpr):
    """fp32 [R, BLOCK_V]: rms_norm(x) * weight * sigmoid(gate) for the given rows."""
    m = m_rows[:, None] & m_v[None, :]
    offsets = rows.to(tl.int64)[:, None] * V + o_v[None, :]
    b_x = tl.load(x_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    b_gate = tl.load(gate_ptr + offsets, mask=m, other=0.0).to(tl.float32)
    b_w = tl.load(weight_ptr + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, axis=1) / V + eps)
    return b_x * b_rstd[:, None] * b_w[None, :] * tl.sigmoid(b_gate)


@triton.jit
def gated_rms_norm_kernel(
    x_ptr, gate_ptr, weight_ptr, y_ptr,          # x, gate, y: [R, V]; weight [V]
    num_rows, eps,
    V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_v = tl.arange(0, BLOCK_V)
    m_r, m_v = o_r < num_rows, o_v < V
    b_y = _gated_rms_rows(x_ptr, gate_ptr, weight_ptr, o_r, m_r, o_v, m_v, eps, V)
    tl.store(y_ptr + o_r.to(tl.int64)[:, None] * V + o_v[None, :],
             b_y.to(y_ptr.dtype.element_ty), mask=m_r[:, None] & m_v[None, :])


@triton.jit
def gated_rms_norm_fp8_kernel(
    x_ptr, gate_ptr, weight_ptr, q_ptr, scale_ptr,   # x, gate: [T, H, V]; q [T, H*V]; scale [T]
    eps, fp8_max,
    H: tl.constexpr, V: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_V: tl.constexpr,
    MIN_EXPONENT: tl.constexpr, ROUND_FIRST: tl.constexpr,
):
    i_t = tl.program_id(0)
    o_h, o_v = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_V)
    m_h, m_v = o_h < H, o_v < V
    b_y = _gated_rms_rows(x_ptr, gate_ptr, weight_ptr, i_t * H + o_h, m_h, o_v, m_v, eps, V)
    # Round to the activation dtype first: the same bytes as norm-then-quantize.
    b_y = b_y.to(x_ptr.dtype.element_ty).to(tl.float32)
    b_scale = tl.maximum(tl.max(tl.max(tl.abs(b_y), axis=1), axis=0), MIN_AMAX) / fp8_max
    b_q = tl.clamp(b_y / b_scale, -fp8_max, fp8_max)
    if ROUND_FIRST:
        b_q = round_to_e4m3_grid(b_q, MIN_EXPONENT)
    tl.store(q_ptr + i_t.to(tl.int64) * H * V + o_h[:, None] * V + o_v[None, :],
             b_q.to(q_ptr.dtype.element_ty), mask=m_h[:, None] & m_v[None, :])
    tl.store(scale_ptr + i_t, b_scale)


def gated_rms_norm_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x, gate: [..., V] (same shape); weight: [V] -> [..., V] in x.dtype."""
    _check(x, gate, weight)
    value_dim = x.shape[-1]
    x2, gate2 = x.reshape(-1, value_dim).contiguous(), gate.reshape(-1, value_dim).contiguous()
    y = torch.empty_like(x2)
    num_rows = x2.shape[0]
    if num_rows:
        block_r = 16
        gated_rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
            x2, gate2, weight.contiguous(), y, num_rows, eps,
            V=value_dim, BLOCK_R=block_r, BLOCK_V=triton.next_power_of_2(value_dim),
            num_warps=4,
        )
    return y.view(x.shape)


def gated_rms_norm_fp8_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, gate: [T, H, V]; weight: [V] -> (q [T, H*V] fp8_dtype, scale fp32 [T])."""
    _check(x, gate, weight)
    if x.dim() != 3:
        raise ValueError(f"gated_rms_norm_fp8: x must be [T, H, V], got {tuple(x.shape)}")
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"gated_rms_norm_fp8: fp8_dtype must be float8_e4m3fn or "
                         f"float8_e4m3fnuz, got {fp8_dtype}")
    num_tokens, num_heads, value_dim = x.shape
    q = torch.empty((num_tokens, num_heads * value_dim), dtype=fp8_dtype, device=x.device)
    scale = torch.empty(num_tokens, dtype=torch.float32, device=x.device)
    if num_tokens:
        gated_rms_norm_fp8_kernel[(num_tokens,)](
            x.contiguous(), gate.contiguous(), weight.contiguous(), q, scale, eps,
            torch.finfo(fp8_dtype).max,
            H=num_heads, V=value_dim, BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_V=triton.next_power_of_2(value_dim),
            MIN_EXPONENT=min_normal_exponent(fp8_dtype),
            ROUND_FIRST=runs_on_interpreter(gated_rms_norm_fp8_kernel),
            num_warps=8,
        )
    return q, scale


def _check(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> None:
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate must have the shape of x {tuple(x.shape)}, "
                         f"got {tuple(gate.shape)}")
    if x.dim() == 0 or weight.shape != (x.shape[-1],):
        raise ValueError(f"gated_rms_norm: weight must have shape [{x.shape[-1] if x.dim() else 'n'}]"
                         f" (the last dim of x {tuple(x.shape)}), got {tuple(weight.shape)}")
