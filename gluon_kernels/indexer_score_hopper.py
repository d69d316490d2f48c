"""Indexer scores on Hopper (sm_90) in Gluon: TMA-fed key ring, a producer warp, two consumer
warpgroups taking alternate key tiles.

This file: the kernel, its producer partition and its shared-memory budget. The consumer
partition is indexer_score_hopper_consumer.py, the work split both follow
indexer_score_hopper_work_split.py, the host side (`why_not_hopper`, descriptors, the launcher
`indexer_score_hopper`, `compile_examples`) indexer_score_hopper_launch.py, and the queries'
quantizer launch indexer_score_hopper_query_prep.py.

Contract: `atomk31.ops.indexer_score` (MODEL_SPEC §4.6 "Quantized evaluation", §9 #4), FP8
e4m3fn keys only: scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= p_i, -inf up to L. MXFP4
keys, e4m3fnuz and non-Hopper GPUs keep the Triton kernel (`why_not_hopper` says why).

Numerics (as the Triton kernel's CUDA default, atomk31/triton_kernels/indexer_score.py): the
queries go through the keys' quantizer in one small Triton launch before the kernel
(`prepare_queries`: bit-exact with `quantize_index_keys`, no host values, so it captures in a
CUDA graph); the product runs on the e4m3 codes and the scales come after, since
relu(s_q s_k x) = s_q s_k relu(x) for positive scales: score = s_k sum_h (w_h s_q,h)
relu(q_codes · k_codes), the per-head query scale folded into the weights. PRODUCT (constexpr):
  "fp16" (exact; the default of graph-replayed launches on Hopper, `default_kernel` in
    atomk31/triton_kernels/indexer_score.py): the keys' FP8 codes become FP16 in registers (one
    F2FP per two values; every e4m3 value is an FP16 value) and are wgmma's A operand from
    registers (k_width 2); the queries' codes in FP16 sit in shared memory (B); fp32 sums.
  "fp8_acc32" (opt-in): keys straight from the TMA stage (A from shared memory) x FP8 query
    codes, one fresh wgmma per 32-wide K slice added into an fp32 accumulator (Hopper keeps
    ~14 bits of an FP8 wgmma's running sum).
  "fp8" (opt-in): one K = 128 FP8 wgmma chain, no promotion.
  "fp16_ss" (exact, the same products and sums as "fp16"; launcher kernel "gluon_hopper_ss",
    opt-in: measured slower than "fp16", see Measured): both operands in shared memory:
    a converter warpgroup turns each tile's FP8 codes into an FP16 buffer
    (indexer_score_hopper_converter.py), so the consumers hold no A registers and are
    pipelined as "fp8" is (FP16 SS design below).
Bound for the FP8 modes (tests/gluon_kernels/test_indexer_score_hopper.py derives it): each
product q_c k_c is exact in fp32; the tensor core aligns a K = 32 slice's products to the
largest and keeps ~13 fractional bits below it, so a slice's sum is off by < 32 x 2^-13 x
its largest |q_c k_c| (no promotion: the running sum is a 33rd term of each slice, < 33 x
2^-13 x max(|running sum|, largest |q_c k_c|) per slice).

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
    queries in shared memory. fp16: the codes by ld.shared, F2FP, then N = ROWS x HEADS_PAD
    columns of products in parts of <= 128 (m64n128k16 x 8); fp8 modes: the products straight
    from the stage (fp8_acc32 in parts of 64 columns: its partial sums need a second
    accumulator; both take <= 4 rows of 32 heads a program). The stage goes back right after
    the products, before the epilogue (two bar.syncs of the warpgroup there, none after the
    epilogue: `_release`). "fp8" is pipelined in each consumer as well: tile n + 2's products
    are issued before tile n's epilogue; fp16 is not (ptxas serializes overlapping wgmma with
    a register A operand, C7512, and at 4 rows it would spill). Epilogue: relu, x weight per
    column, sum of each row's HEADS_PAD columns, x key scale, -inf past each row's position,
    stored along keys.
  * Positions past every row of a request in a program's range: -inf stores only.

FP16 SS design ("fp16_ss"; sparse_mla_hopper_ws's key producer does the same for the MLA
latent). Four partitions: consumer 0 (the default warpgroup), consumer 1, the converter (one
warpgroup), the producer (one warp); 13 warps, launched as 16. Tile n of the program's sequence
(all four walk the same one) lives in ring stage n % NUM_STAGES, then FP16 buffer
n % NUM_BUFFERS (6 buffers of [64, 128] fp16 codes and [64] fp32 key scales), consumer n % 2.
Every mbarrier has count 1: one arrive, by one thread after its partition's bar.sync:
  ready[s]      producer's expect + both TMA loads -> converter waits (n // NUM_STAGES) & 1;
  empty[s]      converter, once it has read the stage -> producer waits that ^ 1 (a fresh
                barrier counts as having completed the phase before phase 0);
  k16_ready[b]  converter, after its stores, fence.proxy.async and bar.sync -> consumer waits
                (n // NUM_BUFFERS) & 1;
  k16_free[b]   consumer, after the wgmma wait that retires tile n's products -> converter
                waits that ^ 1 before writing tile n + NUM_BUFFERS.
The consumers issue tile n + 2's products before tile n's epilogue (the "fp8" loop: two
accumulators), so each holds up to two buffers; with 6 the converter runs up to two tiles ahead
of them. No wait cycle: the converter's wait for tile n's buffer needs tile n - 6 released,
which needs tile n - 4 converted (earlier in its order); the producer's needs only the
converter's reads. No phase can be lapped: a barrier's next arrive needs the wait on its last.
Registers (setmaxnreg): consumers 208, converter 64, producer 32 (its warpgroup's three
padding warps too): 2 x 208 x 128 + 64 x 128 + 32 x 128 = 65,536, a cap of 128 at entry.
Shared (ROWS 4, 32 heads): queries 2 x 32 KiB, buffers 6 x 16,640 B, ring 7 x 8,448 B (the
converter holds a stage only while reading it): 225,020 B.

Shared memory (`shared_bytes` is the one formula; ROWS 4, 32 heads, fp16): queries 2 consumers
x 128 x 128 x 2 B = 64 KiB; the ring NUM_STAGES x (8192 + 256) B, 16 stages = 132 KiB;
barriers: 197 KiB of 227 KiB (ROWS 8: queries 128 KiB, 11 stages; fp8 4 rows: queries 32 KiB,
16 stages). 16 stages because the pipelined consumers hold up to two stages each and the ring
keeps ~100 KiB of keys in flight per SM (Little: 32 GB/s an SM x ~3 us).

Measured (H200, session 7 round 3, CUDA-graph ms, 16 requests x 4 rows, query prep included;
16K / 128K / 1M, with % of copy bandwidth): Triton default 0.031 / 0.176 / 1.354 (29.7% /
41.5% / 43.1%); gluon fp16 (exact) 0.031 / 0.165 / 1.265 (29.3% / 44.2% / 46.2%); gluon
fp8_acc32 - / 0.162 / 1.231 (error 3.7-4.3x the op's tolerance); gluon fp8 0.025 / 0.127 /
0.984 (37.1% / 57.3% / 59.4%; error 17-26x the tolerance, top-2048 overlap with the exact
scores 0.9997-0.9998). Round 1 predicted ~0.105 (fp16) and ~0.080 (fp8) at 128K and
measured 0.192 / 0.154; round 3 predicted 0.13-0.15 / ~0.09: 1.1-1.4x optimistic. Round 4
(da0966b + fp16_ss): fp16's A operand through shared memory, "fp16_ss", was predicted at
0.027 / 0.125 / 0.97 ms and measured 0.036 / 0.189 / 1.429 (fp16 beside it 0.032 / 0.164 /
1.275): the converter's shared-memory round trip and a 7-stage ring (16 for the others) cost
more than the pipelined products gain. Kept selectable as the base of that design, not the
default. Next: for fp16_ss, a deeper ring (fewer FP16 buffers) and an ncu reading; for fp8,
the producer warp
(93 instructions a tile: ~200-300 latency cycles against the 518 a tile's bytes take) or the
consumers' ready waits, which ncu should tell apart. Round by round: benchmarks/NOTES.md.

Offline sm_90 compile (`compile_examples`, maxnreg 168, fp16_ss 128; tests/gluon_kernels/
test_indexer_score_hopper_offline.py checks it). Registers: the highest index a consumer uses
(of 232; fp16_ss of 208);
"loop": SASS instructions of one consumer's tile loop a tile (fp8: its two-tile loop / 2),
"bar": bar.sync a tile in it; no local-memory op in any tile loop:
  example (32 heads)  triton 3.6 (H200's): regs, stack, loop, bar   triton 3.9: same
  fp16 4 rows         221, 0, 330, 2                                177, 0, 368, 3
  fp16 8 rows         229, 8 B, 570, 2                              229, 16 B, 625, 3
  fp16 1 row          106, 0, 162, 2                                112, 0, 180, 3
  fp8_acc32 4 rows    229, 48 B, 509, 2                             218, 0, 525, 3
  fp8 4 rows          229, 48 B, 275, 2                             210, 0, 287, 3
  fp16_ss 4 rows      205 (of 208), 88 B, 293, 2                    205, 88 B, 294, 3
  fp16_ss 1 row       75, 0, 106, 2                                 81, 24 B, 117, 3
(fp16_ss: its converter's loop 89 (3.9: 81) instructions a tile: 4 LDS.128, 32 F2FP, 8
STS.128, 3 bar.sync; its producer's 80 (63). ptxas warns of nothing: no serialized wgmma.)
(3.9's barrier pass adds one before the arrive next to ours: three in a row, the same point.)
A fp16 tile (4 rows, 3.6): 8 HGMMA 64x128x16, 34 LDS (the codes, 2 bytes each, and the
scales) + 32 F2FP, 64 FMNMX, 56 FFMA, 16 SHFL, 8 STG; fp8_acc32: 8 QGMMA 64x64x32 and 208
FADD; fp8: 4 QGMMA 64x128x32, 2 LDS. The stack bytes are used outside the tile loops.
Shared memory (metadata): 201,160 B (fp16 4 rows, 16 stages), 224,384 B (8 rows, 11),
152,008 B (1 row), 168,392 B (fp8 modes, 16 stages), 225,020 B (fp16_ss 4 rows, 7 stages),
226,652 B (fp16_ss 1 row, 13 stages).

Limits (why_not_hopper): NVIDIA sm_90, e4m3fn keys, block_size a multiple of 64, TMA's rules
(16-byte aligned bases, 16-byte multiples for the block strides of values and scales, unit
last strides), H_I <= 128 heads; not under the interpreter. Gluon ships in
the triton wheel: this is the `triton` backend's kernel, chosen by the launcher's `kernel`.
For triton 3.6 (the H200's) and 3.9.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from gluon_kernels.indexer_score_hopper_consumer import _consumer
from gluon_kernels.indexer_score_hopper_converter import _converter
from gluon_kernels.indexer_score_hopper_work_split import (
    BLOCK_N, INDEX_DIM, _num_segments, _request_of_row, _segment,
)

MAX_HEADS = 128  # HEADS_PAD: a row's columns in one product
# Query columns (rows x heads) per product and per program (two products at most): the fp16
# products 128 (64 accumulator registers a thread) and 256; fp8_acc32, whose partial sums need
# a second accumulator, 64 and 128; fp8 128 and 128 (the same rows as fp8_acc32).
# fp16_ss 128 (one part: pipelined, two accumulators).
MAX_COLUMNS = {"fp16": 256, "fp8_acc32": 128, "fp8": 128, "fp16_ss": 128}
MAX_STAGES = 16
PRODUCTS = ("fp16", "fp8_acc32", "fp8", "fp16_ss")
NUM_BUFFERS = gl.constexpr(6)  # fp16_ss: the converter's FP16 key buffers (consumers hold 4)
PAGES_PER_READ = gl.constexpr(32)  # block-table entries the producer warp reads at once
# Registers per thread (setmaxnreg), as ptpc_fp8_hopper: consumers 232, producer 40;
# 40 x 128 + 2 x 232 x 128 = 64512 of 65536: a cap of 168 at entry.
CONSUMER_REGISTERS = gl.constexpr(232)
PRODUCER_REGISTERS = gl.constexpr(40)
KERNEL_MAX_REGISTERS = 168
# fp16_ss: four partitions, 13 warps padded to 16 (512 threads: a cap of 128 at entry);
# SS_CONSUMER x 2 x 128 + CONVERTER x 128 + SS_PRODUCER x 128 <= 65536.
SS_CONSUMER_REGISTERS = gl.constexpr(208)
CONVERTER_REGISTERS = gl.constexpr(64)
SS_PRODUCER_REGISTERS = gl.constexpr(32)
SS_KERNEL_MAX_REGISTERS = 128
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
    # pointers: query codes [Nq, HEADS_PAD, 128] (fp16 or fp8), weights x query scales
    # [Nq, HEADS_PAD] fp32, block table [N, max_blocks] int32, rows' requests and positions
    # [Nq], scores [Nq, L] fp32
    q_ptr, weights_ptr, block_table_ptr, row_request_ptr, row_position_ptr, scores_ptr,
    # sizes
    num_rows, num_positions, block_size, tiles_per_row_tile, num_row_tiles,
    # strides (elements)
    stride_table_r, stride_scores_row,
    # meta-parameters
    ROWS: gl.constexpr, HEADS_PAD: gl.constexpr, NUM_STAGES: gl.constexpr,
    PRODUCT: gl.constexpr,  # "fp16", "fp8_acc32" or "fp8" (module docstring)
):
    # Columns per product (part_columns: 64 for fp8_acc32, whose partial sums need a second
    # accumulator; else 128) and parts (at most two).
    PART: gl.constexpr = 64 if PRODUCT == "fp8_acc32" else 128
    COLUMNS: gl.constexpr = ROWS * HEADS_PAD if ROWS * HEADS_PAD < PART else PART
    NUM_PARTS: gl.constexpr = ROWS * HEADS_PAD // COLUMNS
    Q_DTYPE: gl.constexpr = gl.float8e4nv if PRODUCT == "fp8" or PRODUCT == "fp8_acc32" \
        else gl.float16
    Q_SHARED: gl.constexpr = gl.NVMMASharedLayout.get_default_for([COLUMNS, INDEX_DIM], Q_DTYPE)
    keys = gl.allocate_shared_memory(key_desc.dtype, [NUM_STAGES] + key_desc.block_type.shape,
                                     key_desc.layout)
    scales = gl.allocate_shared_memory(scale_desc.dtype,
                                       [NUM_STAGES] + scale_desc.block_type.shape,
                                       scale_desc.layout)
    q_smem0 = gl.allocate_shared_memory(Q_DTYPE, [NUM_PARTS, COLUMNS, INDEX_DIM], Q_SHARED)
    q_smem1 = gl.allocate_shared_memory(Q_DTYPE, [NUM_PARTS, COLUMNS, INDEX_DIM], Q_SHARED)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; then the TMA bytes
        mbarrier.init(empty.index(i), count=1)  # the tile's consumer (fp16_ss: converter)
    if PRODUCT == "fp16_ss":
        # The converter's FP16 key buffers and their scales, the consumers' `keys` / `scales`
        # (the consumer code is the same: stage n % NUM_STAGES there is buffer n % NUM_BUFFERS).
        K16_SHARED: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, INDEX_DIM],
                                                                        gl.float16)
        k16 = gl.allocate_shared_memory(gl.float16, [NUM_BUFFERS, BLOCK_N, INDEX_DIM],
                                        K16_SHARED)
        k16_scales = gl.allocate_shared_memory(scale_desc.dtype,
                                               [NUM_BUFFERS] + scale_desc.block_type.shape,
                                               scale_desc.layout)
        k16_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1],
                                              mbarrier.MBarrierLayout())
        k16_free = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1],
                                             mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_BUFFERS):
            mbarrier.init(k16_ready.index(i), count=1)  # the converter, after its barrier
            mbarrier.init(k16_free.index(i), count=1)  # the consumer of the tile
        gl.warp_specialize([
            (_consumer, (k16, k16_scales, q_smem0, k16_ready, k16_free, q_ptr, weights_ptr,
                         row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                         num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                         0, ROWS, HEADS_PAD, PRODUCT)),
            (_consumer, (k16, k16_scales, q_smem1, k16_ready, k16_free, q_ptr, weights_ptr,
                         row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                         num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                         1, ROWS, HEADS_PAD, PRODUCT)),
            (_converter, (keys, scales, ready, empty, k16, k16_scales, k16_ready, k16_free,
                          row_request_ptr, row_position_ptr, num_rows, num_positions,
                          tiles_per_row_tile, num_row_tiles, ROWS)),
            (_producer, (key_desc, scale_desc, keys, scales, ready, empty, block_table_ptr,
                         row_request_ptr, row_position_ptr, num_rows, num_positions,
                         block_size, tiles_per_row_tile, num_row_tiles, stride_table_r,
                         ROWS)),
        ], [4, 4, 1], [SS_CONSUMER_REGISTERS, CONVERTER_REGISTERS, SS_PRODUCER_REGISTERS])
    else:
        gl.warp_specialize([
            (_consumer, (keys, scales, q_smem0, ready, empty, q_ptr, weights_ptr,
                         row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                         num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                         0, ROWS, HEADS_PAD, PRODUCT)),
            (_consumer, (keys, scales, q_smem1, ready, empty, q_ptr, weights_ptr,
                         row_request_ptr, row_position_ptr, scores_ptr, num_rows,
                         num_positions, tiles_per_row_tile, num_row_tiles, stride_scores_row,
                         1, ROWS, HEADS_PAD, PRODUCT)),
            (_producer, (key_desc, scale_desc, keys, scales, ready, empty, block_table_ptr,
                         row_request_ptr, row_position_ptr, num_rows, num_positions,
                         block_size, tiles_per_row_tile, num_row_tiles, stride_table_r,
                         ROWS)),
        ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])


def shared_bytes(rows: int, heads_pad: int, num_stages: int, product: str) -> int:
    """Shared memory of a launch: the ring (keys and scales of a tile per stage), the two
    consumers' query copies and the barriers (and a KiB of the compiler's scratch)."""
    query_bytes = 1 if product in ("fp8", "fp8_acc32") else 2
    ring = num_stages * BLOCK_N.value * (INDEX_DIM.value + 4)
    # fp16_ss: the converter's FP16 buffers (codes and scales) and their two barriers each
    buffers = NUM_BUFFERS.value * (BLOCK_N.value * (2 * INDEX_DIM.value + 4) + 16) \
        if product == "fp16_ss" else 0
    return ring + buffers + 2 * rows * heads_pad * INDEX_DIM.value * query_bytes + 1024


def stages_that_fit(rows: int, heads_pad: int, product: str) -> int:
    """The deepest ring (<= MAX_STAGES) that fits beside the queries."""
    stages = MAX_STAGES
    while stages > 2 and shared_bytes(rows, heads_pad, stages, product) > MAX_SHARED_BYTES:
        stages -= 1
    return stages


def kernel_max_registers(product: str) -> int:
    """The launch's maxnreg: what each thread holds at entry, before setmaxnreg."""
    return SS_KERNEL_MAX_REGISTERS if product == "fp16_ss" else KERNEL_MAX_REGISTERS
