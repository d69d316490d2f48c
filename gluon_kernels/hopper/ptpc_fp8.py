"""PTPC-FP8 scaled GEMM for Hopper (sm_90) in Gluon: warp-specialized, FP8 wgmma with the partial
sum promoted to fp32 every 128 K elements (MODEL_SPEC §6.5):
``c [M, N] = (a [M, K] @ b [N, K]^T) * a_scale[:, None] * b_scale[None, :]``.

Why Gluon: Hopper's FP8 wgmma keeps ~14 bits of its running sum, so equal accuracy with
torch._scaled_mm (cuBLASLt) needs the sum promoted into an fp32 accumulator every 128 K. Triton
waits for each wgmma to drain before it can add its partial, and the tensor cores idle
meanwhile; Gluon states the schedule explicitly. The design is CUTLASS's "warp-specialized
cooperative FP8 with promotion":

* a producer partition (1 warp, 40 registers) fills a ring of NUM_STAGES shared-memory stages
  (A [64, 128] per consumer, B [BLOCK_N, 128]) by TMA, one ready/empty mbarrier pair per stage;
* two consumer partitions (one warpgroup each, 232 registers) own 64 rows of the 128-row tile.
  Each issues ``warpgroup_mma(is_async=True)`` into a fresh partial sum per K tile, then
  ``warpgroup_mma_wait(num_outstanding=1)`` retires the previous tile's wgmma, releases its
  stage and adds its partial into the fp32 accumulator while the new wgmma runs; two partials
  alternate (``k_loop``: K tiles in pairs, no register copies on the back edge);
* the consumers are separate partitions (not one 8-warp partition): each releases a stage only
  after its own wgmma read it (an empty barrier counts one arrival per consumer);
* epilogue: row scale times column scale in fp32, one rounding to c's dtype, a TMA store from
  shared memory that completes under the next tile's K loop (``overlap_epilogue``: the
  epilogue itself runs under the next tile's first wgmma). The grid is persistent: one program
  per SM walks the tiles in grouped order, GROUP_M row tiles per column tile for L2.

The adds are those of a promote-per-tile schedule (a fresh wgmma sum per 128-K tile, added in K
order): within 1.25x torch._scaled_mm's error on the same inputs. Out-of-bounds rows, columns
and K read as zeros (TMA padding), stores are clipped by the descriptor: no masks in the loop.
The three descriptors' shared layouts are built once per box shape (``shared_layout``): building
them costs microseconds of host time a launch.

Limits (ValueError otherwise): NVIDIA sm_90 only (wgmma, TMA and setmaxnreg are Hopper's);
e4m3fn operands, 16-byte aligned rows of a, w_q (K a multiple of 16) and c; no split K; not
under the interpreter. Tiles and stages per call: ptpc_fp8_launch.py. For triton 3.6 (the
H200's) and 3.9."""

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# (constexpr globals: the kernels read them; the host reads .value)
ROWS_PER_CONSUMER = gl.constexpr(64)  # a wgmma's M per warpgroup
BLOCK_K = gl.constexpr(128)  # K per stage = the promotion interval
BLOCK_M = gl.constexpr(128)  # two consumer warpgroups of 64 rows
NUM_CONSUMERS = gl.constexpr(2)
# Column tiles: 128 x 256 would need 2 x 128 + 128 registers per thread: over a consumer's 232.
BLOCK_NS = (64, 128)
# Registers per thread (setmaxnreg): producer warpgroup 40, consumers 232 with their two
# partials (40 x 128 + 2 x 232 x 128 = 64512 of 65536: a cap of 168 at entry).
PRODUCER_REGISTERS = gl.constexpr(40)
CONSUMER_REGISTERS = gl.constexpr(232)
KERNEL_MAX_REGISTERS = 168
GROUP_M = 8  # row tiles per column tile in the grouped order
MAX_SHARED_BYTES = 227 * 1024  # per block on sm_90
# Triton 3.9 renamed the TMA copies (3.6: async_copy_global_to_shared / _shared_to_global)
TMA_LOAD = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
TMA_STORE = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


@gluon.jit
def tile_origin(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                GROUP_M: gl.constexpr):
    """(first row, first column) of output tile ``tile`` in grouped order: GROUP_M row tiles
    share each column tile while it sits in L2."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    group = tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = gl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (tile % (GROUP_M * num_n)) % group_size
    i_n = (tile % (GROUP_M * num_n)) // group_size
    return i_m * BLOCK_M, i_n * BLOCK_N


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                   GROUP_M: gl.constexpr):
    """Producer: TMA loads of every tile's K steps into the ring, in the consumers' order (A as
    one 64-row box per consumer)."""
    NUM_STAGES: gl.constexpr = b_bufs.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for i_k in range(k_tiles):
            stage = step % NUM_STAGES
            # a fresh mbarrier counts as having completed the phase before phase 0
            mbarrier.wait(empty.index(stage), ((step // NUM_STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, NUM_CONSUMERS * a_desc.block_type.nbytes +
                            b_desc.block_type.nbytes)
            for i in gl.static_range(NUM_CONSUMERS):
                TMA_LOAD(a_desc, [off_m + i * ROWS_PER_CONSUMER, i_k * BLOCK_K], bar,
                         a_bufs.index(stage * NUM_CONSUMERS + i))
            TMA_LOAD(b_desc, [off_n, i_k * BLOCK_K], bar, b_bufs.index(stage))
            step += 1


@gluon.jit
def issue_tile_mma(a_bufs, b_bufs, ready, step, partial, ROW0: gl.constexpr):
    """Wait for K step ``step``'s buffers, then start its wgmma into ``partial`` (whose old value
    is ignored: a fresh sum per K tile). Returns the wgmma's pending result."""
    NUM_STAGES: gl.constexpr = b_bufs.shape[0]
    stage = step % NUM_STAGES
    mbarrier.wait(ready.index(stage), (step // NUM_STAGES) & 1)
    a = a_bufs.index(stage * NUM_CONSUMERS + ROW0 // ROWS_PER_CONSUMER)
    b = b_bufs.index(stage).permute((1, 0))  # [BLOCK_K, BLOCK_N] view of the K-major weight
    return warpgroup_mma(a, b, partial, use_acc=False, is_async=True)


@gluon.jit
def promote(acc, pending, empty, step, NUM_OUTSTANDING: gl.constexpr):
    """Retire K step ``step``'s wgmma (``pending``; NUM_OUTSTANDING newer ones may still run),
    give its buffer back to the producer and add its partial sum into the fp32 accumulator.
    Returns (acc, the partial's registers, free again)."""
    NUM_STAGES: gl.constexpr = empty.shape[0]
    partial = warpgroup_mma_wait(num_outstanding=NUM_OUTSTANDING, deps=(pending,))
    mbarrier.arrive(empty.index(step % NUM_STAGES), count=1)
    return acc + partial, partial


@gluon.jit
def k_loop(acc, pending_even, a_bufs, b_bufs, ready, empty, step, k_tiles, ROW0: gl.constexpr):
    """acc + this consumer's rows of the tile's product, one fresh wgmma sum per K tile, each
    promoted while the next K tile's wgmma runs; ``pending_even`` is K step ``step``'s wgmma,
    the tile's first, already issued. Returns (acc, the ring's next step).

    K tiles go in pairs with two partial sums (``even``, ``odd``) that keep their registers:
    a plain loop would swap the two on its back edge while a wgmma writes one of them."""
    odd = gl.zeros_like(acc)
    for _ in range((k_tiles - 1) // 2):
        pending_odd = issue_tile_mma(a_bufs, b_bufs, ready, step + 1, odd, ROW0)
        acc, even = promote(acc, pending_even, empty, step, 1)
        pending_even = issue_tile_mma(a_bufs, b_bufs, ready, step + 2, even, ROW0)
        acc, odd = promote(acc, pending_odd, empty, step + 1, 1)
        step += 2
    if (k_tiles - 1) % 2 == 1:
        pending_odd = issue_tile_mma(a_bufs, b_bufs, ready, step + 1, odd, ROW0)
        acc, even = promote(acc, pending_even, empty, step, 1)
        acc, odd = promote(acc, pending_odd, empty, step + 1, 0)
        step += 2
    else:
        acc, even = promote(acc, pending_even, empty, step, 0)
        step += 1
    return acc, step


@gluon.jit
def store_tile(acc, c_desc, c_smem, a_scale_ptr, b_scale_ptr, M, N, off_m, off_n,
               layout: gl.constexpr):
    """c[off_m:+64, off_n:+BLOCK_N] = acc * a_scale * b_scale: one rounding to c's dtype, a TMA
    store from shared memory (clipped at M and N) left to finish under the next K loop."""
    o_m = off_m + gl.arange(0, ROWS_PER_CONSUMER, layout=gl.SliceLayout(1, layout))
    o_n = off_n + gl.arange(0, c_desc.block_type.shape[1], layout=gl.SliceLayout(0, layout))
    a_scale = gl.load(a_scale_ptr + o_m, mask=o_m < M, other=0.0)
    b_scale = gl.load(b_scale_ptr + o_n, mask=o_n < N, other=0.0)
    # the same multiplication order as the torch op: (sum * s_x) * s_w
    c = acc * gl.expand_dims(a_scale, 1) * gl.expand_dims(b_scale, 0)
    tma.store_wait(0)  # the previous tile's store has finished reading c_smem
    c_smem.store(c.to(c_desc.dtype))
    fence_async_shared()
    TMA_STORE(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def mma_partition(a_bufs, b_bufs, ready, empty, c_desc, c_smem, a_scale_ptr, b_scale_ptr,
                  M, N, K, ROW0: gl.constexpr, GROUP_M: gl.constexpr,
                  OVERLAP_EPILOGUE: gl.constexpr):
    """Consumer of rows [ROW0, ROW0 + 64) of every tile: the K loop (two partial sums in
    K-tile pairs), then the scaled store. OVERLAP_EPILOGUE: a tile's store waits until the
    next tile's first wgmma is issued, so that the tensor cores work through the epilogue (the
    program's last tile is stored after the loop)."""
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    # one warpgroup, wgmma m64nBLOCK_Nk32 (FP8: 32 K per instruction)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_N, 32])
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    step = 0
    done = gl.zeros([ROWS_PER_CONSUMER, BLOCK_N], gl.float32, layout)  # the last tile's sums
    done_m = 0
    done_n = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = gl.zeros([ROWS_PER_CONSUMER, BLOCK_N], gl.float32, layout)
        pending = issue_tile_mma(a_bufs, b_bufs, ready, step, gl.zeros_like(acc), ROW0)
        if OVERLAP_EPILOGUE:
            if tile != gl.program_id(0):
                store_tile(done, c_desc, c_smem, a_scale_ptr, b_scale_ptr, M, N,
                           done_m + ROW0, done_n, layout)
        acc, step = k_loop(acc, pending, a_bufs, b_bufs, ready, empty, step, k_tiles, ROW0)
        if OVERLAP_EPILOGUE:
            done, done_m, done_n = acc, off_m, off_n
        else:
            store_tile(acc, c_desc, c_smem, a_scale_ptr, b_scale_ptr, M, N, off_m + ROW0, off_n,
                       layout)
    if OVERLAP_EPILOGUE:
        store_tile(done, c_desc, c_smem, a_scale_ptr, b_scale_ptr, M, N, done_m + ROW0, done_n,
                   layout)
    tma.store_wait(0)


@gluon.jit
def ptpc_gemm_hopper_kernel(
    # descriptors: a [M, K] fp8 in [64, 128] boxes, b [N, K] fp8 in [BLOCK_N, 128] boxes,
    # c [M, N] in [64, BLOCK_N] boxes; scales [M] / [N] fp32
    a_desc, b_desc, c_desc, a_scale_ptr, b_scale_ptr,
    M, N, K,
    GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr, OVERLAP_EPILOGUE: gl.constexpr,
):
    # ring buffer i * NUM_CONSUMERS + j: stage i's A rows [64 j, 64 j + 64) of the tile
    a_bufs = gl.allocate_shared_memory(a_desc.dtype,
                                       [NUM_STAGES * NUM_CONSUMERS] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [NUM_CONSUMERS] + c_desc.block_type.shape,
                                       c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; then the TMA bytes
        mbarrier.init(empty.index(i), count=NUM_CONSUMERS)  # one arrival per consumer
    # the first consumer is the default partition; the second and the producer are workers
    gl.warp_specialize([
        (mma_partition, (a_bufs, b_bufs, ready, empty, c_desc, c_smem.index(0), a_scale_ptr,
                         b_scale_ptr, M, N, K, 0, GROUP_M, OVERLAP_EPILOGUE)),
        (mma_partition, (a_bufs, b_bufs, ready, empty, c_desc, c_smem.index(1), a_scale_ptr,
                         b_scale_ptr, M, N, K, 64, GROUP_M, OVERLAP_EPILOGUE)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M)),
    ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def descriptor_type(dtype: object, dtype_name: str, block_shape: list[int]) -> str:
    """The signature type of a host TMA descriptor argument (offline compiles)."""
    layout = gl.NVMMASharedLayout.get_default_for(block_shape, dtype)
    return f"tensordesc<{dtype_name}{block_shape},{layout!r}>"


def compile_examples(target: object) -> list:
    """What an o_proj launches (bf16 out) in each config of ptpc_fp8_launch.py's tile table,
    for offline compiles (gluon_kernels/compile.py); none off sm_90 (wgmma and TMA are
    Hopper's). M, N and K are the size arguments of the first (each config compiles the same
    index arithmetic: one set of size cases covers it)."""
    from gluon_kernels.compile import CompileExample

    if getattr(target, "arch", None) != "sm90":
        return []
    examples = []
    for block_n, num_stages, overlap in ((128, 4, True), (128, 6, False), (64, 6, False)):
        signature = {"a_desc": descriptor_type(gl.float8e4nv, "fp8e4nv", [64, 128]),
                     "b_desc": descriptor_type(gl.float8e4nv, "fp8e4nv", [block_n, 128]),
                     "c_desc": descriptor_type(gl.bfloat16, "bf16", [64, block_n]),
                     "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32", "M": "i32", "N": "i32",
                     "K": "i32", "GROUP_M": "constexpr", "NUM_STAGES": "constexpr",
                     "OVERLAP_EPILOGUE": "constexpr"}
        constexprs = {"GROUP_M": GROUP_M, "NUM_STAGES": num_stages, "OVERLAP_EPILOGUE": overlap}
        name = f"ptpc_gemm_hopper[128x{block_n} s{num_stages}{' overlap' if overlap else ''}]"
        sizes = () if examples else ("M", "N", "K")
        examples.append(CompileExample(name, ptpc_gemm_hopper_kernel, signature, constexprs,
                                       num_warps=4, size_args=sizes,
                                       options={"maxnreg": KERNEL_MAX_REGISTERS}))
    return examples


@functools.lru_cache(maxsize=None)
def shared_layout(block_shape: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The swizzled shared layout of a TMA box: ~7 us to build on the host, so built once."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape),
                                                GL_DTYPES.get(dtype, gl.float8e4nv))


def descriptor(t: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
    """A TMA descriptor of 2-D ``t`` in ``block_shape`` boxes (zero padding out of bounds)."""
    return TensorDescriptor.from_tensor(t, block_shape, shared_layout(tuple(block_shape),
                                                                      t.dtype))


@dataclass(frozen=True)
class HopperGemmConfig:
    """Tiles of one launch: 128 x ``block_n`` (BLOCK_NS) output tiles, ``num_stages`` ring
    stages, and ``overlap_epilogue``: each tile's store under the next tile's first wgmma."""

    block_n: int = 128
    num_stages: int = 4
    overlap_epilogue: bool = False


def check_operands(a: torch.Tensor, w_q: torch.Tensor, a_scale: torch.Tensor,
                   w_scale: torch.Tensor, c: torch.Tensor, config: HopperGemmConfig) -> None:
    """ValueError unless the kernel can run these operands (see the module docstring)."""
    if a.dim() != 2 or w_q.dim() != 2 or a.shape[1] != w_q.shape[1] or \
            c.shape != (a.shape[0], w_q.shape[0]) or a_scale.shape != (a.shape[0],) or \
            w_scale.shape != (w_q.shape[0],):
        raise ValueError(f"ptpc_gemm_hopper: expected a [M, K], w_q [N, K], a_scale [M], "
                         f"w_scale [N] and c [M, N], got {tuple(a.shape)}, {tuple(w_q.shape)}, "
                         f"{tuple(a_scale.shape)}, {tuple(w_scale.shape)} and {tuple(c.shape)}")
    if a.dtype != torch.float8_e4m3fn or w_q.dtype != torch.float8_e4m3fn or \
            a_scale.dtype != torch.float32 or w_scale.dtype != torch.float32 or \
            c.dtype not in GL_DTYPES:
        raise ValueError(f"ptpc_gemm_hopper: expected float8_e4m3fn a and w_q, float32 scales "
                         f"and a bfloat16, float16 or float32 c, got {a.dtype}, {w_q.dtype}, "
                         f"{a_scale.dtype}, {w_scale.dtype} and {c.dtype}")
    if not all(t.is_cuda for t in (a, w_q, a_scale, w_scale, c)) or \
            torch.cuda.get_device_capability(c.device)[0] != 9:
        raise ValueError(f"ptpc_gemm_hopper: needs an NVIDIA sm_90 GPU (wgmma, TMA), got "
                         f"tensors on {c.device}")
    if not can_use_descriptors(a, w_q, c) or not a_scale.is_contiguous() or \
            not w_scale.is_contiguous():
        raise ValueError(f"ptpc_gemm_hopper: expected contiguous scales and 16-byte aligned, "
                         f"unit-stride rows of a, w_q and c (K a multiple of 16, N times the "
                         f"output's element size a multiple of 16 bytes), got shapes "
                         f"{tuple(a.shape)}, {tuple(c.shape)} and strides {a.stride()}, "
                         f"{w_q.stride()}, {c.stride()}; run this linear with --kernel-backend "
                         f"triton")
    if config.block_n not in BLOCK_NS or config.num_stages < 2:
        raise ValueError(f"ptpc_gemm_hopper: expected block_n in {BLOCK_NS} and num_stages >= "
                         f"2, got {config.block_n} and {config.num_stages}")
    shared = shared_bytes(config.block_n, config.num_stages, c.element_size())
    if shared > MAX_SHARED_BYTES:
        raise ValueError(f"ptpc_gemm_hopper: {config.num_stages} stages of 128 x "
                         f"{config.block_n} tiles with {c.dtype} output need {shared} bytes of "
                         f"shared memory, over Hopper's {MAX_SHARED_BYTES}")


def shared_bytes(block_n: int, num_stages: int, out_element_size: int) -> int:
    """Shared memory of a launch: the ring (A and B tiles of 128 fp8 K per stage), the output
    tiles and the barriers."""
    return num_stages * (BLOCK_M.value + block_n) * BLOCK_K.value + \
        BLOCK_M.value * block_n * out_element_size + 1024


def can_use_descriptors(a: torch.Tensor, w_q: torch.Tensor, c: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and rows and a unit last stride."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and
               t.stride(-1) == 1 for t in (a, w_q, c))


def ptpc_gemm_hopper(a: torch.Tensor, w_q: torch.Tensor, a_scale: torch.Tensor,
                     w_scale: torch.Tensor, c: torch.Tensor,
                     config: HopperGemmConfig = HopperGemmConfig()) -> torch.Tensor:
    """c [M, N] <- (a [M, K] @ w_q [N, K]^T) * a_scale [M, 1] * w_scale [1, N] (fp8 e4m3fn
    operands, fp32 scales, c bf16 / fp16 / fp32) in ``config``'s tiles, one program per SM
    walking them. Returns c."""
    check_operands(a, w_q, a_scale, w_scale, c, config)
    m, k = a.shape
    n = w_q.shape[0]
    if m == 0 or n == 0 or k == 0:      # an empty sum over K is zero
        return c.zero_()
    tiles = triton.cdiv(m, BLOCK_M.value) * triton.cdiv(n, config.block_n)
    rows = ROWS_PER_CONSUMER.value
    ptpc_gemm_hopper_kernel[(min(tiles, sm_count(c.device.index or 0)),)](
        descriptor(a, [rows, BLOCK_K.value]), descriptor(w_q, [config.block_n, BLOCK_K.value]),
        descriptor(c, [rows, config.block_n]), a_scale, w_scale, m, n, k,
        GROUP_M=GROUP_M, NUM_STAGES=config.num_stages, OVERLAP_EPILOGUE=config.overlap_epilogue,
        num_warps=4, maxnreg=KERNEL_MAX_REGISTERS,
    )
    return c
