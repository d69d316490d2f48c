"""PTPC-FP8 scaled GEMM through tensor descriptors (TMA), warp-specialized on Hopper
(MODEL_SPEC §6.5): ``c [M, N] = (a [M, K] @ b [N, K]^T) * a_scale[:, None] * b_scale[None, :]``.

Why a second kernel: Hopper's FP8 wgmma keeps ~14 bits of its running sum, so the sum is
promoted into an fp32 accumulator every 128 K elements (as cuBLASLt and DeepGEMM do). In the
pointer kernel every warp waits for its wgmma, adds the partial sum (64 FADDs per thread per
128 K) and meets the other warpgroup at a CTA barrier, and the tensor cores idle meanwhile
(~30% at large M on the H200). Here Triton 3.6's sm_90 warp specialization (``num_warps = 4``,
``tl.range(..., warp_specialize=True)``) splits the CTA into a TMA producer warpgroup and two
consumer warpgroups of 64 rows that synchronize only through mbarriers: one consumer's
promotion runs while the other's wgmma owns the tensor cores. The producer runs with 40
registers, the consumers with 232 (setmaxnreg), which leaves room for a 64 x 128 accumulator
and its partial sum (or two 64 x 128 halves with ``SPLIT_N``).

Out-of-bounds tile rows, columns and K steps read as zeros (the descriptors' padding), so M, N
and K need no masks in the loop. A descriptor needs 16-byte aligned rows: K a multiple of 16.
Under the interpreter the FP8 tiles are widened to fp32 before an IEEE product.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from atomk31.triton_kernels.ptpc_fp8_config import GemmConfig


@triton.jit
def scaled_mma(b_acc, b_a, b_b, DOT_FP32: tl.constexpr, PROMOTE_PER_TILE: tl.constexpr,
               PROMOTE_EVERY: tl.constexpr):
    """b_acc + b_a @ b_b^T for one K tile, with the wgmma partial promoted into fp32."""
    if DOT_FP32:
        b_acc = tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), b_acc,
                       input_precision="ieee")
    elif PROMOTE_PER_TILE:
        # a fresh wgmma sum per K tile, added to the fp32 accumulator by the consumer warps
        b_acc += tl.dot(b_a, tl.trans(b_b))
    else:
        # Triton's own lowering: the partial sum is added every PROMOTE_EVERY K elements
        b_acc = tl.dot(b_a, tl.trans(b_b), b_acc, max_num_imprecise_acc=PROMOTE_EVERY)
    return b_acc


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


@triton.jit
def gemm_tile(
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c, i_tile, i_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_N: tl.constexpr,
    DOT_FP32: tl.constexpr, PROMOTE_PER_TILE: tl.constexpr, PROMOTE_EVERY: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """One output tile (one K split of it): the K loop, then the scaled store."""
    # Grouped order: GROUP_M row tiles share each column tile while it sits in L2.
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = i_tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (i_tile % (GROUP_M * num_n)) % group_size
    i_n = (i_tile % (GROUP_M * num_n)) // group_size
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = i_split * k_tiles_per_split
    k_end = tl.minimum(k_begin + k_tiles_per_split, k_tiles)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if SPLIT_N:
        HALF_N: tl.constexpr = BLOCK_N // 2
        b_acc0 = tl.zeros([BLOCK_M, HALF_N], dtype=tl.float32)
        b_acc1 = tl.zeros([BLOCK_M, HALF_N], dtype=tl.float32)
        for i_k in tl.range(k_begin, k_end, warp_specialize=WARP_SPECIALIZE):
            b_a = a_desc.load([i_m * BLOCK_M, i_k * BLOCK_K])
            b_acc0 = scaled_mma(b_acc0, b_a, b_desc.load([i_n * BLOCK_N, i_k * BLOCK_K]),
                                DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY)
            b_acc1 = scaled_mma(b_acc1, b_a,
                                b_desc.load([i_n * BLOCK_N + HALF_N, i_k * BLOCK_K]),
                                DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY)
        # two stores: joining the halves into one tile fails Triton 3.6's data partitioning
        o_n = i_n * BLOCK_N + tl.arange(0, HALF_N)
        store_scaled(b_acc0, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n,
                     SPLIT_K)
        store_scaled(b_acc1, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m,
                     o_n + HALF_N, SPLIT_K)
    else:
        b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for i_k in tl.range(k_begin, k_end, warp_specialize=WARP_SPECIALIZE):
            b_acc = scaled_mma(b_acc, a_desc.load([i_m * BLOCK_M, i_k * BLOCK_K]),
                               b_desc.load([i_n * BLOCK_N, i_k * BLOCK_K]),
                               DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        store_scaled(b_acc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n,
                     SPLIT_K)


# M is not specialized (see ptpc_gemm_kernel): one compile for every token count.
@triton.jit(do_not_specialize=["M"])
def ptpc_gemm_tma_kernel(
    # descriptors: a [M, K] fp8 in [BLOCK_M, BLOCK_K] boxes, b [N, K] fp8 in
    # [BLOCK_N (/ 2 with SPLIT_N), BLOCK_K] boxes; scales [M] / [N] fp32; c [M, N]
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr,
    M, N, K, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_N: tl.constexpr,
    DOT_FP32: tl.constexpr, PROMOTE_PER_TILE: tl.constexpr, PROMOTE_EVERY: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, PERSISTENT: tl.constexpr = False,
):
    if PERSISTENT:
        # one program per SM walks the tiles: with warp specialization the producer loads
        # the next tile while the consumers store this one (short K loops: kv_b's K = 512)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for i_tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            gemm_tile(a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c,
                      i_tile, tl.program_id(1), BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K,
                      SPLIT_N, DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY, WARP_SPECIALIZE)
    else:
        gemm_tile(a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c,
                  tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                  SPLIT_K, SPLIT_N, DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY, WARP_SPECIALIZE)


def can_use_tma(a: torch.Tensor, w_q: torch.Tensor) -> bool:
    """Descriptors need 16-byte aligned bases and rows (fp8: K a multiple of 16)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 and t.stride(-1) == 1
               for t in (a, w_q))


def launch_ptpc_gemm_tma(
    a: torch.Tensor, w_q: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
    c: torch.Tensor, config: GemmConfig, on_interpreter: bool, num_programs: int,
) -> None:
    """c [M, N] (out dtype, or zeroed fp32 with split K) <- the scaled GEMM of a [M, K] and
    w_q [N, K] (both fp8, rows 16-byte aligned: ``can_use_tma``). ``num_programs``: the grid
    of a persistent config (the SM count)."""
    if not can_use_tma(a, w_q):
        raise ValueError(f"ptpc_linear: the TMA kernel needs 16-byte aligned fp8 rows (K a "
                         f"multiple of 16), got a {tuple(a.shape)} stride {a.stride()} and "
                         f"w_q {tuple(w_q.shape)} stride {w_q.stride()}; use a config with "
                         f"tma=False")
    m, k = a.shape
    n = w_q.shape[0]
    b_rows = config.block_n // 2 if config.split_n else config.block_n
    a_desc = TensorDescriptor.from_tensor(a, [config.block_m, config.block_k])
    b_desc = TensorDescriptor.from_tensor(w_q, [b_rows, config.block_k])
    promote_every = None if config.promote_every is None else \
        min(config.promote_every, config.block_k)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = (min(tiles, num_programs) if config.persistent else tiles, config.split_k)
    ptpc_gemm_tma_kernel[grid](
        a_desc, b_desc, a_scale, w_scale, c, m, n, k, c.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, SPLIT_K=config.split_k, SPLIT_N=config.split_n,
        DOT_FP32=on_interpreter,
        PROMOTE_PER_TILE=config.promote_per_tile,
        PROMOTE_EVERY=promote_every,
        WARP_SPECIALIZE=config.warp_specialize and not on_interpreter,
        PERSISTENT=config.persistent, num_warps=config.num_warps, num_stages=config.num_stages,
    )
