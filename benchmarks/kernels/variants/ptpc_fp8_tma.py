"""A benchmark variant (no default selects it): the PTPC-FP8 scaled GEMM through tensor
descriptors (TMA) in Triton, for Hopper (MODEL_SPEC §6.5):
``c [M, N] = (a [M, K] @ b [N, K]^T) * a_scale[:, None] * b_scale[None, :]``.
bench_ptpc_fp8.py times it beside the package's kernels (its figures: benchmarks/NOTES.md);
the Gluon kernel (gluon_kernels/hopper/ptpc_fp8.py) replaced it on the hopper target.

Why a second Triton kernel: Hopper's FP8 wgmma keeps ~14 bits of its running sum, so the sum
is promoted into an fp32 accumulator every 128 K elements. In the pointer kernel every warp
waits for its wgmma to drain, adds the partial sum and meets the other warpgroup at a CTA
barrier, and the tensor cores idle meanwhile. Two ways out here:
* ``promote_lagged`` (8 warps, no warp specialization): K tiles in pairs, one tile's partial
  added while the next tile's wgmma runs (``lagged_k_loop``): half the drains.
* ``warp_specialize`` (Triton 3.6 on sm_90: ``num_warps = 4``): a TMA producer warpgroup and
  two consumer warpgroups of 64 rows that synchronize only through mbarriers. It needs
  ``device_descriptors``: Triton 3.6 splits the A tile between the consumers but keeps a host
  descriptor's whole box, which overruns the half-size buffer (a hang).

Out-of-bounds tile rows, columns and K steps read as zeros (the descriptors' padding), so M, N
and K need no masks in the loop. A descriptor needs 16-byte aligned rows: K a multiple of 16.
Under the interpreter the FP8 tiles are widened to fp32 before an IEEE product.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from atomk31.triton_kernels.ptpc_fp8 import GemmConfig, grouped_tile, store_scaled
from atomk31.triton_kernels.runtime import runs_on_interpreter


@dataclass(frozen=True)
class TmaGemmConfig(GemmConfig):
    """Tiles and schedule of the TMA kernel: the pointer kernel's GemmConfig, plus
    ``promote_per_tile`` (a fresh wgmma sum per K tile, added in fp32), ``warp_specialize``,
    ``split_n`` (two accumulators of block_n / 2 columns, each promoted on its own),
    ``persistent`` (one program per SM walking the tiles), ``promote_lagged`` (K tiles in
    pairs) and ``device_descriptors`` (descriptors built in the kernel)."""

    promote_per_tile: bool = False
    warp_specialize: bool = False
    split_n: bool = False
    persistent: bool = False
    promote_lagged: bool = False
    device_descriptors: bool = False


# Paired K tiles on 8 warps in 3 stages: the variant's best ("tma lag2").
LAGGED_CONFIG = TmaGemmConfig(128, 128, 128, num_warps=8, num_stages=3, promote_lagged=True)
# Triton's warp specialization of the loop (one producer, two consumer warpgroups of 64 rows).
WARP_SPECIALIZED_CONFIG = TmaGemmConfig(128, 128, 128, num_warps=4, num_stages=4,
                                        promote_per_tile=True, warp_specialize=True,
                                        device_descriptors=True)
# Programs of a persistent config under the interpreter: a few, so that each walks tiles.
INTERPRETER_PERSISTENT_PROGRAMS = 3


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
def tile_product(a_desc, b_desc, off_m, off_n, i_k, BLOCK_K: tl.constexpr,
                 DOT_FP32: tl.constexpr):
    """One K tile's product in a fresh fp32 sum (a wgmma partial on Hopper; an IEEE fp32
    product under the interpreter)."""
    b_a = a_desc.load([off_m, i_k * BLOCK_K])
    b_b = b_desc.load([off_n, i_k * BLOCK_K])
    if DOT_FP32:
        return tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), input_precision="ieee")
    return tl.dot(b_a, tl.trans(b_b))


@triton.jit
def lagged_k_loop(b_acc, a_desc, b_desc, off_m, off_n, k_begin, k_end,
                  BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """b_acc + the K tiles [k_begin, k_end) of a @ b^T, each tile's partial sum promoted into
    fp32 (the same adds, in the same order, as PROMOTE_PER_TILE), K tiles in pairs.

    Why pairs: a promoted partial is needed right after its wgmma, so a plain loop waits for
    every wgmma to drain before adding (the tensor cores idle meanwhile). Here the second
    tile's wgmma is left in flight across the loop's back edge (Triton 3.6 makes it async and
    waits for it in the next iteration), and the first tile's partial is added while the
    second's wgmma runs: one drain per two K tiles instead of one per tile."""
    num_k = k_end - k_begin
    b_odd = tl.zeros_like(b_acc)
    for i_pair in range(0, num_k // 2):
        i_k = k_begin + 2 * i_pair
        b_even = tile_product(a_desc, b_desc, off_m, off_n, i_k, BLOCK_K, DOT_FP32)
        b_acc += b_odd
        b_odd = tile_product(a_desc, b_desc, off_m, off_n, i_k + 1, BLOCK_K, DOT_FP32)
        b_acc += b_even
    b_acc += b_odd
    if num_k % 2 == 1:
        b_acc += tile_product(a_desc, b_desc, off_m, off_n, k_end - 1, BLOCK_K, DOT_FP32)
    return b_acc


@triton.jit
def gemm_tile(
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c, rows_per_tile, i_tile,
    i_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_N: tl.constexpr,
    DOT_FP32: tl.constexpr, PROMOTE_PER_TILE: tl.constexpr, PROMOTE_EVERY: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, PROMOTE_LAGGED: tl.constexpr,
):
    """One output tile (one K split of it): the K loop, then the scaled store."""
    i_m, i_n = grouped_tile(i_tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = i_split * k_tiles_per_split
    k_end = tl.minimum(k_begin + k_tiles_per_split, k_tiles)
    # rows_per_tile == BLOCK_M, as a runtime value: Triton 3.6's warp specialization offsets the
    # second consumer's A loads by 64 rows and, where the store reuses that same i_m * BLOCK_M,
    # offsets its stored rows twice (o_m + 64 + [64, 128): wrong rows)
    o_m = i_m * rows_per_tile + tl.arange(0, BLOCK_M)
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
    elif PROMOTE_LAGGED:
        b_acc = lagged_k_loop(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), a_desc, b_desc,
                              i_m * BLOCK_M, i_n * BLOCK_N, k_begin, k_end, BLOCK_K, DOT_FP32)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        store_scaled(b_acc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, stride_c, o_m, o_n,
                     SPLIT_K)
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
    # [BLOCK_N (/ 2 with SPLIT_N), BLOCK_K] boxes (with DEVICE_DESCRIPTORS: the fp8 tensors,
    # described here); scales [M] / [N] fp32; c [M, N]; rows_per_tile == BLOCK_M (gemm_tile)
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr,
    M, N, K, stride_a, stride_b, stride_c, rows_per_tile,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_N: tl.constexpr,
    DOT_FP32: tl.constexpr, PROMOTE_PER_TILE: tl.constexpr, PROMOTE_EVERY: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, PERSISTENT: tl.constexpr = False,
    PROMOTE_LAGGED: tl.constexpr = False, DEVICE_DESCRIPTORS: tl.constexpr = False,
):
    if DEVICE_DESCRIPTORS:
        # Triton 3.6's Hopper warp specialization gives each consumer warpgroup half of the
        # A tile and rewrites a descriptor made here to that half; a host descriptor keeps
        # its BLOCK_M-row box and overruns the half-size buffer (a hang)
        B_ROWS: tl.constexpr = BLOCK_N // 2 if SPLIT_N else BLOCK_N
        a_desc = tl.make_tensor_descriptor(a_desc, shape=[M, K], strides=[stride_a, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_desc, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[B_ROWS, BLOCK_K])
    if PERSISTENT:
        # one program per SM walks the tiles: with warp specialization the producer loads
        # the next tile while the consumers store this one (short K loops: kv_b's K = 512)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for i_tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            gemm_tile(a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c,
                      rows_per_tile, i_tile, tl.program_id(1), BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M, SPLIT_K, SPLIT_N, DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY,
                      WARP_SPECIALIZE, PROMOTE_LAGGED)
    else:
        gemm_tile(a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr, M, N, K, stride_c,
                  rows_per_tile, tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, SPLIT_K, SPLIT_N, DOT_FP32, PROMOTE_PER_TILE, PROMOTE_EVERY,
                  WARP_SPECIALIZE, PROMOTE_LAGGED)


def can_use_tma(a: torch.Tensor, w_q: torch.Tensor) -> bool:
    """Descriptors need 16-byte aligned bases and rows (fp8: K a multiple of 16)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 and t.stride(-1) == 1
               for t in (a, w_q))


def scratch_for_descriptors(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator hook: global scratch for descriptors built in a kernel."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch_ptpc_gemm_tma(
    a: torch.Tensor, w_q: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
    c: torch.Tensor, config: TmaGemmConfig, on_interpreter: bool, num_programs: int,
) -> None:
    """c [M, N] (out dtype, or zeroed fp32 with split K) <- the scaled GEMM of a [M, K] and
    w_q [N, K] (both fp8, rows 16-byte aligned: ``can_use_tma``). ``num_programs``: the grid
    of a persistent config (the SM count)."""
    if not can_use_tma(a, w_q):
        raise ValueError(f"ptpc_linear: the TMA kernel needs 16-byte aligned fp8 rows (K a "
                         f"multiple of 16), got a {tuple(a.shape)} stride {a.stride()} and "
                         f"w_q {tuple(w_q.shape)} stride {w_q.stride()}")
    if config.warp_specialize and not config.device_descriptors and not on_interpreter:
        raise ValueError("ptpc_linear: the TMA kernel's warp specialization needs "
                         "device_descriptors=True (with host descriptors Triton 3.6 copies "
                         "whole A tiles into half-tile buffers), got a config without")
    m, k = a.shape
    n = w_q.shape[0]
    if config.device_descriptors:
        a_desc, b_desc = a, w_q
        # the kernel writes its descriptors to global scratch memory, which Triton asks the
        # allocator for at launch (a torch allocation: CUDA-graph capturable)
        triton.set_allocator(scratch_for_descriptors)
    else:
        b_rows = config.block_n // 2 if config.split_n else config.block_n
        a_desc = TensorDescriptor.from_tensor(a, [config.block_m, config.block_k])
        b_desc = TensorDescriptor.from_tensor(w_q, [b_rows, config.block_k])
    promote_every = None if config.promote_every is None else \
        min(config.promote_every, config.block_k)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = (min(tiles, num_programs) if config.persistent else tiles, config.split_k)
    ptpc_gemm_tma_kernel[grid](
        a_desc, b_desc, a_scale, w_scale, c, m, n, k, a.stride(0), w_q.stride(0), c.stride(0),
        config.block_m,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, SPLIT_K=config.split_k, SPLIT_N=config.split_n,
        DOT_FP32=on_interpreter,
        PROMOTE_PER_TILE=config.promote_per_tile,
        PROMOTE_EVERY=promote_every,
        WARP_SPECIALIZE=config.warp_specialize and not on_interpreter,
        PERSISTENT=config.persistent, PROMOTE_LAGGED=config.promote_lagged,
        DEVICE_DESCRIPTORS=config.device_descriptors,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def ptpc_linear_quantized_tma(
    x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16, config: TmaGemmConfig = LAGGED_CONFIG,
) -> torch.Tensor:
    """``ptpc_linear_quantized``'s contract on the TMA kernel (persistent configs: one
    program per SM, a few under the interpreter)."""
    n, k = w_q.shape
    a = x_q.reshape(-1, k).contiguous()
    m = a.shape[0]
    split = config.split_k > 1
    c = torch.zeros((m, n), dtype=torch.float32, device=a.device) if split else \
        torch.empty((m, n), dtype=out_dtype, device=a.device)
    on_interpreter = runs_on_interpreter(ptpc_gemm_tma_kernel)
    if m and n:
        num_programs = INTERPRETER_PERSISTENT_PROGRAMS if on_interpreter else \
            torch.cuda.get_device_properties(a.device).multi_processor_count
        launch_ptpc_gemm_tma(a, w_q.contiguous(), x_scale.reshape(-1).float().contiguous(),
                             w_scale.float().contiguous(), c, config, on_interpreter,
                             num_programs)
    return (c.to(out_dtype) if split else c).view(*x_q.shape[:-1], n)
