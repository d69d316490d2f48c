"""The converter partition of the Hopper Gluon indexer's "fp16_ss" products
(gluon_kernels/indexer_score_hopper.py, whose docstring gives the design): one warpgroup that
turns every tile of its program's sequence from the TMA ring's FP8 codes into an FP16 shared
buffer that the consumers' wgmma read as their A operand (SS wgmma: both operands in shared
memory), as sparse_mla_hopper_ws's key producer does for the MLA latent.

Per tile n (the sequence the producer and both consumers walk, `_run_count`):
  1. wait for ring stage n % NUM_STAGES (`ready`, phase (n // NUM_STAGES) & 1: the producer's
     expect and both TMA loads);
  2. the stage's codes [64, 128] e4m3 (64 a thread, four 16-byte ld.shared) and key scales
     into registers; the codes to FP16 (F2FP: every e4m3 value is an FP16 value, exact);
  3. wait for FP16 buffer n % NUM_BUFFERS (`k16_free`, phase ((n // NUM_BUFFERS) & 1) ^ 1: a
     fresh mbarrier counts as having completed the phase before phase 0, so the first
     NUM_BUFFERS tiles pass; later ones wait for the consumer of tile n - NUM_BUFFERS);
  4. the FP16 codes (eight 16-byte st.shared a thread) and the scales into the buffer;
  5. fence.proxy.async (the consumers' wgmma read the buffer through the async proxy), the
     warpgroup's barrier (every thread's ring reads and buffer writes are done), then one
     thread arrives on `empty` (the stage back to the producer) and on `k16_ready` (count 1
     each: the consumer waits on phase (n // NUM_BUFFERS) & 1).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from gluon_kernels.indexer_score_hopper_consumer import cta_barrier
from gluon_kernels.indexer_score_hopper_work_split import (
    BLOCK_N, INDEX_DIM, _num_segments, _request_of_row, _segment,
)


@gluon.jit
def _convert_tile(keys, scales, ready, empty, k16, k16_scales, k16_ready, k16_free, n,
                  CODE_LAYOUT: gl.constexpr, SCALE_LAYOUT: gl.constexpr):
    """Tile n: ring stage -> registers -> FP16 buffer, then the stage back and the buffer
    announced (steps 1-5 of the module docstring)."""
    NUM_STAGES: gl.constexpr = keys.shape[0]
    NUM_BUFFERS: gl.constexpr = k16.shape[0]
    stage = n % NUM_STAGES
    buffer = n % NUM_BUFFERS
    mbarrier.wait(ready.index(stage), (n // NUM_STAGES) & 1)
    codes = keys.index(stage).reshape([BLOCK_N, INDEX_DIM]).load(CODE_LAYOUT)
    key_scale = scales.index(stage).reshape([BLOCK_N]).load(SCALE_LAYOUT)
    codes = codes.to(gl.float16)
    mbarrier.wait(k16_free.index(buffer), ((n // NUM_BUFFERS) & 1) ^ 1)
    k16.index(buffer).store(codes)
    k16_scales.index(buffer).reshape([BLOCK_N]).store(key_scale)
    fence_async_shared()
    cta_barrier()
    mbarrier.arrive(empty.index(stage), count=1)
    mbarrier.arrive(k16_ready.index(buffer), count=1)


@gluon.jit
def _converter(keys, scales, ready, empty, k16, k16_scales, k16_ready, k16_free,
               row_request_ptr, row_position_ptr, num_rows, num_positions, tiles_per_row_tile,
               num_row_tiles, ROWS: gl.constexpr):
    """One warpgroup: every tile of the program's range, in the producer's and consumers'
    order (the same segments, the same first rows of each request, the same counts)."""
    # 16 codes (16 bytes) a thread in a row: a warp covers 4 rows x 128 codes.
    CODE_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    VECTOR_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    program = gl.program_id(0)
    num_programs = gl.num_programs(0)
    step = 0
    for i_segment in range(_num_segments(program, num_programs, tiles_per_row_tile,
                                         num_row_tiles)):
        row_tile, t0, t1 = _segment(program, num_programs, tiles_per_row_tile, num_row_tiles,
                                    i_segment)
        row0 = row_tile * ROWS
        for j in range(ROWS):
            is_first, request, m_rows, b_position, max_position = _request_of_row(
                row_request_ptr, row_position_ptr, row0, j, num_rows, num_positions, ROWS,
                VECTOR_LAYOUT)
            if is_first:
                t_end = gl.minimum(t1, gl.cdiv(max_position + 1, BLOCK_N))
                count = gl.maximum(t_end - t0, 0)  # the producer's range(t0, t_end)
                for i in range(count):
                    _convert_tile(keys, scales, ready, empty, k16, k16_scales, k16_ready,
                                  k16_free, step + i, CODE_LAYOUT, VECTOR_LAYOUT)
                step += count
