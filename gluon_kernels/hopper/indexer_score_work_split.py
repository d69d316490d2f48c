"""The Hopper Gluon indexer's work split (indexer_score_kernel.py): which (row tile, key tile)
pairs a program owns, and which rows of a row tile stream a request's keys.

The producer and both consumers call these with the same arguments and walk the same sequence,
so the tiles they hand each other through the ring need no other bookkeeping: the pairs are
flattened and cut into equal contiguous ranges, one per program; a range cut at row-tile
boundaries gives the program's segments; in a segment, a request's keys are streamed once, for
the first of its rows in the row tile (`_request_of_row`).

The sizes arrive as kernel arguments, which Triton passes as constants when they equal 1 (one
row tile, one key tile): they are converted with gl.cast, which takes both.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

INDEX_DIM = gl.constexpr(128)  # d_I
BLOCK_N = gl.constexpr(64)  # keys per tile: one wgmma M of a warpgroup, inside one page


@gluon.jit
def _program_range(program, num_programs, tiles_per_row_tile, num_row_tiles):
    """[begin, end) of the flattened (row tile, key tile) pairs this program owns: an even
    split (the counts differ by at most one; int64 products for long prefills)."""
    total = gl.cast(num_row_tiles, gl.int64) * tiles_per_row_tile
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
