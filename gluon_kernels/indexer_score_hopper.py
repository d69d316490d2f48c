"""Indexer scores on Hopper (sm_90) in Gluon: TMA-fed key ring, a producer warp, two consumer
warpgroups taking alternate key tiles.

Contract: `atomk31.ops.indexer_score` (MODEL_SPEC §4.6 "Quantized evaluation", §9 #4), FP8
e4m3fn keys only: scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= p_i, -inf up to L. MXFP4
keys, e4m3fnuz and non-Hopper GPUs keep the Triton kernel (`why_not_hopper` says why).

Numbers (as the Triton kernel's CUDA default, atomk31/triton_kernels/indexer_score.py):
queries go through the keys' quantizer in one small Triton launch before the kernel
(`prepare_queries`: `fp8_group_quantize` of atomk31/triton_kernels/kv_write.py, bit-exact with
`quantize_index_keys`; no host values, so it captures in a CUDA graph; it replaced ~8 small
torch kernels, ~25 us of the 16K time in round 2); the product runs on the e4m3 codes and the
scales come after, since relu(s_q s_k x) = s_q s_k relu(x) for positive scales: score = s_k
sum_h (w_h s_q,h) relu(q_codes · k_codes), the per-head query scale folded into the weights.
PRODUCT (constexpr):
  "fp16" (exact; the default of graph-replayed launches on Hopper, `default_kernel` in
    atomk31/triton_kernels/indexer_score.py): the keys' FP8 codes become FP16 in registers (one
    F2FP per two values; every e4m3 value is an FP16 value) and are wgmma's A operand from
    registers (k_width 2); the queries' codes in FP16 sit in shared memory (B); fp32 sums.
  "fp8_acc32" (opt-in): keys straight from the TMA stage (A from shared memory) x FP8 query
    codes, one fresh wgmma per 32-wide K slice added into an fp32 accumulator (Hopper keeps
    ~14 bits of an FP8 wgmma's running sum: the Triton kernel's fp8_acc32 measured 4.2x the
    op's tolerance on the H200).
  "fp8" (opt-in): one K = 128 FP8 wgmma chain, no promotion (Triton's: 23x the tolerance).
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
    once by the warp's lanes, the next 32 prefetched) and two TMA loads into the stage: keys
    [1, 64, 128] fp8 (8 KiB) and their scales [1, 64] fp32 (256 B); ready/empty mbarriers.
  * Consumers (two warpgroups, 232 registers): tile n goes to consumer n % 2, so one's
    epilogue runs under the other's products. fp16: ld.shared of the codes, F2FP, then
    N = ROWS x HEADS_PAD columns of products in parts of <= 128 (m64n128k16 x 8); fp8: the
    products straight from the stage (fp8_acc32 in parts of 64 columns: its partial sums
    need a second accumulator; both fp8 modes take <= 4 rows of 32 heads a program). The
    tile's key scales are read into registers before its products, so the stage goes back
    right after the products finish, before the epilogue. "fp8" (one part) is pipelined in
    each consumer as well: tile n + 2's products are issued (wait_group 1) before tile n's
    epilogue, two accumulators in turn (the loop takes two tiles an iteration so that the one
    in flight keeps its registers: a copy would make ptxas serialize the wgmma). fp16 is
    not (its register A operand: ptxas serializes overlapping wgmma, C7512, and at 4 rows
    64 + 64 + 32 + 32 registers spill).
    Barriers (bar.sync of the consumer's 128 threads; the two consumers never wait on each
    other): two a tile, next to each other right after the wgmma wait, where the four warps
    arrive together anyway: one orders every warp's reads of the stage before the single
    thread's mbarrier.arrive (Gluon's arrive is one thread's), the other is the one Triton's
    barrier pass puts before the next shared-memory access after an arrive. None after the
    epilogue (round 2: one after the epilogue, where the warps drift apart, and one at the
    loop top). The producer steps a tile's page and offset (no division a tile).
    Epilogue: relu, x weight per column, sum of each row's HEADS_PAD columns (in-thread adds,
    then two butterflies in a quad), x key scale, -inf past each row's position, stored along
    keys (a quad's lane per row: 32-byte sectors). Each consumer keeps its own copy of the
    row tile's queries in shared memory (no cross-consumer hand-off when the row tile
    changes).
  * Positions past every row of a request in a program's range: -inf stores only.

Shared memory (ROWS 4, 32 heads, fp16): queries 2 consumers x 128 x 128 x 2 B = 64 KiB; the
ring NUM_STAGES x (8192 + 256) B, 16 stages = 132 KiB; barriers: 197 KiB of 227 KiB (ROWS 8:
queries 128 KiB, 11 stages; fp8 4 rows: queries 32 KiB, 16 stages). `shared_bytes` is the one
formula. 16 stages (12 in round 2): the pipelined consumers hold up to two stages each, and
the ring keeps ~100 KiB of keys in flight per SM (Little: 32 GB/s an SM x ~3 us).

Round 2 on the H200 (CUDA-graph ms, 16 requests x 4 rows, query prep included) and ncu at
128K (1.34 GHz locked SM clock): fp16 0.192 ms (ncu 213 us), fp8 0.154 (168 us), Triton
0.175 (228 us); 16K: fp16 0.056, fp8 0.047 vs Triton 0.031. What the SASS says:
  * ~2,300 / 1,815 SM cycles per consumer tile (fp16 / fp8, from ncu: 248 tiles an SM at
    128K, two consumers) against ~600 of work. The consumer's chain was serial: barrier,
    ready wait, A load (fp16), wgmma (fp16 512 tensor cycles, fp8 256, plus latency), wait,
    epilogue (~250 instructions: eight dependent 8-long FFMA chains, two shuffle round trips
    each, stores) with one warp of each consumer per scheduler to hide its latency, barrier,
    arrive. The other consumer fills the tensor cores only while one is in its epilogue, so
    a tile pair costs about wgmma + epilogue + barriers.
  * ncu's 40% "waiting at a CTA barrier" is mostly not the consumers: the CTA has 12 warps
    (the 1-warp producer partition is padded to a warpgroup), and the 3 padding warps sit at
    bar.sync 1 for the whole kernel: 25% of all warp cycles, i.e. ~2.4 of the 9.6 (fp16) /
    ~2.2 of the 8.8 (fp8) cycles per issued instruction. The rest (~25% of the consumer
    warps' cycles) was the per-tile barrier after the epilogue, where the four warps finish
    their stores at different times.
  * Per tile the instruction counts barely change (SASS below); what changes is where the
    waits are: the next fp8 tile's products run during the epilogue, the stage goes back
    before the epilogue, and no barrier waits on the slowest warp's stores.
Predicted (bench clock ~1.75 GHz: round 2's kernel 0.129 ms = ncu's 168 us x 1.34 / 1.75;
bytes 310 MB at 128K = 0.073 ms at 4.23 TB/s = 518 cycles an SM tile; query prep now one
~4 us launch instead of ~25 us):
  fp8: a consumer step costs about max(epilogue ~450-900, wgmma ~300) + ~100 cycles of wait
    and barriers, so the SM's tile period (two consumers) is ~300-500 cycles < 518 of bytes:
    memory-bound, 16 stages in flight; at 85-90% of copy bw 0.085 ms + 0.004 = ~0.09 ms at
    128K (round 2: 0.154), 1M 0.67-0.70 ms (round 2: 1.026), 16K ~0.02 ms (0.047).
  fp16 (4 rows, not pipelined): the barrier after the epilogue and the late release go, not
    the serial wgmma-then-epilogue chain: ~10-20% of the kernel, plus the prep: ~0.13-0.15 ms
    at 128K (round 2: 0.192; tensor floor 0.086-0.096), 1M ~1.0-1.1 ms (1.276), 16K ~0.03 ms.
  fp8_acc32 (not pipelined, as fp16): ~0.13-0.15 ms at 128K (0.183), 1M ~1.0 ms (1.223).
  If fp8 stays above ~0.10 ms at 128K, ncu should show it on the producer (93 instructions a
  tile, one warp: ~200-300 latency cycles a tile against 518) or on the ready waits.
  fp16 at the tensor floor needs the same overlap: its A operand through shared memory
  (wgmma SS, freeing 32 registers and avoiding ptxas's serialization), a next step.

Offline sm_90 compile (`compile_examples`, maxnreg 168; tests/gluon_kernels/
test_indexer_score_hopper.py checks it). Registers: the highest index a consumer uses (of 232);
"loop": SASS instructions of one consumer's tile loop a tile (fp8: its two-tile loop / 2),
"bar": bar.sync a tile in it (round 2: 2, one at the top and one after the epilogue); no
local-memory op in any tile loop:
  example (32 heads)  triton 3.6 (H200's): regs, stack, loop, bar   triton 3.9: same
  fp16 4 rows         221, 0, 330, 2 (round 2: 219, 0, 330)         177, 0, 368, 3
  fp16 8 rows         229, 8 B, 570, 2                              229, 16 B, 625, 3
  fp16 1 row          106, 0, 162, 2                                112, 0, 180, 3
  fp8_acc32 4 rows    229, 48 B, 509, 2                             218, 0, 525, 3
  fp8 4 rows          229, 48 B, 275, 2 (round 2: 181, 0, 275)      210, 0, 287, 3
(3.9's barrier pass adds one before the arrive next to ours: three in a row, the same point.)
A fp16 tile (4 rows, 3.6): 8 HGMMA 64x128x16, 34 LDS (the codes, 2 bytes each, and the
scales) + 32 F2FP, 64 FMNMX, 56 FFMA, 16 SHFL, 8 STG; fp8_acc32: 8 QGMMA 64x64x32 and 208
FADD; fp8: 4 QGMMA 64x128x32, 2 LDS. The stack bytes are used outside the tile loops.
Shared memory (metadata): 201,160 B (fp16 4 rows, 16 stages), 224,384 B (8 rows, 11),
152,008 B (1 row), 168,392 B (fp8 modes, 16 stages).

Limits (why_not_hopper): NVIDIA sm_90, e4m3fn keys, block_size a multiple of 64, TMA's rules
(16-byte aligned bases, 16-byte multiples for the block strides of values and scales, unit
last strides), H_I <= 128 heads; not under the interpreter. Gluon ships in
the triton wheel: this is the `triton` backend's kernel, chosen by the launcher's `kernel`.
For triton 3.6 (the H200's) and 3.9.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from atomk31.triton_kernels.kv_write import FP8_INDEX_AMAX_FLOOR, FP8_MAX, fp8_group_quantize

INDEX_DIM = gl.constexpr(128)  # d_I
BLOCK_N = gl.constexpr(64)  # keys per tile: one wgmma M of a warpgroup, inside one page
MAX_HEADS = 128  # HEADS_PAD: a row's columns in one product
# Query columns (rows x heads) per product and per program (two products at most): the fp16
# products 128 (64 accumulator registers a thread) and 256; fp8_acc32, whose partial sums need
# a second accumulator, 64 and 128; fp8 128 and 128 (the same rows as fp8_acc32).
MAX_COLUMNS = {"fp16": 256, "fp8_acc32": 128, "fp8": 128}
MAX_STAGES = 16
PRODUCTS = ("fp16", "fp8_acc32", "fp8")
PAGES_PER_READ = gl.constexpr(32)  # block-table entries the producer warp reads at once
# Registers per thread (setmaxnreg), as ptpc_fp8_hopper: consumers 232, producer 40;
# 40 x 128 + 2 x 232 x 128 = 64512 of 65536: a cap of 168 at entry.
CONSUMER_REGISTERS = gl.constexpr(232)
PRODUCER_REGISTERS = gl.constexpr(40)
KERNEL_MAX_REGISTERS = 168
MAX_SHARED_BYTES = 227 * 1024  # per block on sm_90
# Triton 3.9 renamed the TMA copy (3.6: async_copy_global_to_shared)
TMA_LOAD = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# The partition barrier (bar.sync): gl.thread_barrier on triton 3.6, gl.barrier on 3.9.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _program_range(program, num_programs, tiles_per_row_tile, num_row_tiles):
    """[begin, end) of the flattened (row tile, key tile) pairs this program owns: an even
    split (the counts differ by at most one; int64 products for long prefills)."""
    total = num_row_tiles.to(gl.int64) * tiles_per_row_tile
    begin = (program * total // num_programs).to(gl.int32)
    end = ((program + 1) * total // num_programs).to(gl.int32)
    return begin, end


@gluon.jit
def _num_segments(program, num_programs, tiles_per_row_tile, num_row_tiles):
    """Row tiles the program's range touches."""
    begin, end = _program_range(program, num_programs, tiles_per_row_tile, num_row_tiles)
    return gl.where(end > begin, (end - 1) // tiles_per_row_tile - begin // tiles_per_row_tile
                    + 1, 0)


@gluon.jit
def _segment(program, num_programs, tiles_per_row_tile, num_row_tiles, i_segment):
    """Row tile and key-tile range [t0, t1) of the program's segment i_segment (its range cut
    at row-tile boundaries)."""
    begin, end = _program_range(program, num_programs, tiles_per_row_tile, num_row_tiles)
    row_tile = begin // tiles_per_row_tile + i_segment
    t0 = gl.maximum(begin - row_tile * tiles_per_row_tile, 0)
    t1 = gl.minimum(end - row_tile * tiles_per_row_tile, tiles_per_row_tile)
    return row_tile, t0, t1


@gluon.jit
def _request_of_row(row_request_ptr, row_position_ptr, row0, j, num_rows, num_positions,
                    ROWS: gl.constexpr, LAYOUT: gl.constexpr):
    """For row j of the row tile at row0: whether it is the first row of its request in the
    tile (then its request's keys are streamed), the request, the mask of the tile's rows of
    that request and their largest position (clamped to L - 1). LAYOUT: a 1-D layout."""
    o_r = row0 + gl.arange(0, ROWS, layout=LAYOUT)
    m_r = o_r < num_rows
    b_request = gl.load(row_request_ptr + o_r, mask=m_r, other=-1)
    b_position = gl.minimum(gl.load(row_position_ptr + o_r, mask=m_r, other=-1).to(gl.int32),
                            num_positions - 1)
    request = gl.load(row_request_ptr + gl.minimum(row0 + j, num_rows - 1))
    o_j = gl.arange(0, ROWS, layout=LAYOUT)
    earlier = gl.sum(((o_j < j) & (b_request == request)).to(gl.int32), axis=0)
    is_first = (row0 + j < num_rows) & (earlier == 0)
    m_rows = b_request == request
    max_position = gl.max(gl.where(m_rows, b_position, -1), axis=0)
    return is_first, request, m_rows, b_position, max_position


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
def _stage_queries(q_ptr, q_smem, row0, num_rows, HEADS_PAD: gl.constexpr,
                   LAYOUT: gl.constexpr):
    """The row tile's query codes [ROWS x HEADS_PAD, 128] (host-padded heads) into this
    consumer's buffers, one per part of the product's columns; rows past Nq zero."""
    NUM_PARTS: gl.constexpr = q_smem.shape[0]
    COLUMNS: gl.constexpr = q_smem.shape[1]
    CHUNK: gl.constexpr = 32 if COLUMNS > 32 else COLUMNS  # vectors a load (<= 32 registers)
    o_d = gl.arange(0, INDEX_DIM, layout=gl.SliceLayout(0, LAYOUT))
    for part in gl.static_range(NUM_PARTS):
        for chunk in gl.static_range(COLUMNS // CHUNK):
            o_v = part * COLUMNS + chunk * CHUNK + gl.arange(0, CHUNK,
                                                             layout=gl.SliceLayout(1, LAYOUT))
            vector = row0.to(gl.int64) * HEADS_PAD + o_v
            codes = gl.load(q_ptr + vector[:, None] * INDEX_DIM + o_d[None, :],
                            mask=(row0 + o_v // HEADS_PAD < num_rows)[:, None]
                            & (o_d[None, :] >= 0), other=0.0)
            q_smem.index(part).slice(chunk * CHUNK, CHUNK, 0).store(codes)


@gluon.jit
def _tile_products(keys, q_smem, step, part: gl.constexpr, a_regs,
                   ACC: gl.constexpr, PRODUCT: gl.constexpr):
    """Part `part` of the tile's [64 keys, columns] products, fp32, finished (the modes that
    are not pipelined: fp16, fp8_acc32, two parts)."""
    COLUMNS: gl.constexpr = q_smem.shape[1]
    acc = gl.zeros([BLOCK_N, COLUMNS], gl.float32, ACC)
    q_t = q_smem.index(part).permute((1, 0))  # [128, columns]: K-major B
    if PRODUCT == "fp16":
        acc = warpgroup_mma(a_regs, q_t, acc, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        NUM_STAGES: gl.constexpr = keys.shape[0]
        a = keys.index(step % NUM_STAGES).reshape([BLOCK_N, INDEX_DIM])
        if PRODUCT == "fp8":
            acc = warpgroup_mma(a, q_t, acc, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:  # fp8_acc32: a fresh wgmma per 32-wide K slice, summed in fp32
            acc = warpgroup_mma(a.slice(0, 32, 1), q_t.slice(0, 32, 0), acc, use_acc=False,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            partial = gl.zeros_like(acc)
            for k in gl.static_range(1, INDEX_DIM // 32):
                # the partial's registers are free again after the add: its next wgmma's
                # destination (use_acc=False ignores their values)
                partial = warpgroup_mma(a.slice(k * 32, 32, 1), q_t.slice(k * 32, 32, 0),
                                        partial, use_acc=False, is_async=True)
                partial = warpgroup_mma_wait(num_outstanding=0, deps=(partial,))
                acc = acc + partial
    return acc


@gluon.jit
def _wait_tile(keys, scales, ready, n, A_LAYOUT: gl.constexpr, SCALE_LAYOUT: gl.constexpr,
               PRODUCT: gl.constexpr):
    """Wait for tile n's stage; its key scales into registers (read before the products, so
    the stage can be released as soon as they finish) and, for fp16, the keys' codes as the
    FP16 A operand (0 otherwise: the fp8 products read the stage)."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    stage = n % NUM_STAGES
    mbarrier.wait(ready.index(stage), (n // NUM_STAGES) & 1)
    key_scale = scales.index(stage).reshape([BLOCK_N]).load(SCALE_LAYOUT)
    if PRODUCT == "fp16":
        a_regs = keys.index(stage).reshape([BLOCK_N, INDEX_DIM]).load(A_LAYOUT).to(gl.float16)
    else:
        a_regs = 0
    return key_scale, a_regs


@gluon.jit
def _start_products(keys, q_smem, n, a_regs, ACC: gl.constexpr, PRODUCT: gl.constexpr):
    """Tile n's [64 keys, columns] products (one part; "fp16" or "fp8") issued, not waited
    for: they run on the tensor cores under the previous tile's epilogue."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    COLUMNS: gl.constexpr = q_smem.shape[1]
    acc = gl.zeros([BLOCK_N, COLUMNS], gl.float32, ACC)
    q_t = q_smem.index(0).permute((1, 0))
    if PRODUCT == "fp16":
        acc = warpgroup_mma(a_regs, q_t, acc, use_acc=False, is_async=True)
    else:
        acc = warpgroup_mma(keys.index(n % NUM_STAGES).reshape([BLOCK_N, INDEX_DIM]), q_t, acc,
                            use_acc=False, is_async=True)
    return acc


@gluon.jit
def _release(empty, n):
    """Tile n's stage back to the producer, right after a wgmma wait (where the warpgroup's
    warps arrive together: the wgmma finishes for all four at once). The first barrier
    orders every warp's reads of the stage (scales and fp16 codes by ld.shared; the wgmma's)
    before the one thread's arrive; the second is the one Triton's barrier pass would put
    before the next shared-memory access after an arrive (it counts the arrive as a write
    to any buffer), placed here where it costs the least."""
    NUM_STAGES: gl.constexpr = empty.shape[0]
    cta_barrier()
    mbarrier.arrive(empty.index(n % NUM_STAGES), count=1)
    cta_barrier()


@gluon.jit
def _part_rows(weights_ptr, row_request_ptr, row_position_ptr, row0, part, request, num_rows,
               num_positions, R: gl.constexpr, HEADS_PAD: gl.constexpr,
               COLUMN_LAYOUT: gl.constexpr, ROW_LAYOUT: gl.constexpr):
    """Part `part` of the product (R rows x HEADS_PAD columns): its columns' weights (x query
    scales, 0 past Nq), which of its rows belong to `request`, and their positions."""
    o_c = part * R * HEADS_PAD + gl.arange(0, R * HEADS_PAD, layout=COLUMN_LAYOUT)
    weights = gl.load(weights_ptr + row0.to(gl.int64) * HEADS_PAD + o_c,
                      mask=row0 + o_c // HEADS_PAD < num_rows, other=0.0)
    rows = row0 + part * R + gl.arange(0, R, layout=ROW_LAYOUT)
    m_r = rows < num_rows
    m_rows = gl.load(row_request_ptr + rows, mask=m_r, other=-1) == request
    positions = gl.minimum(gl.load(row_position_ptr + rows, mask=m_r, other=-1).to(gl.int32),
                           num_positions - 1)
    return weights, m_rows, positions


@gluon.jit
def _store_tile_scores(acc, weights, key_scale, scores_ptr, stride_scores_row, row0,
                       part: gl.constexpr, tile, m_rows_part, positions_part, num_positions,
                       HEADS_PAD: gl.constexpr):
    """acc [64 keys, R x HEADS_PAD] -> key scale x sum_h w_h relu(acc_h) per (key, row),
    -inf past each row's position, stored for the rows of the request up to L."""
    COLUMNS: gl.constexpr = acc.shape[1]
    R: gl.constexpr = COLUMNS // HEADS_PAD
    x = gl.maximum(acc, 0.0) * weights[None, :]
    s = gl.sum(gl.reshape(x, [BLOCK_N, R, HEADS_PAD]), axis=2)  # [64, R]
    S_LAYOUT: gl.constexpr = s.type.layout
    o_s = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_LAYOUT))
    o_r = part * R + gl.arange(0, R, layout=gl.SliceLayout(0, S_LAYOUT))
    s = gl.where(o_s[:, None] > positions_part[None, :], float("-inf"), s * key_scale[:, None])
    p_scores = scores_ptr + (row0 + o_r)[None, :].to(gl.int64) * stride_scores_row + o_s[:, None]
    gl.store(p_scores, s, mask=m_rows_part[None, :] & (o_s < num_positions)[:, None])


@gluon.jit
def _next_tile(acc, key_scale, keys, scales, ready, empty, q_smem, step, tile_index, w0,
               scores_ptr, stride_scores_row, row0, t0, m0, p0, num_positions,
               HEADS_PAD: gl.constexpr, ACC: gl.constexpr, A_LAYOUT: gl.constexpr,
               SCALE_LAYOUT: gl.constexpr, PRODUCT: gl.constexpr):
    """One pipelined step: tile n + 2 starts (its stage awaited, its scales read, its
    products issued); tile n = step + tile_index's products (issued a step earlier) finish
    and its stage goes back; tile n's epilogue runs under tile n + 2's products. The wait
    for tile n comes after tile n + 2's issue (wait_group 1) so that ptxas keeps the issue
    ahead of the epilogue. Returns tile n + 2's (acc, scales)."""
    n = step + tile_index
    next_scale, a_regs = _wait_tile(keys, scales, ready, n + 2, A_LAYOUT, SCALE_LAYOUT,
                                    PRODUCT)
    next_acc = _start_products(keys, q_smem, n + 2, a_regs, ACC, PRODUCT)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    _release(empty, n)
    _store_tile_scores(acc, w0, key_scale, scores_ptr, stride_scores_row, row0, 0,
                       t0 + tile_index, m0, p0, num_positions, HEADS_PAD)
    return next_acc, next_scale


@gluon.jit
def _last_tile(acc, key_scale, empty, n, w0, scores_ptr, stride_scores_row, row0, tile, m0,
               p0, num_positions, HEADS_PAD: gl.constexpr):
    """The consumer's last tile of a request's run: products finish, stage back, epilogue."""
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _release(empty, n)
    _store_tile_scores(acc, w0, key_scale, scores_ptr, stride_scores_row, row0, 0, tile, m0,
                       p0, num_positions, HEADS_PAD)


@gluon.jit
def _consumer(keys, scales, q_smem, ready, empty, q_ptr, weights_ptr, row_request_ptr,
              row_position_ptr, scores_ptr, num_rows, num_positions, tiles_per_row_tile,
              num_row_tiles, stride_scores_row, CONSUMER: gl.constexpr, ROWS: gl.constexpr,
              HEADS_PAD: gl.constexpr, PRODUCT: gl.constexpr):
    """Warpgroup CONSUMER (0 or 1): tiles n of the program's sequence with n % 2 == CONSUMER;
    consumer 0 also writes the -inf columns past every row of a request."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    NUM_PARTS: gl.constexpr = q_smem.shape[0]
    COLUMNS: gl.constexpr = q_smem.shape[1]
    R: gl.constexpr = COLUMNS // HEADS_PAD  # rows per part
    K_INSTR: gl.constexpr = 16 if PRODUCT == "fp16" else 32
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, COLUMNS, K_INSTR])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    Q_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    ROW_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    # The layout of a tile's [64 keys, R rows] sums (the head sum's result), for the rows'
    # masks and positions (dead code: only its type is used).
    S_LAYOUT: gl.constexpr = gl.sum(gl.reshape(gl.zeros([BLOCK_N, COLUMNS], gl.float32, ACC),
                                               [BLOCK_N, R, HEADS_PAD]), axis=2).type.layout
    PART_LAYOUT: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    SCALE_LAYOUT: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    # The next tile's products issued before this tile's epilogue (two accumulators): fp8 of
    # one part. Not fp16: its A operand in registers makes ptxas serialize the wgmma once two
    # tiles' products overlap (C7512, "insufficient register resources", even at 1 row), and
    # at 4 rows 64 + 64 accumulator, 32 A and 32 weight registers a thread spill.
    PIPELINED: gl.constexpr = NUM_PARTS == 1 and PRODUCT == "fp8"
    TAIL_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [4, 1], [0, 1])
    program = gl.program_id(0)
    num_programs = gl.num_programs(0)
    step = 0
    for i_segment in range(_num_segments(program, num_programs, tiles_per_row_tile,
                                         num_row_tiles)):
        row_tile, t0, t1 = _segment(program, num_programs, tiles_per_row_tile, num_row_tiles,
                                    i_segment)
        row0 = row_tile * ROWS
        # This consumer's copy of the row tile's queries (its last products have finished).
        cta_barrier()
        _stage_queries(q_ptr, q_smem, row0, num_rows, HEADS_PAD, Q_LAYOUT)
        fence_async_shared()
        cta_barrier()
        for j in range(ROWS):
            is_first, request, m_rows, b_position, max_position = _request_of_row(
                row_request_ptr, row_position_ptr, row0, j, num_rows, num_positions, ROWS,
                ROW_LAYOUT)
            if is_first:
                t_end = gl.minimum(t1, gl.cdiv(max_position + 1, BLOCK_N))
                count = gl.maximum(t_end - t0, 0)
                # Per part (at most two): its columns' weights, its rows' mask and positions.
                w0, m0, p0 = _part_rows(weights_ptr, row_request_ptr, row_position_ptr, row0,
                                        0, request, num_rows, num_positions, R, HEADS_PAD,
                                        gl.SliceLayout(0, ACC), PART_LAYOUT)
                w1, m1, p1 = _part_rows(weights_ptr, row_request_ptr, row_position_ptr, row0,
                                        NUM_PARTS - 1, request, num_rows, num_positions, R,
                                        HEADS_PAD, gl.SliceLayout(0, ACC), PART_LAYOUT)
                first = (CONSUMER + 2 - step % 2) % 2  # this consumer's first tile
                if PIPELINED:
                    if count > first:
                        last = first + (count - 1 - first) // 2 * 2  # its last tile
                        key_scale, a_regs = _wait_tile(keys, scales, ready, step + first,
                                                       A_LAYOUT, SCALE_LAYOUT, PRODUCT)
                        acc = _start_products(keys, q_smem, step + first, a_regs, ACC, PRODUCT)
                        # (else Triton's barrier pass puts one at the top of the loop below:
                        # two mbarrier waits in a row need one between them)
                        cta_barrier()
                        # Two tiles an iteration, so that the accumulator in flight at the
                        # back edge keeps its registers (a copy would serialize the wgmma).
                        for tile_index in range(first, last - 2, 4):
                            acc_b, scale_b = _next_tile(
                                acc, key_scale, keys, scales, ready, empty, q_smem, step,
                                tile_index, w0, scores_ptr, stride_scores_row, row0, t0, m0, p0,
                                num_positions, HEADS_PAD, ACC, A_LAYOUT, SCALE_LAYOUT, PRODUCT)
                            acc, key_scale = _next_tile(
                                acc_b, scale_b, keys, scales, ready, empty, q_smem, step,
                                tile_index + 2, w0, scores_ptr, stride_scores_row, row0, t0, m0,
                                p0, num_positions, HEADS_PAD, ACC, A_LAYOUT, SCALE_LAYOUT,
                                PRODUCT)
                        if (last - first) // 2 % 2 == 1:
                            acc_b, scale_b = _next_tile(
                                acc, key_scale, keys, scales, ready, empty, q_smem, step,
                                last - 2, w0, scores_ptr, stride_scores_row, row0, t0, m0, p0,
                                num_positions, HEADS_PAD, ACC, A_LAYOUT, SCALE_LAYOUT, PRODUCT)
                            _last_tile(acc_b, scale_b, empty, step + last, w0, scores_ptr,
                                       stride_scores_row, row0, t0 + last, m0, p0,
                                       num_positions, HEADS_PAD)
                        else:
                            _last_tile(acc, key_scale, empty, step + last, w0, scores_ptr,
                                       stride_scores_row, row0, t0 + last, m0, p0,
                                       num_positions, HEADS_PAD)
                else:
                    for tile_index in range(first, count, 2):
                        n = step + tile_index
                        tile = t0 + tile_index
                        key_scale, a_regs = _wait_tile(keys, scales, ready, n, A_LAYOUT,
                                                       SCALE_LAYOUT, PRODUCT)
                        acc = _tile_products(keys, q_smem, n, 0, a_regs, ACC, PRODUCT)
                        if NUM_PARTS == 1:
                            _release(empty, n)
                        _store_tile_scores(acc, w0, key_scale, scores_ptr, stride_scores_row,
                                           row0, 0, tile, m0, p0, num_positions, HEADS_PAD)
                        if NUM_PARTS == 2:
                            acc = _tile_products(keys, q_smem, n, 1, a_regs, ACC, PRODUCT)
                            _release(empty, n)
                            _store_tile_scores(acc, w1, key_scale, scores_ptr,
                                               stride_scores_row, row0, 1, tile, m1, p1,
                                               num_positions, HEADS_PAD)
                step += count
                if CONSUMER == 0:
                    # Positions of the range past every row of this request: -inf, no keys.
                    chunk_end = gl.minimum(t1 * BLOCK_N, num_positions)
                    o_r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(0, TAIL_LAYOUT))
                    m_tail_rows = gl.convert_layout(m_rows, gl.SliceLayout(0, TAIL_LAYOUT))
                    for start in range(gl.maximum(t_end, t0) * BLOCK_N, chunk_end, BLOCK_N):
                        o_s = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, TAIL_LAYOUT))
                        gl.store(scores_ptr + o_r[None, :].to(gl.int64) * stride_scores_row
                                 + o_s[:, None],
                                 gl.full([BLOCK_N, ROWS], float("-inf"), gl.float32, TAIL_LAYOUT),
                                 mask=m_tail_rows[None, :] & (o_s < chunk_end)[:, None])


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
    Q_DTYPE: gl.constexpr = gl.float16 if PRODUCT == "fp16" else gl.float8e4nv
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
        mbarrier.init(empty.index(i), count=1)  # the consumer of the tile
    gl.warp_specialize([
        (_consumer, (keys, scales, q_smem0, ready, empty, q_ptr, weights_ptr, row_request_ptr,
                     row_position_ptr, scores_ptr, num_rows, num_positions, tiles_per_row_tile,
                     num_row_tiles, stride_scores_row, 0, ROWS, HEADS_PAD, PRODUCT)),
        (_consumer, (keys, scales, q_smem1, ready, empty, q_ptr, weights_ptr, row_request_ptr,
                     row_position_ptr, scores_ptr, num_rows, num_positions, tiles_per_row_tile,
                     num_row_tiles, stride_scores_row, 1, ROWS, HEADS_PAD, PRODUCT)),
        (_producer, (key_desc, scale_desc, keys, scales, ready, empty, block_table_ptr,
                     row_request_ptr, row_position_ptr, num_rows, num_positions, block_size,
                     tiles_per_row_tile, num_row_tiles, stride_table_r, ROWS)),
    ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])


def shared_bytes(rows: int, heads_pad: int, num_stages: int, product: str) -> int:
    """Shared memory of a launch: the ring (keys and scales of a tile per stage), the two
    consumers' query copies and the barriers (and a KiB of the compiler's scratch)."""
    query_bytes = 2 if product == "fp16" else 1
    ring = num_stages * BLOCK_N.value * (INDEX_DIM.value + 4)
    return ring + 2 * rows * heads_pad * INDEX_DIM.value * query_bytes + 1024


def stages_that_fit(rows: int, heads_pad: int, product: str) -> int:
    """The deepest ring (<= MAX_STAGES) that fits beside the queries."""
    stages = MAX_STAGES
    while stages > 2 and shared_bytes(rows, heads_pad, stages, product) > MAX_SHARED_BYTES:
        stages -= 1
    return stages


def heads_padded(num_heads: int) -> int:
    """Query columns per row: a power of two, at least wgmma's N of 8."""
    return max(8, triton.next_power_of_2(num_heads))


def why_not_hopper(q: torch.Tensor, index_values: torch.Tensor, index_scales: torch.Tensor,
                   index_format: str, block_size: int, interpreted: bool = False) -> str | None:
    """None when the kernel can score these inputs, else why not (the launcher then takes the
    Triton kernel): Hopper, e4m3fn keys in 64-key TMA boxes, TMA's stride rules."""
    if interpreted:
        return "the Gluon kernel does not run under Triton's interpreter"
    if not (q.is_cuda and index_values.is_cuda) or torch.version.hip is not None:
        return f"needs an NVIDIA Hopper GPU, got a {q.device.type} tensor"
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        major, minor = torch.cuda.get_device_capability(q.device)
        return f"needs sm_90 (wgmma, TMA, setmaxnreg), got sm_{major}{minor}"
    if index_format != "fp8" or index_values.dtype != torch.float8_e4m3fn:
        return f"takes e4m3fn FP8 keys, got {index_format} {index_values.dtype}"
    if heads_padded(q.shape[1]) > MAX_HEADS:
        return f"takes up to {MAX_HEADS} heads, got H_I={q.shape[1]}"
    if block_size % BLOCK_N.value:
        return f"needs block_size a multiple of {BLOCK_N.value} (a tile in one page), got " \
               f"{block_size}"
    values, scales = index_values, index_scales
    if values.dim() != 3 or values.stride(2) != 1 or scales.dim() != 2 or \
            scales.stride(1) != 1 or scales.dtype != torch.float32:
        return f"needs [blocks, block_size, 128] values and [blocks, block_size] fp32 scales " \
               f"with unit last strides, got strides {values.stride()} and {scales.dtype} " \
               f"{scales.stride()}"
    if values.data_ptr() % 16 or scales.data_ptr() % 16 or values.stride(0) % 16 or \
            values.stride(1) % 16 or (scales.stride(0) * 4) % 16:
        return f"TMA needs 16-byte aligned bases and strides: values at " \
               f"{values.data_ptr() % 16} mod 16 with strides {values.stride()[:2]} B, scales " \
               f"at {scales.data_ptr() % 16} mod 16 with block stride {scales.stride(0) * 4} B"
    return None


@functools.lru_cache(maxsize=None)
def _shared_layout(block_shape: tuple[int, ...], is_fp8: bool) -> gl.NVMMASharedLayout:
    """The shared layout of a TMA box (~7 us on the host: built once)."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape),
                                                gl.float8e4nv if is_fp8 else gl.float32)


def _descriptors(index_values: torch.Tensor, index_scales: torch.Tensor) -> tuple:
    """TMA descriptors of the key values [blocks, block_size, 128] in [1, 64, 128] boxes and
    of their scales [blocks, block_size] in [1, 64] boxes (any 16-byte block strides: the
    engine's pages are views into packed block rows, atomk31/cache/layout.py)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    key_box = [1, BLOCK_N.value, INDEX_DIM.value]
    scale_box = [1, BLOCK_N.value]
    return (TensorDescriptor.from_tensor(index_values, key_box,
                                         _shared_layout(tuple(key_box), True)),
            TensorDescriptor.from_tensor(index_scales, scale_box,
                                         _shared_layout(tuple(scale_box), False)))


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count



@triton.jit
def query_prep_kernel(
    q_ptr, head_weights_ptr, codes_ptr, weights_ptr,
    num_heads, stride_q_row, stride_q_head, stride_q_d, stride_w_row, stride_w_head,
    HEADS_PAD: tl.constexpr, FP8_MAX_VALUE: tl.constexpr, MIN_AMAX: tl.constexpr,
):
    """One query row (a program): its heads through the keys' quantizer (`fp8_group_quantize`,
    bit-exact with `quantize_index_keys`), codes [HEADS_PAD, 128] in the codes' dtype (FP16 or
    e4m3fn: exact either way) and the weights x query scales [HEADS_PAD] fp32; padded heads
    get zero codes and zero weights."""
    row = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, HEADS_PAD)
    o_d = tl.arange(0, 128)
    m_h = o_h < num_heads
    x = tl.load(q_ptr + row * stride_q_row + o_h[:, None] * stride_q_head
                + o_d[None, :] * stride_q_d, mask=m_h[:, None], other=0.0).to(tl.float32)
    values, scale = fp8_group_quantize(x, FP8_MAX_VALUE, MIN_AMAX)
    w = tl.load(head_weights_ptr + row * stride_w_row + o_h * stride_w_head, mask=m_h,
                other=0.0).to(tl.float32)
    tl.store(codes_ptr + (row * HEADS_PAD + o_h[:, None]) * 128 + o_d[None, :],
             values.to(codes_ptr.dtype.element_ty))
    tl.store(weights_ptr + row * HEADS_PAD + o_h, tl.where(m_h, w * scale, 0.0))


def prepare_queries(q: torch.Tensor, head_weights: torch.Tensor, heads_pad: int,
                    product: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's query operands in one launch (CUDA-graph friendly: no host values):
    codes [Nq, heads_pad, 128] (FP16 for "fp16", else e4m3fn), bit-exact with
    `quantize_index_keys(q, "fp8", "e4m3fn")`, and the head weights x query scales
    [Nq, heads_pad] fp32 (zero past H_I). A Triton kernel: runs under the interpreter too."""
    num_rows, num_heads = q.shape[0], q.shape[1]
    code_dtype = torch.float16 if product == "fp16" else torch.float8_e4m3fn
    codes = torch.empty(num_rows, heads_pad, INDEX_DIM.value, dtype=code_dtype, device=q.device)
    weights = torch.empty(num_rows, heads_pad, dtype=torch.float32, device=q.device)
    if num_rows:
        query_prep_kernel[(num_rows,)](
            q, head_weights, codes, weights, num_heads, q.stride(0), q.stride(1), q.stride(2),
            head_weights.stride(0), head_weights.stride(1), HEADS_PAD=heads_pad,
            FP8_MAX_VALUE=FP8_MAX[torch.float8_e4m3fn], MIN_AMAX=FP8_INDEX_AMAX_FLOOR,
            num_warps=4)
    return codes, weights


def rows_per_program(num_rows: int, num_requests: int, heads_pad: int, product: str) -> int:
    """About the rows of one request (host-known Nq / N, as the Triton launcher), a power of
    two, at most MAX_COLUMNS[product] / HEADS_PAD."""
    rows_per_request = triton.cdiv(num_rows, max(1, num_requests))
    return max(1, min(triton.next_power_of_2(rows_per_request),
                      MAX_COLUMNS[product] // heads_pad))


def indexer_score_hopper(
    q: torch.Tensor,
    head_weights: torch.Tensor,
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    num_positions: int | None = None,
    product: str = "fp16",
) -> torch.Tensor:
    """Indexer scores [Nq, L] fp32, L = max(row_position) + 1 or `num_positions` (contract:
    ops/indexer_score; arguments as `indexer_score_triton`'s). product: "fp16" (exact), or
    the opt-in "fp8_acc32" / "fp8" (module docstring: outside the op's tolerance).
    ValueError when `why_not_hopper` names a reason."""
    if product not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    reason = why_not_hopper(q, index_values, index_scales, index_format, block_size)
    if reason is not None:
        raise ValueError(f"indexer_score_hopper: {reason}")
    num_rows = row_request.shape[0]
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != INDEX_DIM.value:
        raise ValueError(f"q must be [Nq={num_rows}, H_I, {INDEX_DIM.value}], got {list(q.shape)}")
    num_heads = q.shape[1]
    if tuple(head_weights.shape) != (num_rows, num_heads):
        raise ValueError(f"head_weights must be [Nq={num_rows}, H_I={num_heads}], got "
                         f"{list(head_weights.shape)}")
    if index_values.shape[1] != block_size:
        raise ValueError(f"index cache pages hold {index_values.shape[1]} tokens but block_size "
                         f"is {block_size}")
    if num_positions is None:
        num_positions = int(row_position.max()) + 1 if num_rows else 0  # a device sync
    elif not 0 <= num_positions < 2**31:
        raise ValueError(f"num_positions must be in [0, 2^31), got {num_positions}")
    scores = torch.empty(num_rows, num_positions, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_positions == 0:
        return scores

    heads_pad = heads_padded(num_heads)
    q_codes, weights = prepare_queries(q, head_weights, heads_pad, product)
    rows = rows_per_program(num_rows, block_table.shape[0], heads_pad, product)
    num_row_tiles = triton.cdiv(num_rows, rows)
    tiles_per_row_tile = triton.cdiv(num_positions, BLOCK_N.value)
    grid = min(sm_count(q.device.index or 0), num_row_tiles * tiles_per_row_tile)
    key_desc, scale_desc = _descriptors(index_values, index_scales)
    indexer_score_hopper_kernel[(grid,)](
        key_desc, scale_desc, q_codes, weights, block_table, row_request, row_position, scores,
        num_rows, num_positions, block_size, tiles_per_row_tile, num_row_tiles,
        block_table.stride(0), scores.stride(0),
        ROWS=rows, HEADS_PAD=heads_pad, NUM_STAGES=stages_that_fit(rows, heads_pad, product),
        PRODUCT=product, num_warps=4, maxnreg=KERNEL_MAX_REGISTERS)
    return scores


def descriptor_type(dtype_name: str, block_shape: list[int], is_fp8: bool) -> str:
    """The signature type of a host TMA descriptor argument (offline compiles)."""
    return f"tensordesc<{dtype_name}{block_shape},{_shared_layout(tuple(block_shape), is_fp8)!r}>"


def compile_examples(target: object) -> list:
    """What the bench's launches compile on sm_90 (K3.1's 32 heads; 4 verification rows in
    each product mode, 8 rows and 1 row exact), for offline compiles (gluon_kernels/compile.py;
    the launch adds maxnreg = KERNEL_MAX_REGISTERS); none off sm_90."""
    from gluon_kernels.compile import CompileExample

    if getattr(target, "arch", None) != "sm90":
        return []
    signature = {
        "key_desc": descriptor_type("fp8e4nv", [1, BLOCK_N.value, INDEX_DIM.value], True),
        "scale_desc": descriptor_type("fp32", [1, BLOCK_N.value], False),
        "q_ptr": "*fp16", "weights_ptr": "*fp32", "block_table_ptr": "*i32",
        "row_request_ptr": "*i32", "row_position_ptr": "*i64", "scores_ptr": "*fp32",
        "num_rows": "i32", "num_positions": "i32", "block_size": "i32",
        "tiles_per_row_tile": "i32", "num_row_tiles": "i32", "stride_table_r": "i32",
        "stride_scores_row": "i32", "ROWS": "constexpr", "HEADS_PAD": "constexpr",
        "NUM_STAGES": "constexpr", "PRODUCT": "constexpr"}
    examples = []
    for rows, product in ((4, "fp16"), (8, "fp16"), (1, "fp16"), (4, "fp8_acc32"), (4, "fp8")):
        constexprs = {"ROWS": rows, "HEADS_PAD": 32, "PRODUCT": product,
                      "NUM_STAGES": stages_that_fit(rows, 32, product)}
        types = signature if product == "fp16" else {**signature, "q_ptr": "*fp8e4nv"}
        examples.append(CompileExample(f"indexer_score_hopper[{product} rows{rows}]",
                                       indexer_score_hopper_kernel, types, constexprs,
                                       num_warps=4))
    return examples
