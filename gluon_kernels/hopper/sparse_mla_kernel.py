"""Sparse (and dense) MLA on Hopper in Gluon, warp-specialized: a key producer and two consumers.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5, §4.6; DENSE: `atomk31.ops.dense_mla`).
Numerics: FP16 products of the FP8 e4m3 latent (exact in FP16) and of queries scaled into
FP16's range by a power of two per vector (the rule of atomk31/triton_kernels/mla_fp16_query.py,
applied as the scorer stages the queries); the latent scale once on the scores and once on the
output; fp32 accumulation; FP16 probabilities for the value product; -1 slots masked; a row
with no valid key gives 0 and lse -inf. The launchers: sparse_mla.py, dense_mla.py.

Why the roles. A kernel whose two warpgroups both wait on every product, then convert the next
keys and run the softmax, leaves the tensor cores idle most of a tile. Here the roles are split
across warps (gl.warp_specialize), as in FlashMLA's sparse FP8 decode (csrc/sm90/decode/
sparse_fp8):
  - key producer (worker, 4 warps): per 64-key tile, loads the FP8 rows into registers (16 B a
    thread; their slots a tile ahead) while waiting for a free key buffer, converts them to
    FP16 into it (two [64, 576] buffers; wgmma takes 16-bit B operands from shared memory
    only) with the tile's score bias (0, or -inf for a -1 slot or a key past the split), then
    signals `k_ready`;
  - scorer (default partition = warpgroup 0): stages the queries, S [64 heads, 64 keys] =
    Q K^T (m64n64k16: the queries read from shared memory once per 64 keys), the online
    softmax, P (FP16) and the per-head rescale factor into shared memory,
    O[:, :256] += P V[:, :256], then the next tile's scores queued behind that value product;
    only then is P announced to the value worker (`p_ready`), so its half of the values runs
    under the next softmax;
  - value worker (warpgroup 1): on `p_ready`, rescales its O[:, 256:] and adds P V[:, 256:];
    frees P (`p_free`) and, with the scorer, the key buffer (`k_free`, 2 arrivals). At the end
    the scorer hands it 1 / l through shared memory (`epilogue`).
Every hand-off is an mbarrier: the writing partition's threads store, fence the async proxy
(wgmma reads shared memory through it), meet at their partition's barrier, and one thread
arrives; the readers wait on the phase (tile i of buffer i % 2 completes phase (i // 2) & 1).
Shared memory: queries 73,728 B + two key buffers 147,456 B + P 8,192 B + 1 KB of factors
and biases + barriers and scratch: 230,736 B of a CTA's 232,448. 96 heads are two CTAs of 64
heads (the second half empty): 1.33x the counted products. Registers (setmaxnreg, 384
threads share 65,536): the scorer S (32 a thread), O's half (128) and the softmax; the value
worker O's half; the producer one tile of FP8 rows (72).

DENSE (dense_mla.py): the producer computes the slot of each position from the request's
block-table row instead of reading a selection; a CTA's "row" is a group of 1, 2 or 4 rows of
one request (their heads' vectors side by side), its keys end at its vectors' last position,
and the scorer masks, in the last tiles only, the keys past each vector's own row position.

Every size argument may be 1 (Triton then passes it as a constant): the kernel only combines
arguments with tensors, never calls tensor methods on them.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

# The CTA barrier (bar.sync): gl.thread_barrier on triton 3.6 (the H200's), gl.barrier on 3.9.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# gl.constexpr: the kernel reads them as compile-time constants; int(...) on the host.
VALUE_DIM = gl.constexpr(512)
ROPE_DIM = gl.constexpr(64)
BLOCK_H = gl.constexpr(64)  # heads (query vectors) per CTA: wgmma's M
BLOCK_N = gl.constexpr(64)  # keys per tile
HALF_VALUE = gl.constexpr(256)  # value columns per consumer warpgroup
ROLE_WARPS = gl.constexpr(4)  # every role is one warpgroup
VALUE_REGISTERS = gl.constexpr(160)  # the value worker: O's half (128) and addresses
PRODUCER_REGISTERS = gl.constexpr(120)  # the producer: one tile of FP8 rows (72) and addresses
# The scorer gets what is left (setmaxnreg).


@gluon.jit
def _row_offsets(slot, stride_cache_b, stride_cache_t, block_size, FLAT_SLOTS: gl.constexpr):
    """Element offsets of the cache rows of `slot` (-1 slots: row 0)."""
    slot = gl.maximum(slot, 0)
    if FLAT_SLOTS:
        return slot.to(gl.int64) * stride_cache_t
    return (slot // block_size).to(gl.int64) * stride_cache_b \
        + (slot % block_size).to(gl.int64) * stride_cache_t


@gluon.jit
def _store_keys(nope, rope, k_nope, k_rope):
    """FP8 key rows [BLOCK_N, 512] and [BLOCK_N, 64] (registers) as FP16 (exact) into a key
    buffer: wgmma's 16-bit B operand."""
    k_nope.store(nope.to(gl.float16))
    k_rope.store(rope.to(gl.float16))


@gluon.jit
def _stage_queries_once(q_row_ptr, head0, num_heads, stride_q_head, q_nope, q_rope,
                        LAYOUT: gl.constexpr):
    """The queries into shared memory in FP16, each vector scaled by 2^e bringing its largest
    |element| into [2^14, 2^15) (mla_fp16_query's rule and rounding), from one read: all 576
    columns of the 64 heads are loaded at once (144 registers a thread of bf16 / fp16 pairs;
    the maxima are exact in that type), fewer dependent round trips than two passes of
    [64, 128] pieces. Returns 2^-e per head."""
    o_h = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LAYOUT))
    o_nope = gl.arange(0, VALUE_DIM, layout=gl.SliceLayout(0, LAYOUT))
    o_rope = VALUE_DIM + gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, LAYOUT))
    rows = q_row_ptr + o_h[:, None] * stride_q_head
    heads = o_h[:, None] < num_heads
    nope = gl.load(rows + o_nope[None, :], mask=heads & (o_nope[None, :] >= 0), other=0.0)
    rope = gl.load(rows + o_rope[None, :], mask=heads & (o_rope[None, :] >= 0), other=0.0)
    amax = gl.maximum(gl.max(gl.abs(nope), axis=1), gl.max(gl.abs(rope), axis=1))
    exponent = ((amax.to(gl.float32).to(gl.int32, bitcast=True) >> 23) & 255) - 127
    e = gl.minimum(gl.maximum(14 - exponent, -126), 126)  # amax = 0: any e will do
    scale = ((e + 127) << 23).to(gl.float32, bitcast=True)[:, None]
    q_nope.store((nope.to(gl.float32) * scale).to(gl.float16))
    q_rope.store((rope.to(gl.float32) * scale).to(gl.float16))
    return ((127 - e) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _scores(q_nope, q_rope, k_nope, k_rope, s):
    """S = Q K^T for the keys in (k_nope, k_rope), left running (wgmma, async)."""
    s = warpgroup_mma(q_nope, k_nope.permute((1, 0)), s, use_acc=False, is_async=True)
    return warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)


@gluon.jit
def _next_scores(q_nope, q_rope, k_nope, k_rope, k_ready, phase, has_next, s):
    """The next tile's scores once its keys are in; after the last tile none (a spare product
    over settled keys would cost the CTA its time for nothing)."""
    if has_next:
        mbarrier.wait(k_ready, phase)
        scores = _scores(q_nope, q_rope, k_nope, k_rope, s)
    else:
        scores = warpgroup_mma_init(s)
    return scores


@gluon.jit
def _scorer(q_row_ptr, head0, num_heads, stride_q_head, start, end,
            score_scale_log2, value_scale, out_ptr, stride_out_head, lse_ptr, stride_lse_head,
            q_nope, q_rope, k_nope, k_rope, key_bias, p_smem, alpha_smem, scale_smem,
            k_ready, k_free, p_ready, p_free, epilogue, group_position_ptr, heads_per_row,
            DENSE: gl.constexpr):
    """Warpgroup 0: queries, scores, softmax, P, and value columns 0..255 (the module
    docstring's order). DENSE: vector v is head v % heads_per_row of the group's row
    v // heads_per_row, which sees keys up to that row's position."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_VALUE, 16])
    Q_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [ROLE_WARPS, 1], [1, 0])
    q_unscale = _stage_queries_once(q_row_ptr, head0, num_heads, stride_q_head, q_nope, q_rope,
                                    Q_LAYOUT)
    fence_async_shared()  # the queries' ordinary stores, read by wgmma
    cta_barrier()
    # Per head: softmax scale x log2(e) x latent scale x 2^-e (the FP16 query's scale).
    score_scale = score_scale_log2 * gl.convert_layout(q_unscale, gl.SliceLayout(1, S_LAYOUT))
    num_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    vector_position = gl.zeros([BLOCK_H], gl.int32, gl.SliceLayout(1, S_LAYOUT))
    first_masked = end  # the first key some vector of the CTA does not see
    if DENSE:
        o_v = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, S_LAYOUT))
        vector_position = gl.load(group_position_ptr + o_v // heads_per_row,
                                  mask=o_v < num_heads, other=2**30).to(gl.int32)
        first_masked = gl.min(vector_position, axis=0) + 1

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_H, HALF_VALUE], gl.float32, O_LAYOUT)
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_LAYOUT)
    mbarrier.wait(k_ready.index(0), 0, pred=num_tiles > 0)
    s = _scores(q_nope, q_rope, k_nope.index(0), k_rope.index(0), s)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    for i in range(num_tiles):
        buffer = i % 2
        # -inf for the tile's -1 slots and keys past the split (the producer's), else 0.
        bias = key_bias.index(buffer).load(gl.SliceLayout(0, S_LAYOUT))
        s = s * score_scale[:, None] + bias[None, :]
        if DENSE:
            # The producer's bias ends the keys at the CTA's last position; rows of the group
            # before it (verification rows) stop earlier: only the last tiles need a mask.
            tile_start = start + i * BLOCK_N
            if tile_start + BLOCK_N > first_masked:
                o_key = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
                s = gl.where(o_key[None, :] > vector_position[:, None], float("-inf"), s)
        # Online softmax in base 2; a vector whose keys are all masked so far shifts by 0.
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - shift)
        p = gl.exp2(s - shift[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        # The value worker has read the previous P and factors (its product has finished).
        mbarrier.wait(p_free, (i + 1) & 1, pred=i > 0)
        p_smem.store(p.to(gl.float16))
        alpha_smem.store(alpha)
        fence_async_shared()
        cta_barrier()  # also: every warp's products over the previous tile have finished
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        values = k_nope.index(buffer).slice(0, HALF_VALUE, 1)
        acc = warpgroup_mma(p_smem, values, acc * alpha_o, is_async=True)
        # The next tile's scores, queued behind the value product.
        s = _next_scores(q_nope, q_rope, k_nope.index(1 - buffer), k_rope.index(1 - buffer),
                         k_ready.index(1 - buffer), ((i + 1) // 2) & 1, i + 1 < num_tiles, s)
        mbarrier.arrive(p_ready)  # the value worker's half queues behind the scores
        acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s))
        cta_barrier()  # every warp's products over this buffer have finished
        mbarrier.arrive(k_free.index(buffer))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    # Normalized (partial) output and natural lse; no valid key: 0 and -inf.
    has_keys = l_i > 0
    l_safe = gl.where(has_keys, l_i, 1.0)
    scale_smem.store(value_scale / l_safe)
    cta_barrier()
    mbarrier.arrive(epilogue)
    o_scale = gl.convert_layout(value_scale / l_safe, gl.SliceLayout(1, O_LAYOUT))
    _store_half(acc, o_scale, out_ptr, head0, num_heads, stride_out_head, 0, O_LAYOUT)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_h = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(lse_ptr + o_h * stride_lse_head, lse, mask=o_h < num_heads)


@gluon.jit
def _store_half(acc, o_scale, out_ptr, head0, num_heads, stride_out_head,
                COLUMN: gl.constexpr, O_LAYOUT: gl.constexpr):
    """Value columns COLUMN..COLUMN+255 of the output, scaled per head."""
    o_h = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_LAYOUT))
    o_c = COLUMN + gl.arange(0, HALF_VALUE, layout=gl.SliceLayout(0, O_LAYOUT))
    gl.store(out_ptr + o_h[:, None] * stride_out_head + o_c[None, :], acc * o_scale[:, None],
             mask=(o_h[:, None] < num_heads) & (o_c[None, :] >= 0))


@gluon.jit
def _value_worker(head0, num_heads, start, end, out_ptr, stride_out_head,
                  k_nope, p_smem, alpha_smem, scale_smem, k_free, p_ready, p_free, epilogue):
    """Warpgroup 1: value columns 256..511, from the scorer's P and factors."""
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_VALUE, 16])
    num_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    acc = gl.zeros([BLOCK_H, HALF_VALUE], gl.float32, O_LAYOUT)
    for i in range(num_tiles):
        buffer = i % 2
        mbarrier.wait(p_ready, i & 1)
        alpha = alpha_smem.load(gl.SliceLayout(1, O_LAYOUT))
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, k_nope.index(buffer).slice(HALF_VALUE, HALF_VALUE, 1), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cta_barrier()  # every warp's product has finished reading P and the keys
        mbarrier.arrive(p_free)
        mbarrier.arrive(k_free.index(buffer))
    mbarrier.wait(epilogue, 0)
    o_scale = scale_smem.load(gl.SliceLayout(1, O_LAYOUT))
    _store_half(acc, o_scale, out_ptr, head0, num_heads, stride_out_head, HALF_VALUE, O_LAYOUT)


@gluon.jit
def _tile_slots(row_slots, tile, end, block_size, LAYOUT: gl.constexpr, DENSE: gl.constexpr):
    """The slots of keys tile..tile+BLOCK_N-1 (-1 past `end`): the selection's, or (DENSE,
    `row_slots` the request's block-table row) those of positions tile..tile+BLOCK_N-1."""
    o_n = tile + gl.arange(0, BLOCK_N, layout=LAYOUT)
    if DENSE:
        block = gl.load(row_slots + o_n // block_size, mask=o_n < end, other=-1)
        return gl.where(block >= 0, block * block_size + o_n % block_size, -1)
    return gl.load(row_slots + o_n, mask=o_n < end, other=-1)


@gluon.jit
def _gather(cache_ptr, slot, stride_cache_b, stride_cache_t, block_size, COLUMN: gl.constexpr,
            WIDTH: gl.constexpr, LAYOUT: gl.constexpr, FLAT_SLOTS: gl.constexpr):
    """Columns COLUMN..COLUMN+WIDTH-1 of the cache rows of `slot` (zeros for -1 slots)."""
    row = _row_offsets(slot, stride_cache_b, stride_cache_t, block_size, FLAT_SLOTS)
    o_c = COLUMN + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
    return gl.load(cache_ptr + row[:, None] + o_c[None, :],
                   mask=(slot >= 0)[:, None] & (o_c[None, :] >= 0), other=0.0)


@gluon.jit
def _key_producer(cache_ptr, row_slots, start, end, stride_cache_b, stride_cache_t, block_size,
                  k_nope, k_rope, key_bias, k_ready, k_free, FLAT_SLOTS: gl.constexpr,
                  DENSE: gl.constexpr):
    """Warps 8..11: each tile's FP8 rows -> FP16 key buffer (tile i into buffer i % 2), and
    the scores' bias: -inf for a -1 slot or a key past the split, else 0. The slots are
    loaded a tile ahead, so a tile's row loads wait on no slot load."""
    # 16 bytes a thread, a warp over 4 rows x 128 bytes (nope) or 8 x 64 (rope).
    NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [ROLE_WARPS, 1], [1, 0])
    ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [ROLE_WARPS, 1], [1, 0])
    KEY_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [ROLE_WARPS], [0])
    NOPE_KEYS: gl.constexpr = gl.SliceLayout(1, NOPE_LAYOUT)
    ROPE_KEYS: gl.constexpr = gl.SliceLayout(1, ROPE_LAYOUT)
    num_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    nope_slot = _tile_slots(row_slots, start, end, block_size, NOPE_KEYS, DENSE)
    rope_slot = _tile_slots(row_slots, start, end, block_size, ROPE_KEYS, DENSE)
    slot = _tile_slots(row_slots, start, end, block_size, KEY_LAYOUT, DENSE)
    for i in range(num_tiles):
        buffer = i % 2
        # In flight while the consumers still read this buffer's previous tile.
        nope = _gather(cache_ptr, nope_slot, stride_cache_b, stride_cache_t, block_size, 0,
                       VALUE_DIM, NOPE_LAYOUT, FLAT_SLOTS)
        rope = _gather(cache_ptr, rope_slot, stride_cache_b, stride_cache_t, block_size,
                       VALUE_DIM, ROPE_DIM, ROPE_LAYOUT, FLAT_SLOTS)
        bias = gl.where(slot >= 0, 0.0, float("-inf"))
        tile = start + (i + 1) * BLOCK_N
        nope_slot = _tile_slots(row_slots, tile, end, block_size, NOPE_KEYS, DENSE)
        rope_slot = _tile_slots(row_slots, tile, end, block_size, ROPE_KEYS, DENSE)
        slot = _tile_slots(row_slots, tile, end, block_size, KEY_LAYOUT, DENSE)
        mbarrier.wait(k_free.index(buffer), ((i // 2) & 1) ^ 1, pred=i >= 2)
        _store_keys(nope, rope, k_nope.index(buffer), k_rope.index(buffer))
        key_bias.index(buffer).store(bias)
        fence_async_shared()
        cta_barrier()
        mbarrier.arrive(k_ready.index(buffer))


@gluon.jit
def sparse_mla_hopper_kernel(
    # pointers
    q_ptr,  # [Nq, H, 576] bf16 / fp16 absorbed queries
    cache_ptr,  # fp8 e4m3 latent cache, rows of 576 on 16-byte boundaries
    slots_ptr,  # [Nq, k] int32, -1 masked (DENSE: the block table [N, max_blocks] int32)
    out_ptr, lse_ptr,  # [Nq, H, splits, 512], [Nq, H, splits] fp32
    # sizes
    num_heads, num_selected, keys_per_split, block_size, num_head_blocks,
    score_scale_log2, value_scale,
    # strides (elements)
    stride_q_row, stride_q_head, stride_cache_b, stride_cache_t, stride_slots_row,
    stride_out_row, stride_out_head, stride_out_split, stride_lse_row, stride_lse_head,
    # DENSE only (dense_mla): q's "rows" are groups of rows_per_group rows of one request,
    # each of heads_per_row heads; row_request / row_position [Nq] are per row
    row_request_ptr, row_position_ptr, heads_per_row, rows_per_group,
    # meta-parameters
    FLAT_SLOTS: gl.constexpr,  # blocks back to back: a slot's row offset is slot x row stride
    DENSE: gl.constexpr,  # keys: positions 0..p of the row's request (dense_mla)
):
    NOPE16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, VALUE_DIM],
                                                                gl.float16)
    ROPE16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], gl.float16)
    P_SHARED: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.float16)
    VECTOR: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    i_program = gl.program_id(0)
    i_split = gl.program_id(1)
    row = (i_program // num_head_blocks).to(gl.int64)
    head0 = (i_program % num_head_blocks) * BLOCK_H
    start = i_split * keys_per_split
    end = gl.minimum(start + keys_per_split, num_selected)
    row_slots = slots_ptr + row * stride_slots_row
    group_position_ptr = row_position_ptr
    if DENSE:
        # `row` is a group of rows_per_group rows of one request; the CTA's keys end at the
        # last position of its vectors' rows.
        first_row = row * rows_per_group
        request = gl.load(row_request_ptr + first_row).to(gl.int64)
        row_slots = slots_ptr + request * stride_slots_row
        group_position_ptr = row_position_ptr + first_row
        VECTORS: gl.constexpr = gl.BlockedLayout([1], [32], [ROLE_WARPS], [0])
        o_v = head0 + gl.arange(0, BLOCK_H, layout=VECTORS)
        position = gl.load(group_position_ptr + o_v // heads_per_row, mask=o_v < num_heads,
                           other=-1)
        end = gl.minimum(end, gl.max(position, axis=0).to(gl.int32) + 1)
    out_split = out_ptr + row * stride_out_row + i_split * stride_out_split
    lse_split = lse_ptr + row * stride_lse_row + i_split

    q_nope = gl.allocate_shared_memory(gl.float16, [BLOCK_H, VALUE_DIM], NOPE16)
    q_rope = gl.allocate_shared_memory(gl.float16, [BLOCK_H, ROPE_DIM], ROPE16)
    k_nope = gl.allocate_shared_memory(gl.float16, [2, BLOCK_N, VALUE_DIM], NOPE16)
    k_rope = gl.allocate_shared_memory(gl.float16, [2, BLOCK_N, ROPE_DIM], ROPE16)
    p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_H, BLOCK_N], P_SHARED)
    key_bias = gl.allocate_shared_memory(gl.float32, [2, BLOCK_N], VECTOR)
    alpha_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], VECTOR)
    scale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], VECTOR)
    k_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    epilogue = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for buffer in gl.static_range(2):
        mbarrier.init(k_ready.index(buffer), count=1)
        mbarrier.init(k_free.index(buffer), count=2)  # the scorer and the value worker
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(epilogue, count=1)

    gl.warp_specialize([
        (_scorer, (q_ptr + row * stride_q_row, head0, num_heads, stride_q_head, start, end,
                   score_scale_log2, value_scale, out_split, stride_out_head, lse_split,
                   stride_lse_head, q_nope, q_rope, k_nope, k_rope, key_bias, p_smem,
                   alpha_smem, scale_smem, k_ready, k_free, p_ready, p_free, epilogue,
                   group_position_ptr, heads_per_row, DENSE)),
        (_value_worker, (head0, num_heads, start, end, out_split, stride_out_head, k_nope,
                         p_smem, alpha_smem, scale_smem, k_free, p_ready, p_free, epilogue)),
        (_key_producer, (cache_ptr, row_slots, start, end, stride_cache_b, stride_cache_t,
                         block_size, k_nope, k_rope, key_bias, k_ready, k_free, FLAT_SLOTS,
                         DENSE)),
    ], [ROLE_WARPS, ROLE_WARPS], [VALUE_REGISTERS, PRODUCER_REGISTERS])
