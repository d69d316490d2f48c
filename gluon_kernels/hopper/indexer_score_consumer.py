"""The consumer partition of the Hopper Gluon indexer (indexer_score_kernel.py, whose docstring
gives the design): a warpgroup that takes every other tile of its program's sequence from the
ring and turns it into scores.

Per tile: wait for the stage; the key scales and the keys' codes (as wgmma's FP16 A operand)
into registers; the [64 keys, ROWS x HEADS_PAD] products against this consumer's own copy of
the row tile's queries in shared memory; the stage back to the producer right after the wgmma
wait (`_release`), before the epilogue; then the epilogue (relu, x the weights, a sum per row,
x the key scale, -inf past each row's position, stored along keys).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from gluon_kernels.hopper.indexer_score_work_split import (
    BLOCK_N, INDEX_DIM, _num_segments, _request_of_row, _segment,
)

# The partition barrier (bar.sync): gl.thread_barrier on triton 3.6, gl.barrier on 3.9.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


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
def _tile_products(q_smem, part: gl.constexpr, a_regs, ACC: gl.constexpr):
    """Part `part` of the tile's [64 keys, columns] products, fp32, finished."""
    COLUMNS: gl.constexpr = q_smem.shape[1]
    acc = gl.zeros([BLOCK_N, COLUMNS], gl.float32, ACC)
    q_t = q_smem.index(part).permute((1, 0))  # [128, columns]: K-major B
    acc = warpgroup_mma(a_regs, q_t, acc, use_acc=False, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _wait_tile(keys, scales, ready, n, A_LAYOUT: gl.constexpr, SCALE_LAYOUT: gl.constexpr):
    """Wait for tile n's stage; its key scales and the keys' codes as the FP16 A operand into
    registers (read before the products, so the stage can be released as soon as they
    finish)."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    stage = n % NUM_STAGES
    mbarrier.wait(ready.index(stage), (n // NUM_STAGES) & 1)
    key_scale = scales.index(stage).reshape([BLOCK_N]).load(SCALE_LAYOUT)
    a_regs = keys.index(stage).reshape([BLOCK_N, INDEX_DIM]).load(A_LAYOUT).to(gl.float16)
    return key_scale, a_regs


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
def _consumer(keys, scales, q_smem, ready, empty, q_ptr, weights_ptr, row_request_ptr,
              row_position_ptr, scores_ptr, num_rows, num_positions, tiles_per_row_tile,
              num_row_tiles, stride_scores_row, CONSUMER: gl.constexpr, ROWS: gl.constexpr,
              HEADS_PAD: gl.constexpr):
    """Warpgroup CONSUMER (0 or 1): tiles n of the program's sequence with n % 2 == CONSUMER;
    consumer 0 also writes the -inf columns past every row of a request."""
    NUM_PARTS: gl.constexpr = q_smem.shape[0]
    COLUMNS: gl.constexpr = q_smem.shape[1]
    R: gl.constexpr = COLUMNS // HEADS_PAD  # rows per part
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, COLUMNS, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    Q_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    ROW_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    # The layout of a tile's [64 keys, R rows] sums (the head sum's result), for the rows'
    # masks and positions (dead code: only its type is used).
    S_LAYOUT: gl.constexpr = gl.sum(gl.reshape(gl.zeros([BLOCK_N, COLUMNS], gl.float32, ACC),
                                               [BLOCK_N, R, HEADS_PAD]), axis=2).type.layout
    PART_LAYOUT: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    SCALE_LAYOUT: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
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
                for tile_index in range(first, count, 2):
                    n = step + tile_index
                    tile = t0 + tile_index
                    key_scale, a_regs = _wait_tile(keys, scales, ready, n, A_LAYOUT,
                                                   SCALE_LAYOUT)
                    acc = _tile_products(q_smem, 0, a_regs, ACC)
                    if NUM_PARTS == 1:
                        _release(empty, n)
                    _store_tile_scores(acc, w0, key_scale, scores_ptr, stride_scores_row,
                                       row0, 0, tile, m0, p0, num_positions, HEADS_PAD)
                    if NUM_PARTS == 2:
                        acc = _tile_products(q_smem, 1, a_regs, ACC)
                        _release(empty, n)
                        _store_tile_scores(acc, w1, key_scale, scores_ptr, stride_scores_row,
                                           row0, 1, tile, m1, p1, num_positions, HEADS_PAD)
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
