"""Sparse MLA decode on Hopper in Gluon: wgmma over gathered FP8 latent rows, FlashMLA's split.

Contract: `atomk31.ops.sparse_mla` (MODEL_SPEC §4.5, §4.6), with the numerics of the Triton
kernel's FP16_OPERANDS mode (atomk31/triton_kernels/mla_kernel.py): FP16 products of the FP8
e4m3 latent (exact in FP16) and of queries scaled into FP16's range by a power of two per
vector (mla_fp16_query.py's rule, applied as the kernel stages the queries); the latent scale
once on the scores and once on the output; fp32 accumulation; FP16 probabilities for the value
product; -1 slots masked; a row with no valid key gives 0 and lse -inf. Returns out [Nq, H, 512]
and lse [Nq, H] fp32 like the Triton launcher (key splits merged by `mla_combine`).

Design. One CTA owns one query row, 64 heads and one key split; 8 warps = two warpgroups; the
FP16 queries [64, 576] stay in shared memory (wgmma's A operand). Per tile of 64 keys:
  1. its FP8 rows, loaded into registers (16 B, 36 registers a thread) during the previous
     tile's products, became FP16 in one of two key buffers [64, 576] while the previous tile's
     value product ran (wgmma takes 16-bit B operands from shared memory only; e4m3 -> FP16:
     one instruction per two values);
  2. S [64 heads, 64 keys] = Q K^T with warps_per_cta [4, 2]: warpgroup w scores keys
     32w..32w+31, nothing twice (Triton's layout runs the score product on both warpgroups);
  3. the softmax's row maxima and sums meet across the warpgroups through shared memory (the
     compiler's cross-warp reduction); each warpgroup writes its half of P [64, 64] (FP16);
  4. O [64, 512] += P V (V = the key buffer's first 512 columns): warpgroup w accumulates value
     columns 256w..256w+255 for all 64 heads (m64n256k16, A = P from shared memory).
The gather measured first (cp.async two tiles ahead into two FP8 staging buffers, one key
buffer, a tile's steps in sequence) took 130.3 us at 64 rows (removed).
Issued work: 96 heads padded to 2 x 64 (1.33x the counted products; the Triton default 2.04x).
Shared memory 224 KB (queries, two key buffers, P): one CTA per multiprocessor; 64 rows = 128
CTAs on 132. The score product's N = 32 a warpgroup re-reads the queries from shared memory
every 32 keys (~1.5x over its rate for that half of the FLOPs); FlashMLA's N = 64 a warpgroup
needs 128 keys of FP16 buffers, which do not fit beside the queries. Offline sm_90 (triton
3.6, the H200's): 255 registers, no stack, 685 instructions a thread a tile, 229,888 B of
shared memory (3.9: 32 B of stack).

Decisions: Hopper only (wgmma, sm_90a): the AMD paths are flydsl_kernels/sparse_mla.py
(gfx950) and the Triton kernel. Gluon ships inside the triton wheel, so this is the `triton`
backend's Hopper path (`sparse_mla_triton`'s kernel="gluon_hopper"; its default since session
6 is the warp-specialized sparse_mla_hopper_ws.py, launched by this file's launcher with
`warp_specialized=True`: 87.4 us at 64 rows against this kernel's 122.6), not a backend of its
own. The 16-byte loads need cache rows on 16-byte boundaries (any real cache: 576-byte rows):
other caches take the Triton kernel, or a ValueError when this one is asked for.

Measured (H200, session 5, graph us, 96 heads x 2048 keys; predictions in brackets): 64 rows
121.5 (75) = 29.7% of the BF16 GEMM rate, the Triton kernel 153.1; 16 rows (4 key splits)
39.2 (25) vs 47.6. A tile takes ~3.4 us (~6,300 clocks) against ~2,700 of tensor and
shared-memory work: the ~685 instructions a thread a tile run between the products, not under
them (both warpgroups wait on each product). Rescaling O only when a softmax maximum grew by
more than 2^8 (skipping 128 multiplies a thread on most tiles) lost: 140.8 us at 64 rows against
123.0 in the same run (88 B of stack under 3.6, reloaded ~12 times a tile).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The CTA barrier (bar.sync): gl.thread_barrier on triton 3.6 (the H200's), gl.barrier on 3.9.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# gl.constexpr: the kernel reads them as compile-time constants; int(...) on the host.
VALUE_DIM = gl.constexpr(512)
ROPE_DIM = gl.constexpr(64)
BLOCK_H = gl.constexpr(64)  # heads per CTA: wgmma's M
BLOCK_N = gl.constexpr(64)  # keys per tile
NUM_WARPS = gl.constexpr(8)  # two warpgroups
QUERY_COLUMNS = gl.constexpr(128)  # the queries' FP16 scaling in [BLOCK_H, 128] pieces


@gluon.jit
def _row_offsets(slot, stride_cache_b, stride_cache_t, block_size, FLAT_SLOTS: gl.constexpr):
    """Element offsets of the cache rows of `slot` (-1 slots: row 0)."""
    slot = gl.maximum(slot, 0)
    if FLAT_SLOTS:
        return slot.to(gl.int64) * stride_cache_t
    return (slot // block_size).to(gl.int64) * stride_cache_b \
        + (slot % block_size).to(gl.int64) * stride_cache_t


@gluon.jit
def _key_rows(slots_ptr, tile, end, stride_cache_b, stride_cache_t, block_size,
              LAYOUT: gl.constexpr, FLAT_SLOTS: gl.constexpr):
    """Element offsets of the cache rows of keys tile..tile+BLOCK_N-1 (`slots_ptr`: the row's
    selection) and whether each is a key (not a -1 slot, before `end`)."""
    o_n = tile + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT))
    slot = gl.load(slots_ptr + o_n, mask=o_n < end, other=-1)
    valid = slot >= 0
    return _row_offsets(slot, stride_cache_b, stride_cache_t, block_size, FLAT_SLOTS), valid


@gluon.jit
def _load_tile(cache_ptr, slots_ptr, tile, end, stride_cache_b, stride_cache_t, block_size,
               NOPE_LAYOUT: gl.constexpr, ROPE_LAYOUT: gl.constexpr, FLAT_SLOTS: gl.constexpr):
    """One tile's FP8 rows into registers, [BLOCK_N, 512] and [BLOCK_N, 64] (zeros for
    non-keys), issued a tile before their use."""
    row, valid = _key_rows(slots_ptr, tile, end, stride_cache_b, stride_cache_t, block_size,
                           NOPE_LAYOUT, FLAT_SLOTS)
    o_c = gl.arange(0, VALUE_DIM, layout=gl.SliceLayout(0, NOPE_LAYOUT))
    nope = gl.load(cache_ptr + row[:, None] + o_c[None, :],
                   mask=valid[:, None] & (o_c[None, :] >= 0), other=0.0)
    row, valid = _key_rows(slots_ptr, tile, end, stride_cache_b, stride_cache_t, block_size,
                           ROPE_LAYOUT, FLAT_SLOTS)
    o_c = VALUE_DIM + gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, ROPE_LAYOUT))
    rope = gl.load(cache_ptr + row[:, None] + o_c[None, :],
                   mask=valid[:, None] & (o_c[None, :] >= 0), other=0.0)
    return nope, rope


@gluon.jit
def _query_piece(q_row_ptr, head0, num_heads, stride_q_head, COLUMN: gl.constexpr,
                 WIDTH: gl.constexpr, LAYOUT: gl.constexpr):
    """Columns COLUMN..COLUMN+WIDTH-1 of the row's queries [BLOCK_H, WIDTH] in fp32 (heads
    past num_heads zero)."""
    o_h = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LAYOUT))
    o_c = COLUMN + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
    return gl.load(q_row_ptr + o_h[:, None] * stride_q_head + o_c[None, :],
                   mask=(o_h[:, None] < num_heads) & (o_c[None, :] >= 0),
                   other=0.0).to(gl.float32)


@gluon.jit
def _stage_queries(q_row_ptr, head0, num_heads, stride_q_head, q_nope, q_rope,
                   LAYOUT: gl.constexpr):
    """The queries into shared memory in FP16, each vector scaled by the power of two 2^e that
    brings its largest |element| into [2^14, 2^15): mla_fp16_query's rule and rounding, fused
    (no launch, no FP16 copy in memory). The value columns in two passes over [BLOCK_H, 128]
    pieces (few registers; read twice, from L2). Returns 2^-e per head."""
    rope = _query_piece(q_row_ptr, head0, num_heads, stride_q_head, VALUE_DIM, ROPE_DIM, LAYOUT)
    amax = gl.max(gl.abs(rope), axis=1)
    for chunk in gl.static_range(VALUE_DIM // QUERY_COLUMNS):
        piece = _query_piece(q_row_ptr, head0, num_heads, stride_q_head, chunk * QUERY_COLUMNS,
                             QUERY_COLUMNS, LAYOUT)
        amax = gl.maximum(amax, gl.max(gl.abs(piece), axis=1))
    exponent = ((amax.to(gl.int32, bitcast=True) >> 23) & 255) - 127  # floor(log2 amax)
    e = gl.minimum(gl.maximum(14 - exponent, -126), 126)  # amax = 0: any e will do
    scale = ((e + 127) << 23).to(gl.float32, bitcast=True)[:, None]
    q_rope.store((rope * scale).to(gl.float16))
    for chunk in gl.static_range(VALUE_DIM // QUERY_COLUMNS):
        piece = _query_piece(q_row_ptr, head0, num_heads, stride_q_head, chunk * QUERY_COLUMNS,
                             QUERY_COLUMNS, LAYOUT)
        q_nope.slice(chunk * QUERY_COLUMNS, QUERY_COLUMNS, 1).store(
            (piece * scale).to(gl.float16))
    return ((127 - e) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _store_keys(nope, rope, k_nope, k_rope):
    """FP8 key rows [BLOCK_N, 512] and [BLOCK_N, 64] (registers) as FP16 (exact) into a key
    buffer: wgmma's 16-bit B operand."""
    k_nope.store(nope.to(gl.float16))
    k_rope.store(rope.to(gl.float16))


@gluon.jit
def sparse_mla_hopper_kernel(
    # pointers
    q_ptr,  # [Nq, H, 576] bf16 / fp16 absorbed queries
    cache_ptr,  # fp8 e4m3 latent cache, rows of 576 on 16-byte boundaries
    slots_ptr,  # [Nq, k] int32, -1 masked
    out_ptr, lse_ptr,  # [Nq, H, splits, 512], [Nq, H, splits] fp32
    # sizes
    num_heads, num_selected, keys_per_split, block_size, num_head_blocks,
    score_scale_log2, value_scale,
    # strides (elements)
    stride_q_row, stride_q_head, stride_cache_b, stride_cache_t, stride_slots_row,
    stride_out_row, stride_out_head, stride_out_split, stride_lse_row, stride_lse_head,
    # meta-parameters
    FLAT_SLOTS: gl.constexpr,  # blocks back to back: a slot's row offset is slot x row stride
):
    # Scores [64 heads, 64 keys]: warpgroup w holds keys 32w..32w+31 (no duplicated product).
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    # Output [64 heads, 512]: warpgroup w accumulates value columns 256w..256w+255.
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, VALUE_DIM // 2, 16])
    # Gathers: 16 bytes a thread, a warp over 4 rows x 128 bytes (nope) or 8 x 64 (rope).
    NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0])
    ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NUM_WARPS, 1], [1, 0])
    Q_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    NOPE16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, VALUE_DIM],
                                                                gl.float16)
    ROPE16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], gl.float16)
    P_SHARED: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.float16)

    i_program = gl.program_id(0)
    i_split = gl.program_id(1)
    row = (i_program // num_head_blocks).to(gl.int64)
    head0 = (i_program % num_head_blocks) * BLOCK_H
    start = i_split * keys_per_split
    end = gl.minimum(start + keys_per_split, num_selected)
    row_slots = slots_ptr + row * stride_slots_row

    q_nope = gl.allocate_shared_memory(gl.float16, [BLOCK_H, VALUE_DIM], NOPE16)
    q_rope = gl.allocate_shared_memory(gl.float16, [BLOCK_H, ROPE_DIM], ROPE16)
    # Two FP16 key buffers: tile t's products read one while tile t + 1 is written to the other.
    k_nope = gl.allocate_shared_memory(gl.float16, [2, BLOCK_N, VALUE_DIM], NOPE16)
    k_rope = gl.allocate_shared_memory(gl.float16, [2, BLOCK_N, ROPE_DIM], ROPE16)
    p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_H, BLOCK_N], P_SHARED)
    nope, rope = _load_tile(cache_ptr, row_slots, start, end, stride_cache_b, stride_cache_t,
                            block_size, NOPE_LAYOUT, ROPE_LAYOUT, FLAT_SLOTS)
    _store_keys(nope, rope, k_nope.index(0), k_rope.index(0))
    q_unscale = _stage_queries(q_ptr + row * stride_q_row, head0, num_heads, stride_q_head,
                               q_nope, q_rope, Q_LAYOUT)
    o_h_s = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, S_LAYOUT))
    m_h_s = o_h_s < num_heads
    # Per head: softmax scale x log2(e) x latent scale x 2^-e (the FP16 query's scale).
    score_scale = score_scale_log2 * gl.convert_layout(q_unscale, gl.SliceLayout(1, S_LAYOUT))
    fence_async_shared()  # the queries' (and first keys') ordinary stores, read by wgmma
    cta_barrier()

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_H, VALUE_DIM], gl.float32, O_LAYOUT)
    i_tile = 0
    for tile in range(start, end, BLOCK_N):
        buffer = i_tile % 2
        # The next tile's rows: in flight during this tile's products.
        next_nope, next_rope = _load_tile(cache_ptr, row_slots, tile + BLOCK_N, end,
                                          stride_cache_b, stride_cache_t, block_size,
                                          NOPE_LAYOUT, ROPE_LAYOUT, FLAT_SLOTS)
        keys_nope = k_nope.index(buffer)
        s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_LAYOUT)
        s = warpgroup_mma(q_nope, keys_nope.permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma(q_rope, k_rope.index(buffer).permute((1, 0)), s, is_async=True)
        # Waits for the previous tile's value product too (left running below).
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))

        o_n = tile + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        slot = gl.load(row_slots + o_n, mask=o_n < end, other=-1)
        s = gl.where((slot >= 0)[None, :], s * score_scale[:, None], float("-inf"))
        # Online softmax in base 2; a vector whose keys are all masked so far shifts by 0.
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - shift)
        p = gl.exp2(s - shift[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        cta_barrier()  # the other warpgroup's previous value product has read P
        p_smem.store(p.to(gl.float16))
        fence_async_shared()
        cta_barrier()  # both warpgroups' halves of P are in place

        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        acc = warpgroup_mma(p_smem, keys_nope, acc, is_async=True)
        # The value product runs on while the next tile's keys are converted into the other
        # buffer (last read by the previous tile's products, which have finished).
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _store_keys(next_nope, next_rope, k_nope.index(1 - buffer), k_rope.index(1 - buffer))
        fence_async_shared()
        cta_barrier()
        i_tile += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    # Normalized (partial) output and natural lse; no valid key: 0 and -inf.
    has_keys = l_i > 0
    l_safe = gl.where(has_keys, l_i, 1.0)
    o_scale = gl.convert_layout(value_scale / l_safe, gl.SliceLayout(1, O_LAYOUT))
    o_h = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_LAYOUT))
    o_c = gl.arange(0, VALUE_DIM, layout=gl.SliceLayout(0, O_LAYOUT))
    p_out = out_ptr + row * stride_out_row + i_split * stride_out_split \
        + o_h[:, None] * stride_out_head + o_c[None, :]
    gl.store(p_out, acc * o_scale[:, None], mask=(o_h[:, None] < num_heads) & (o_c[None, :] >= 0))
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    gl.store(lse_ptr + row * stride_lse_row + o_h_s * stride_lse_head + i_split, lse,
             mask=m_h_s)


def why_not_hopper(q: torch.Tensor, latent_cache: torch.Tensor) -> str | None:
    """None when the kernel runs these inputs, else what is missing."""
    if q.device.type != "cuda" or torch.version.hip is not None:
        return f"needs an NVIDIA Hopper GPU, got a {q.device.type} tensor (HIP {torch.version.hip})"
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        return f"needs compute capability 9.x (wgmma), got {major}.{minor}"
    if latent_cache.dtype != torch.float8_e4m3fn:
        return f"needs an FP8 e4m3fn latent cache, got {latent_cache.dtype}"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bf16 or fp16 queries (FP16 products), got {q.dtype}"
    element_size = latent_cache.element_size()
    if latent_cache.data_ptr() % 16 or (latent_cache.stride(1) * element_size) % 16 \
            or (latent_cache.stride(0) * element_size) % 16:
        return (f"needs cache rows on 16-byte boundaries (16-byte loads), got strides "
                f"{latent_cache.stride()} at address {latent_cache.data_ptr():#x}")
    return None


def key_splits(num_programs: int, num_keys: int, num_splits: int | None,
               device: torch.device) -> tuple[int, int]:
    """(splits, keys per split) of `num_keys` keys for `num_programs` CTAs a split: a split is
    whole key tiles; None picks the fewest splits that fill the GPU."""
    from atomk31.triton_kernels.mla_tiles import MIN_TILES_PER_SPLIT, fewest_splits_filling_waves

    num_tiles = max(1, triton.cdiv(num_keys, int(BLOCK_N)))
    if num_splits is None:
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = fewest_splits_filling_waves(num_programs, num_sms,
                                                 triton.cdiv(num_tiles, MIN_TILES_PER_SPLIT))
    keys_per_split = triton.cdiv(num_tiles, max(1, min(num_splits, num_tiles))) * int(BLOCK_N)
    return max(1, triton.cdiv(num_keys, keys_per_split)), keys_per_split


def split_outputs(out: torch.Tensor, lse: torch.Tensor,
                  num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the kernels write ([rows, heads, splits, 512], [rows, heads, splits]): `out` and
    `lse` themselves for one split, else fp32 partials for `mla_combine`."""
    if num_splits == 1:
        return out[:, :, None, :], lse[:, :, None]
    rows, heads = lse.shape
    return (torch.empty(rows, heads, num_splits, int(VALUE_DIM), dtype=torch.float32,
                        device=out.device),
            torch.empty(rows, heads, num_splits, dtype=torch.float32, device=out.device))


def sparse_mla_hopper(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
    num_splits: int | None = None,
    warp_specialized: bool = True,
    schedule: str = "late_values",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots with the Hopper Gluon kernel: (out
    [Nq, H, 512], lse [Nq, H]) fp32. q [Nq, H, 576] bf16 / fp16, latent_cache [num_blocks,
    block_size, 576] float8_e4m3fn (16-byte aligned rows), slots [Nq, k] int32 (-1 masked).
    `num_splits`: key splits a row (None: the fewest filling the GPU). `warp_specialized`:
    the producer / scorer / value-worker kernel (sparse_mla_hopper_ws.py) instead of this
    file's one-role kernel; same arguments, same results. `schedule` (warp-specialized only):
    the order of its products, "late_values" (measured fastest), "scores_first" or
    "values_first" (see SCHEDULE there)."""
    from atomk31.ops.sparse_mla import check_mla_query
    from atomk31.triton_kernels.mla_combine import mla_combine
    from atomk31.triton_kernels.mla_launch import LOG2_E, check_latent_cache_layout

    kernel, num_warps, variant = sparse_mla_hopper_kernel, int(NUM_WARPS), {}
    if warp_specialized:
        from gluon_kernels.sparse_mla_hopper_ws import (
            ROLE_WARPS,
            SCHEDULES,
            sparse_mla_hopper_ws_kernel,
        )

        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        # The launch's warps run the scorer; the value worker's and producer's come on top.
        kernel, num_warps = sparse_mla_hopper_ws_kernel, int(ROLE_WARPS)
        variant = {"SCHEDULE": SCHEDULES[schedule]}
    check_latent_cache_layout(latent_cache)
    if slots.dim() != 2:
        raise ValueError(f"slots must be [Nq, k], got {list(slots.shape)}")
    num_rows, num_selected = slots.shape
    check_mla_query(q, num_rows)
    reason = why_not_hopper(q, latent_cache)
    if reason is not None:
        raise ValueError(f"kernel='gluon_hopper' {reason}")
    num_heads = q.shape[1]
    out = torch.empty(num_rows, num_heads, int(VALUE_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return out, lse
    slots = slots.to(torch.int32).contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    num_head_blocks = triton.cdiv(num_heads, int(BLOCK_H))
    num_splits, keys_per_split = key_splits(num_rows * num_head_blocks, num_selected, num_splits,
                                            q.device)
    partial_out, partial_lse = split_outputs(out, lse, num_splits)
    block_size = latent_cache.shape[1]
    if warp_specialized:  # its dense mode's arguments, unused here
        variant.update(row_request_ptr=slots, row_position_ptr=slots, heads_per_row=1,
                       rows_per_group=1)
    kernel[(num_rows * num_head_blocks, num_splits)](
        q, latent_cache, slots, partial_out, partial_lse,
        num_heads, num_selected, keys_per_split, block_size, num_head_blocks,
        softmax_scale * latent_scale * LOG2_E, latent_scale,
        q.stride(0), q.stride(1), latent_cache.stride(0), latent_cache.stride(1),
        slots.stride(0), partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        FLAT_SLOTS=latent_cache.stride(0) == block_size * latent_cache.stride(1),
        num_warps=num_warps, **variant,
    )
    if num_splits > 1:
        mla_combine(partial_out, partial_lse, out, lse)
    return out, lse

