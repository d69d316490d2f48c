"""Indexer scores on Hopper (sm_90) in Gluon: TMA-fed key ring, a producer warp, two consumer
warpgroups taking alternate key tiles.

This file: the kernel, its producer partition and its shared-memory budget. The consumer
partition is indexer_score_consumer.py, the work split both follow indexer_score_work_split.py,
the host side (the launcher `indexer_score_hopper`, descriptors) indexer_score.py, and the
queries' quantizer launch indexer_score_query_prep.py.

Contract: `atomk31.ops.indexer_score` (MODEL_SPEC §4.6 "Quantized evaluation", §9 #4), FP8
e4m3fn keys (the registry's `hopper` target: sm_90, FP8 index keys, pages of a multiple of 64
tokens): scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= p_i, -inf up to L.

Numerics (as the Triton kernel's CUDA default, atomk31/triton_kernels/indexer_score.py): the
queries go through the keys' quantizer in one small Triton launch before the kernel
(`prepare_queries`: bit-exact with `quantize_index_keys`, no host values, so it captures in a
CUDA graph); the product runs on the e4m3 codes and the scales come after, since
relu(s_q s_k x) = s_q s_k relu(x) for positive scales: score = s_k sum_h (w_h s_q,h)
relu(q_codes · k_codes), the per-head query scale folded into the weights. Products: the
keys' FP8 codes become FP16 in registers (one F2FP per two values; every e4m3 value is an
FP16 value, exact) and are wgmma's A operand from registers (k_width 2); the queries' codes in
FP16 sit in shared memory (B); fp32 sums. (FP8 tensor-core products are faster but outside
the op's tolerance: Hopper keeps ~14 bits of an FP8 wgmma's running sum; benchmarks/NOTES.md.)

Design (DeepGEMM's sm90 fp8_paged_mqa_logits does this op the same way; FlashMLA for the
roles):
  * Work: a program owns ROWS consecutive query rows (a request's verification rows: the
    launcher sizes ROWS from Nq / requests, as the Triton kernel does) and key tiles of
    BLOCK_N = 64 positions inside one page. The (row tile, key tile) pairs are flattened and
    cut into equal contiguous ranges, one per program (grid = SMs: persistent, every SM gets
    the same number of tiles +-1); a range crosses at most a few row tiles ("segments"). Rows
    of several requests in one row tile are right (each request's keys are streamed once for
    its rows, others masked), only slower; rows in any order.
  * Producer (1 warp, 40 registers): per tile, the page from the block table (32 pages read at
    once by the warp's lanes, the next 32 prefetched) and two TMA loads into the ring's stage:
    keys [1, 64, 128] fp8 (8 KiB) and their scales [1, 64] fp32 (256 B); ready/empty mbarriers.
  * Consumers (two warpgroups, 232 registers): tile n goes to consumer n % 2, so one's
    epilogue runs under the other's products; each keeps its own copy of the row tile's
    queries in shared memory. Per tile: the codes by ld.shared, F2FP, then N = ROWS x HEADS_PAD
    columns of products in parts of <= 128 (m64n128k16 x 8). The stage goes back right after
    the products, before the epilogue (two bar.syncs of the warpgroup there, none after the
    epilogue: `_release`). The products are not pipelined across tiles: ptxas serializes
    overlapping wgmma with a register A operand (C7512), and at 4 rows two accumulators spill.
    Epilogue: relu, x weight per column, sum of each row's HEADS_PAD columns, x key scale,
    -inf past each row's position, stored along keys.
  * Positions past every row of a request in a program's range: -inf stores only.

Shared memory (`shared_bytes` is the one formula; ROWS 4, 32 heads): queries 2 consumers
x 128 x 128 x 2 B = 64 KiB; the ring NUM_STAGES x (8192 + 256) B, 16 stages = 132 KiB;
barriers: 197 KiB of 227 KiB (ROWS 8: queries 128 KiB, 11 stages). 16 stages because the ring
keeps ~100 KiB of keys in flight per SM (Little: 32 GB/s an SM x ~3 us).

Offline sm_90 (triton 3.9; tests/gluon_kernels/hopper/test_indexer_score_kernel.py): no stack
and no local-memory op in the tile loops at 1 and 4 rows a program (decode, verification); at
8 rows (two products a tile) 8 B of stack, reloaded once or twice a tile.

Every size argument may be 1 (Triton then passes it as a constant): the kernel converts
arguments with gl.cast, never with a tensor method.

Limits (the launcher's checks): TMA's rules (16-byte aligned bases, 16-byte multiples for the
block strides of values and scales, unit last strides), H_I <= 128 heads; not under the
interpreter. For triton 3.6 (the H200's) and 3.9.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from gluon_kernels.hopper.indexer_score_consumer import _consumer
from gluon_kernels.hopper.indexer_score_work_split import (
    BLOCK_N, INDEX_DIM, _num_segments, _request_of_row, _segment,
)

MAX_HEADS = 128  # HEADS_PAD: a row's columns in one product
# Query columns (rows x heads) per program: two products of 128 (64 accumulator registers a
# thread each).
MAX_COLUMNS = 256
PART_COLUMNS = gl.constexpr(128)
MAX_STAGES = 16
PAGES_PER_READ = gl.constexpr(32)  # block-table entries the producer warp reads at once
# Registers per thread (setmaxnreg): consumers 232, producer 40;
# 40 x 128 + 2 x 232 x 128 = 64512 of 65536: a cap of 168 at entry (the launch's maxnreg).
CONSUMER_REGISTERS = gl.constexpr(232)
PRODUCER_REGISTERS = gl.constexpr(40)
KERNEL_MAX_REGISTERS = 168
MAX_SHARED_BYTES = 227 * 1024  # per block on sm_90
# Triton 3.9 renamed the TMA copy (3.6: async_copy_global_to_shared)
TMA_LOAD = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _producer(key_desc, scale_desc, keys, scales, ready, empty, block_table_ptr,
              row_request_ptr, row_position_ptr, num_rows, num_positions, block_size,
              tiles_per_row_tile, num_row_tiles, stride_table_r, ROWS: gl.constexpr):
    """1 warp: every tile of the program's range into the ring, in the consumers' order."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    ROW_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    PAGE_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    program = gl.program_id(0)
    num_programs = gl.num_programs(0)
    tiles_per_page = block_size // BLOCK_N
    o_page = gl.arange(0, PAGES_PER_READ, layout=PAGE_LAYOUT)
    step = 0
    for i_segment in range(_num_segments(program, num_programs, tiles_per_row_tile,
                                         num_row_tiles)):
        row_tile, t0, t1 = _segment(program, num_programs, tiles_per_row_tile, num_row_tiles,
                                    i_segment)
        row0 = row_tile * ROWS
        for j in range(ROWS):
            is_first, request, m_rows, b_position, max_position = _request_of_row(
                row_request_ptr, row_position_ptr, row0, j, num_rows, num_positions, ROWS,
                ROW_LAYOUT)
            if is_first:
                t_end = gl.minimum(t1, gl.cdiv(max_position + 1, BLOCK_N))
                table = block_table_ptr + request.to(gl.int64) * stride_table_r
                first_page = t0 // tiles_per_page
                last_page = gl.cdiv(t_end, tiles_per_page)  # exclusive: reads stay inside it
                pages = gl.load(table + first_page + o_page,
                                mask=first_page + o_page < last_page, other=0)
                next_pages = gl.load(table + first_page + PAGES_PER_READ + o_page,
                                     mask=first_page + PAGES_PER_READ + o_page < last_page,
                                     other=0)
                group = first_page
                # the tile's page and its place in it, stepped (no division a tile)
                page = first_page
                tile_in_page = t0 - first_page * tiles_per_page
                for tile in range(t0, t_end):
                    if tile_in_page == tiles_per_page:
                        page += 1
                        tile_in_page = 0
                    if page - group >= PAGES_PER_READ:
                        group += PAGES_PER_READ
                        pages = next_pages
                        next_pages = gl.load(table + group + PAGES_PER_READ + o_page,
                                             mask=group + PAGES_PER_READ + o_page < last_page,
                                             other=0)
                    block = gl.sum(gl.where(o_page == page - group, pages, 0), axis=0)
                    offset = tile_in_page * BLOCK_N
                    tile_in_page += 1
                    stage = step % NUM_STAGES
                    # a fresh mbarrier counts as having completed the phase before phase 0
                    mbarrier.wait(empty.index(stage), ((step // NUM_STAGES) & 1) ^ 1)
                    bar = ready.index(stage)
                    mbarrier.expect(bar, key_desc.block_type.nbytes + scale_desc.block_type.nbytes)
                    TMA_LOAD(key_desc, [block, offset, 0], bar, keys.index(stage))
                    TMA_LOAD(scale_desc, [block, offset], bar, scales.index(stage))
                    step += 1


@gluon.jit
def indexer_score_hopper_kernel(
    # descriptors: keys [num_blocks, block_size, 128] fp8 in [1, 64, 128] boxes, scales
    # [num_blocks, block_size] fp32 in [1, 64] boxes
    key_desc, scale_desc,
    # pointers: query codes [Nq, HEADS_PAD, 128] fp16, weights x query scales [Nq, HEADS_PAD]
    # fp32, block table [N, max_blocks] int32, rows' requests and positions [Nq], scores
    # [Nq, L] fp32
    q_ptr, weights_ptr, block_table_ptr, row_request_ptr, row_position_ptr, scores_ptr,
    # sizes
    num_rows, num_positions, block_size, tiles_per_row_tile, num_row_tiles,
    # strides (elements)
    stride_table_r, stride_scores_row,
    # meta-parameters
    ROWS: gl.constexpr, HEADS_PAD: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    # Columns per product and parts (at most two).
    COLUMNS: gl.constexpr = ROWS * HEADS_PAD if ROWS * HEADS_PAD < PART_COLUMNS else PART_COLUMNS
    NUM_PARTS: gl.constexpr = ROWS * HEADS_PAD // COLUMNS
    Q_SHARED: gl.constexpr = gl.NVMMASharedLayout.get_default_for([COLUMNS, INDEX_DIM],
                                                                  gl.float16)
    keys = gl.allocate_shared_memory(key_desc.dtype, [NUM_STAGES] + key_desc.block_type.shape,
                                     key_desc.layout)
    scales = gl.allocate_shared_memory(scale_desc.dtype,
                                       [NUM_STAGES] + scale_desc.block_type.shape,
                                       scale_desc.layout)
    q_smem0 = gl.allocate_shared_memory(gl.float16, [NUM_PARTS, COLUMNS, INDEX_DIM], Q_SHARED)
    q_smem1 = gl.allocate_shared_memory(gl.float16, [NUM_PARTS, COLUMNS, INDEX_DIM], Q_SHARED)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; then the TMA bytes
        mbarrier.init(empty.index(i), count=1)  # the tile's consumer
    gl.warp_specialize([
        (_consumer, (keys, scales, q_smem0, ready, empty, q_ptr, weights_ptr,
                     row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                     num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                     0, ROWS, HEADS_PAD)),
        (_consumer, (keys, scales, q_smem1, ready, empty, q_ptr, weights_ptr,
                     row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                     num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                     1, ROWS, HEADS_PAD)),
        (_producer, (key_desc, scale_desc, keys, scales, ready, empty, block_table_ptr,
                     row_request_ptr, row_position_ptr, num_rows, num_positions,
                     block_size, tiles_per_row_tile, num_row_tiles, stride_table_r,
                     ROWS)),
    ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])


def shared_bytes(rows: int, heads_pad: int, num_stages: int) -> int:
    """Shared memory of a launch: the ring (keys and scales of a tile per stage), the two
    consumers' FP16 query copies and the barriers (and a KiB of the compiler's scratch)."""
    ring = num_stages * BLOCK_N.value * (INDEX_DIM.value + 4)
    return ring + 2 * rows * heads_pad * INDEX_DIM.value * 2 + 1024


def stages_that_fit(rows: int, heads_pad: int) -> int:
    """The deepest ring (<= MAX_STAGES) that fits beside the queries."""
    stages = MAX_STAGES
    while stages > 2 and shared_bytes(rows, heads_pad, stages) > MAX_SHARED_BYTES:
        stages -= 1
    return stages
