"""PTPC-FP8 linear in Triton: per-token dynamic activation quantization and the scaled GEMM
(MODEL_SPEC §6.5), the ``triton`` target's implementation of ``ptpc_linear``,
``ptpc_linear_quantized`` and ``ptpc_quantize`` (contracts: atomk31/ops/linear.py, which
checks the arguments before any call).

* ``ptpc_quantize_triton(x [M, K]) -> (x_q fp8 [M, K], s_x fp32 [M])``:
  ``s_x = max(amax |x[m]|, 1e-12) / fmax``, ``x_q = fp8(clamp(x / s_x, -fmax, fmax))``.
* ``ptpc_linear_quantized_triton(x_q, s_x, w_q [N, K] fp8, s_w fp32 [N])
  -> y [M, N] = (x_q @ w_q^T) * s_x[:, None] * s_w[None, :]``, fp32 accumulation, one
  rounding to the output dtype.

The GEMM is a pointer kernel that reads the weight in its ``[N, K]`` layout (a K-major B
operand, what the FP8 tensor cores want). Small M is bound by reading the weight once, so the
tile table splits K across programs until the grid covers the GPU (SPLIT_K > 1 adds scaled
fp32 partials atomically and casts once at the end); large M uses big tiles with a grouped
program order for L2 reuse (ptpc_fp8_config.py). On Hopper the FP8 wgmma keeps only ~14 bits
of its running sum, so the kernel promotes the partial sum into an fp32 accumulator every
``promote_every`` K elements (as DeepGEMM and cuBLASLt do). Under the interpreter the FP8
operands are widened to fp32 before the product.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.ptpc_fp8_config import (  # noqa: F401 (the config API, re-exported)
    INTERPRETER_CONFIG, GemmConfig, GemmTarget, current_target, pick_config_for_target,
    split_k_to_fill,
)
from atomk31.triton_kernels.runtime import runs_on_interpreter

# §6.5: the dynamic per-token activation scale floors amax at 1e-12.
MIN_AMAX = tl.constexpr(1e-12)


@triton.jit
def round_to_e4m3_grid(x, MIN_EXPONENT: tl.constexpr):
    """Round-to-nearest-even of fp32 x onto the E4M3 grid (3 mantissa bits; subnormal below
    2^MIN_EXPONENT: -6 for e4m3fn, -7 for e4m3fnuz), still in fp32. The interpreter's
    fp32 -> fp8 cast drops the carry when rounding crosses a power of two (124.3 -> 64);
    casting a value already on the grid is exact, so interpreter runs round here first."""
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, MIN_EXPONENT)
    ulp = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    steps = tl.abs(x) / ulp
    steps = (steps + 8388608.0) - 8388608.0           # RNE to an integer (steps < 2^23)
    return tl.where(x < 0, -steps * ulp, steps * ulp)


@triton.jit
def ptpc_quantize_kernel(
    x_ptr, q_ptr, scale_ptr,          # x [M, K]; q [M, K] fp8; scale [M]
    stride_x, K, fp8_max,
    BLOCK_K: tl.constexpr, MIN_EXPONENT: tl.constexpr, ROUND_FIRST: tl.constexpr,
):
    i_m = tl.program_id(0).to(tl.int64)
    p_x = x_ptr + i_m * stride_x
    b_amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(p_x + o_k, mask=o_k < K, other=0.0).to(tl.float32)
        b_amax = tl.maximum(b_amax, tl.abs(b_x))
    # IEEE divisions (div_rn): compiled `/` is approximate on NVIDIA and would move values
    # across FP8 rounding boundaries, away from the torch op's bytes
    b_scale = tl.math.div_rn(tl.maximum(tl.max(b_amax, axis=0), MIN_AMAX), fp8_max)
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(p_x + o_k, mask=o_k < K, other=0.0).to(tl.float32)
        b_q = tl.clamp(tl.math.div_rn(b_x, b_scale), -fp8_max, fp8_max)
        if ROUND_FIRST:
            b_q = round_to_e4m3_grid(b_q, MIN_EXPONENT)
        tl.store(q_ptr + i_m * K + o_k, b_q.to(q_ptr.dtype.element_ty), mask=o_k < K)
    tl.store(scale_ptr + i_m, b_scale)


@triton.jit
def grouped_tile(i_tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``i_tile`` in grouped order: GROUP_M row tiles share
    each column tile while it sits in L2."""
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = i_tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (i_tile % (GROUP_M * num_n)) % group_size
    i_n = (i_tile % (GROUP_M * num_n)) // group_size
    return i_m, i_n


@triton.jit
def store_scaled(b_acc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n,
                 SPLIT_K: tl.constexpr):
    """c[o_m, o_n] = b_acc * a_scale * b_scale: one rounding to c's dtype, or fp32 atomics
    when K is split."""
    m_m, m_n = o_m < M, o_n < N
    b_a_scale = tl.load(a_scale_ptr + o_m, mask=m_m, other=0.0)
    b_b_scale = tl.load(b_scale_ptr + o_n, mask=m_n, other=0.0)
    b_c = b_acc * b_a_scale[:, None] * b_b_scale[None, :]
    p_c = c_ptr + o_m.to(tl.int64)[:, None] * stride_c + o_n[None, :]
    m_c = m_m[:, None] & m_n[None, :]
    if SPLIT_K == 1:
        tl.store(p_c, b_c.to(c_ptr.dtype.element_ty), mask=m_c)
    else:
        tl.atomic_add(p_c, b_c, mask=m_c, sem="relaxed")


# M is not specialized: one compile for every token count (Triton would compile M == 1 apart,
# as a constant, and that specialization ran slower on the H200: benchmarks/NOTES.md).
@triton.jit(do_not_specialize=["M"])
def ptpc_gemm_kernel(
    # pointers: a [M, K] fp8, b [N, K] fp8, scales [M] / [N] fp32, c [M, N]
    a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, c_ptr,
    # sizes and strides
    M, N, K, stride_a, stride_b, stride_c,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, DOT_FP32: tl.constexpr,
    PROMOTE_EVERY: tl.constexpr = None,
):
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    i_split = tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = i_split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < k_end
        b_a = tl.load(a_ptr + o_m.to(tl.int64)[:, None] * stride_a + o_k[None, :],
                      mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_b = tl.load(b_ptr + o_n.to(tl.int64)[:, None] * stride_b + o_k[None, :],
                      mask=m_n[:, None] & m_k[None, :], other=0.0)
        if DOT_FP32:
            b_acc = tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), b_acc,
                           input_precision="ieee")
        else:
            # Hopper's FP8 wgmma keeps ~14 bits of its running sum: PROMOTE_EVERY K elements
            # Triton adds the wgmma partial into the fp32 accumulator (None: never). Other
            # targets ignore it.
            b_acc = tl.dot(b_a, tl.trans(b_b), b_acc, max_num_imprecise_acc=PROMOTE_EVERY)
    store_scaled(b_acc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n, SPLIT_K)


def min_normal_exponent(fp8_dtype: torch.dtype) -> int:
    """Exponent of the smallest normal value: -6 for e4m3fn, -7 for e4m3fnuz (§6.1)."""
    if fp8_dtype == torch.float8_e4m3fn:
        return -6
    if fp8_dtype == torch.float8_e4m3fnuz:
        return -7
    raise ValueError(f"expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}")


def pick_config(m: int, n: int, k: int) -> GemmConfig:
    """The launcher's tiles: ``pick_config_for_target`` for the current target, one small
    config under the interpreter."""
    if runs_on_interpreter(ptpc_gemm_kernel):
        return INTERPRETER_CONFIG
    return pick_config_for_target(m, n, k, current_target())


def ptpc_quantize_triton(
    x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., K] (last dim dense) -> (x_q [..., K] fp8_dtype, s_x fp32 [...])."""
    if x.dim() == 0:
        raise ValueError("ptpc_quantize: x must have at least one dim [..., K]")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    q = torch.empty(x2.shape, dtype=fp8_dtype, device=x.device)
    scale = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    if x2.shape[0] and k:
        ptpc_quantize_kernel[(x2.shape[0],)](
            x2, q, scale, x2.stride(0), k, torch.finfo(fp8_dtype).max,
            BLOCK_K=min(4096, triton.next_power_of_2(k)),
            MIN_EXPONENT=min_normal_exponent(fp8_dtype),
            ROUND_FIRST=runs_on_interpreter(ptpc_quantize_kernel),
            num_warps=4,
        )
    return q.view(x.shape), scale.view(x.shape[:-1])


def ptpc_linear_quantized_triton(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """x_q: [..., K] fp8; x_scale: fp32 [...]; w_q: [N, K] fp8; w_scale: fp32 [N]
    -> [..., N] in out_dtype. ``config``: the tiles (None: ``pick_config``)."""
    n, k = w_q.shape
    a = x_q.reshape(-1, k)
    m = a.shape[0]
    if a.stride(-1) != 1:
        a = a.contiguous()
    if w_q.stride(-1) != 1:
        w_q = w_q.contiguous()
    config = config or pick_config(m, n, k)
    split = config.split_k > 1
    c = torch.zeros((m, n), dtype=torch.float32, device=a.device) if split else \
        torch.empty((m, n), dtype=out_dtype, device=a.device)
    on_interpreter = runs_on_interpreter(ptpc_gemm_kernel)
    if m and n:
        promote_every = None if on_interpreter or config.promote_every is None else \
            min(config.promote_every, config.block_k)
        grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), config.split_k)
        ptpc_gemm_kernel[grid](
            a, w_q, x_scale.reshape(-1).float().contiguous(), w_scale.float().contiguous(), c,
            m, n, k, a.stride(0), w_q.stride(0), c.stride(0),
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            GROUP_M=config.group_m, SPLIT_K=config.split_k, DOT_FP32=on_interpreter,
            PROMOTE_EVERY=promote_every, num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    if split:
        c = c.to(out_dtype)
    return c.view(*x_q.shape[:-1], n)


def ptpc_linear_triton(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, config: GemmConfig | None = None,
) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x.dtype: per-token quantization, then the scaled GEMM
    (``config`` as in ``ptpc_linear_quantized_triton``)."""
    x_q, x_scale = ptpc_quantize_triton(x, w_q.dtype)
    return ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, x.dtype, config)
