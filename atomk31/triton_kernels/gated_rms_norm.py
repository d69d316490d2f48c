"""Gated RMSNorm of the KDA output in Triton (MODEL_SPEC §4.4 ``o_norm``).

``gated_rms_norm``: contract of ``atomk31/ops/norms.py``:
``y = rms_norm(x, weight, eps) * sigmoid(gate)`` per row of V (one weight shared by all
heads), fp32 math, one rounding to x's dtype. One program normalizes BLOCK_R rows of V.
"""

import torch
import triton
import triton.language as tl


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


def _check(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> None:
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate must have the shape of x {tuple(x.shape)}, "
                         f"got {tuple(gate.shape)}")
    if x.dim() == 0 or weight.shape != (x.shape[-1],):
        raise ValueError(f"gated_rms_norm: weight must have shape [{x.shape[-1] if x.dim() else 'n'}]"
                         f" (the last dim of x {tuple(x.shape)}), got {tuple(weight.shape)}")
