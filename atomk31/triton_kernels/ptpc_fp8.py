"""PTPC-FP8 linear in Triton: per-token dynamic activation quantization and the scaled GEMM
(MODEL_SPEC §6.5).

* ``ptpc_quantize_triton(x [M, K]) -> (x_q fp8 [M, K], s_x fp32 [M])``:
  ``s_x = max(amax |x[m]|, 1e-12) / fmax``, ``x_q = fp8(clamp(x / s_x, -fmax, fmax))``.
* ``ptpc_linear_quantized_triton(x_q, s_x, w_q [N, K] fp8, s_w fp32 [N])
  -> y [M, N] = (x_q @ w_q^T) * s_x[:, None] * s_w[None, :]``, fp32 accumulation, one
  rounding to the output dtype.

The GEMM reads the weight in its ``[N, K]`` layout (a K-major B operand, what the FP8 tensor
cores want). Small M is bound by reading the weight once, so the launcher splits K across
programs until the grid covers the GPU (SPLIT_K > 1 adds scaled fp32 partials atomically and
casts once at the end); large M uses big tiles with a grouped program order for L2 reuse.
On Hopper the FP8 wgmma keeps only ~14 bits of its running sum, so the kernel promotes the
partial sum into an fp32 accumulator every ``promote_every`` K elements (as DeepGEMM does).
Under the interpreter the FP8 operands are widened to fp32 before the product.

Configs with ``tma=True`` run the TMA kernel instead (ptpc_fp8_tma.py, for Hopper: paired K
tiles or warp specialization, to overlap the promotion with the tensor cores); the tile choice
lives in ptpc_fp8_config.py.

Configs with ``kernel="gluon_hopper"`` run the Gluon kernel of gluon_kernels/ptpc_fp8_hopper.py
(sm_90 only: a TMA producer warp and one consumer warpgroup per 64 rows that promotes each
wgmma partial while the next one runs, the schedule Triton 3.6 cannot express). Gluon ships
inside the triton wheel, so it stays this (the ``triton``) backend's implementation (a decision:
no new backend name for one kernel); it does not run under the interpreter, and AMD keeps the
Triton kernels (wgmma, TMA and setmaxnreg are Hopper instructions).
"""

import dataclasses

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.ptpc_fp8_config import (  # noqa: F401 (the config API, re-exported)
    INTERPRETER_CONFIG, GemmConfig, GemmTarget, HopperGemmRule, current_target,
    pick_config_for_target, split_k_to_fill,
)
from atomk31.triton_kernels.ptpc_fp8_tma import can_use_tma, launch_ptpc_gemm_tma, store_scaled
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


# M is not specialized: Triton would compile M == 1 apart, as a constant; on the H200 that
# specialization ran 2-36% slower at M == 1 (round 1 of benchmarks/kernels/bench_ptpc_fp8.py).
@triton.jit(do_not_specialize=["M"])
def ptpc_gemm_kernel(
    # pointers: a [M, K] fp8, b [N, K] fp8, scales [M] / [N] fp32, c [M, N]
    a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, c_ptr,
    # sizes and strides
    M, N, K, stride_a, stride_b, stride_c,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, DOT_FP32: tl.constexpr,
    DOT_BF16: tl.constexpr = False, PROMOTE_EVERY: tl.constexpr = None,
    PROMOTE_PER_TILE: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False,
):
    i_tile, i_split = tl.program_id(0), tl.program_id(1)
    # Grouped order: GROUP_M row tiles share each column tile while it sits in L2.
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = i_tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (i_tile % (GROUP_M * num_n)) % group_size
    i_n = (i_tile % (GROUP_M * num_n)) // group_size
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = i_split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < k_end
        b_a = tl.load(a_ptr + o_m.to(tl.int64)[:, None] * stride_a + o_k[None, :],
                      mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_b = tl.load(b_ptr + o_n.to(tl.int64)[:, None] * stride_b + o_k[None, :],
                      mask=m_n[:, None] & m_k[None, :], other=0.0)
        if PROMOTE_PER_TILE:
            # promotion every BLOCK_K written as an fp32 add of each tile's own product (a
            # fresh wgmma sum per tile): another schedule than max_num_imprecise_acc's lowering
            if DOT_FP32:
                b_acc += tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)),
                                input_precision="ieee")
            else:
                b_acc += tl.dot(b_a, tl.trans(b_b))
        elif DOT_FP32:
            b_acc = tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), b_acc,
                           input_precision="ieee")
        elif DOT_BF16:
            # FP8 values are exact in bf16, and bf16 tensor-core products accumulate in fp32
            b_acc = tl.dot(b_a.to(tl.bfloat16), tl.trans(b_b.to(tl.bfloat16)), b_acc)
        else:
            # Hopper's FP8 wgmma keeps ~14 bits of its running sum: PROMOTE_EVERY K elements
            # Triton adds the wgmma partial into the fp32 accumulator (None: never, the
            # default on sm_90). Other targets ignore it.
            b_acc = tl.dot(b_a, tl.trans(b_b), b_acc, max_num_imprecise_acc=PROMOTE_EVERY)
    store_scaled(b_acc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n, SPLIT_K)


def min_normal_exponent(fp8_dtype: torch.dtype) -> int:
    """Exponent of the smallest normal value: -6 for e4m3fn, -7 for e4m3fnuz (§6.1)."""
    if fp8_dtype == torch.float8_e4m3fn:
        return -6
    if fp8_dtype == torch.float8_e4m3fnuz:
        return -7
    raise ValueError(f"expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}")


KERNELS = ("triton", "gluon_hopper")
GLUON_HOPPER_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gluon_hopper_fits(a: torch.Tensor, w_q: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether the Gluon Hopper kernel takes these operands: e4m3fn, TMA-aligned rows of a, w_q
    and of a fresh [M, N] output (N * its element size a multiple of 16 bytes)."""
    n = w_q.shape[0]
    return a.dtype == w_q.dtype == torch.float8_e4m3fn and can_use_tma(a, w_q) and \
        out_dtype in GLUON_HOPPER_OUT_DTYPES and \
        (n * torch.empty((), dtype=out_dtype).element_size()) % 16 == 0


def gluon_stages_that_fit(config: GemmConfig, out_dtype: torch.dtype) -> GemmConfig:
    """``config`` with its ring cut to the stages Hopper's shared memory holds beside the
    output tile of ``out_dtype`` (the 6-stage 128 x 128 config holds a bf16 tile, 5 stages a
    float32 one)."""
    from gluon_kernels.ptpc_fp8_hopper import MAX_SHARED_BYTES, shared_bytes  # imports Gluon

    size = torch.empty((), dtype=out_dtype).element_size()
    stages = config.num_stages
    while stages > 2 and shared_bytes(config.block_m, config.block_n, stages,
                                      size) > MAX_SHARED_BYTES:
        stages -= 1
    return config if stages == config.num_stages else \
        dataclasses.replace(config, num_stages=stages)


def launch_ptpc_gemm_gluon_hopper(a: torch.Tensor, w_q: torch.Tensor, a_scale: torch.Tensor,
                                  w_scale: torch.Tensor, c: torch.Tensor, config: GemmConfig,
                                  on_interpreter: bool) -> None:
    """c <- the scaled GEMM through gluon_kernels/ptpc_fp8_hopper.py (config.kernel
    "gluon_hopper"): block_m, block_n (its TILES), num_stages, group_m, persistent and
    overlap_epilogue apply."""
    if on_interpreter:
        raise ValueError("ptpc_linear: the Gluon Hopper kernel does not run under Triton's "
                         "interpreter (it needs an sm_90 GPU), got kernel='gluon_hopper'")
    if config.split_k != 1 or config.block_k != 128:
        raise ValueError(f"ptpc_linear: the Gluon Hopper kernel takes 128 K per tile and no "
                         f"split K, got block_k {config.block_k} with split_k {config.split_k}")
    from gluon_kernels.ptpc_fp8_hopper import ptpc_gemm_hopper     # imports Gluon: on use

    ptpc_gemm_hopper(a, w_q, a_scale, w_scale, c, block_m=config.block_m,
                     block_n=config.block_n, num_stages=config.num_stages,
                     group_m=config.group_m, persistent=config.persistent,
                     overlap_epilogue=config.overlap_epilogue)


# Programs of a persistent TMA config under the interpreter (on a GPU: one per SM): a few, so
# that each walks several tiles.
INTERPRETER_PERSISTENT_PROGRAMS = 3


def pick_config(m: int, n: int, k: int, hopper: HopperGemmRule | None = None) -> GemmConfig:
    """The launcher's tile choice: ``pick_config_for_target`` for the current target (one
    small config under the interpreter). Portable (the pointer kernel) unless ``hopper`` asks
    for the sm_90 rules (the TMA and Gluon kernels, for eager or graph-replayed launches)."""
    if runs_on_interpreter(ptpc_gemm_kernel):
        return INTERPRETER_CONFIG
    target = current_target()
    if hopper is None:
        return pick_config_for_target(m, n, k, dataclasses.replace(target, has_tma_ws=False))
    return pick_config_for_target(m, n, k, target, hopper.replayed)


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
    config: GemmConfig | HopperGemmRule | None = None,
) -> torch.Tensor:
    """x_q: [..., K] fp8; x_scale: fp32 [...]; w_q: [N, K] fp8; w_scale: fp32 [N]
    -> [..., N] in out_dtype. ``config``: a GemmConfig overrides the tile choice (tests,
    benchmarks); a HopperGemmRule picks tiles by the sm_90 rules (the ``hopper`` target's
    implementation); None: the portable pointer kernel's tiles."""
    if w_q.dim() != 2 or x_q.shape[-1] != w_q.shape[1] or w_scale.shape != (w_q.shape[0],) \
            or x_scale.shape != x_q.shape[:-1]:
        raise ValueError(f"ptpc_linear: expected x_q [..., K], x_scale [...], w_q [N, K] and "
                         f"w_scale [N], got {tuple(x_q.shape)}, {tuple(x_scale.shape)}, "
                         f"{tuple(w_q.shape)} and {tuple(w_scale.shape)}")
    n, k = w_q.shape
    a = x_q.reshape(-1, k)
    m = a.shape[0]
    if a.stride(-1) != 1:
        a = a.contiguous()
    if w_q.stride(-1) != 1:
        w_q = w_q.contiguous()
    if config is None or isinstance(config, HopperGemmRule):
        config = pick_config(m, n, k, config)
        if (config.tma and not can_use_tma(a, w_q)) or (config.kernel == "gluon_hopper" and
                                                        not gluon_hopper_fits(a, w_q, out_dtype)):
            # unaligned rows (or e4m3fnuz for Gluon): the pointer kernel
            config = pick_config_for_target(m, n, k, dataclasses.replace(current_target(),
                                                                         has_tma_ws=False))
        elif config.kernel == "gluon_hopper":
            config = gluon_stages_that_fit(config, out_dtype)
    if config.kernel not in KERNELS:
        raise ValueError(f"ptpc_linear: config.kernel must be one of {KERNELS}, got "
                         f"{config.kernel!r}")
    split = config.split_k > 1
    c = torch.zeros((m, n), dtype=torch.float32, device=a.device) if split else \
        torch.empty((m, n), dtype=out_dtype, device=a.device)
    on_interpreter = runs_on_interpreter(ptpc_gemm_kernel)
    a_scale = x_scale.reshape(-1).float().contiguous()
    w_scale = w_scale.float().contiguous()
    if config.kernel == "gluon_hopper":
        launch_ptpc_gemm_gluon_hopper(a, w_q, a_scale, w_scale, c, config, on_interpreter)
    elif m and n and config.tma:
        # persistent grids: one program per SM (a few under the interpreter, to walk tiles)
        num_programs = current_target().num_sms if config.persistent and not on_interpreter \
            else INTERPRETER_PERSISTENT_PROGRAMS
        launch_ptpc_gemm_tma(a, w_q, a_scale, w_scale, c, config, on_interpreter, num_programs)
    elif m and n:
        promote_every = None if on_interpreter or config.promote_per_tile or \
            config.promote_every is None else min(config.promote_every, config.block_k)
        grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), config.split_k)
        ptpc_gemm_kernel[grid](
            a, w_q, a_scale, w_scale, c, m, n, k, a.stride(0), w_q.stride(0), c.stride(0),
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            GROUP_M=config.group_m, SPLIT_K=config.split_k, DOT_FP32=on_interpreter,
            DOT_BF16=config.dot_bf16 and not on_interpreter, PROMOTE_EVERY=promote_every,
            PROMOTE_PER_TILE=config.promote_per_tile,
            WARP_SPECIALIZE=config.warp_specialize and not on_interpreter,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
    if split:
        c = c.to(out_dtype)
    return c.view(*x_q.shape[:-1], n)


def ptpc_linear_triton(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
    config: GemmConfig | HopperGemmRule | None = None,
) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x.dtype: per-token quantization, then the scaled GEMM
    (``config`` as in ``ptpc_linear_quantized_triton``)."""
    x_q, x_scale = ptpc_quantize_triton(x, w_q.dtype)
    return ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, x.dtype, config)
