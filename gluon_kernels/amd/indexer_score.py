"""Gluon indexer scoring: DSA lightning-indexer scores against a paged FP8 or MXFP4 key cache.

Computes the `indexer_score` op (atomk31/ops/indexer_score.py; MODEL_SPEC §4.6 "Quantized
evaluation", §4.6.1, §9 #4): ``scores[i, s] = sum_h w_h relu(q̂_h · k̂_s)`` for ``s <= p_i``,
``-inf`` beyond.

One program scores one tile of ``BLOCK_S`` key positions for a *group* of up to ``ROWS`` query
rows of one request (the verification rows of a speculative step, or consecutive prefill
rows): the key tile is loaded once, into the matmul's operand registers, and every row of the
group multiplies against it, so each key is read once per group instead of once per row.
Per row, ``[H_I, 128] x [128, BLOCK_S]`` runs on the target's matrix instruction:

* gfx950, FP8 keys: scaled MFMA on e4m3 operands with unit E8M0 scales; the fp32 per-head
  query scale and per-key scale multiply the accumulator afterwards (they are not powers of
  two, so they cannot ride in the E8M0 operand scales).
* gfx950, MXFP4 keys: scaled MFMA on e2m1 operands with the E8M0 block scales of queries and
  keys fed to the instruction (``v_mfma_scale_*``): no dequantization at all.
* gfx942: CDNA3 MFMA on e4m3fnuz operands (FP8 keys only; §4.6.1).
* NVIDIA (the test instantiation): values dequantized exactly to bf16 in registers, mma.sync.

Queries are quantized on the host with the keys' quantizer (``quantize_index_keys``,
atomk31/quant/index_keys.py): it is a few KiB per step and keeps one quantizer in the code
base. The rows are grouped on the device (sorted by request and position, cut every ROWS rows
of a request); the number of groups the grid spans is a bound computed on the host from the
row and request counts (`max_row_groups`), so a launch reads nothing back from the device and
a CUDA / HIP graph can capture it: groups past the real ones are empty and their programs
return at once.

The op (`atomk31.ops.indexer_score`) checks its arguments before this launcher runs; the
launcher checks what the target adds (the FP8 variant it executes, FP4 support).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from atomk31.quant.index_keys import quantize_index_keys
from gluon_kernels.targets import (
    GluonTarget,
    accumulator_layout,
    active_target,
    column_major_layout,
    operand_k_width,
    row_major_layout,
)

BLOCK_S = 64  # key positions per program
ROWS = 8  # query rows of one request per program (verification rows of one step)
NUM_WARPS = 4
MXFP4_GROUP = 32  # values per E8M0 scale (§6.3)


@gluon.jit
def _key_slots(block_table_ptr, request, o_s, m_s, block_size, stride_bt_request):
    """(block id, offset in block, valid) of key positions o_s; unallocated blocks are invalid."""
    block = gl.load(block_table_ptr + request * stride_bt_request + o_s // block_size,
                    mask=m_s, other=-1)
    return block.to(gl.int64), o_s % block_size, m_s & (block >= 0)


@gluon.jit
def _decode_e2m1(code):
    """E2M1 codes (uint8, 0..15) -> fp32 values, exactly (§6.3 table)."""
    magnitude = code & 7
    exponent = (magnitude >> 1).to(gl.int32)
    half_step = (magnitude & 1).to(gl.float32)
    value = gl.where(exponent == 0, 0.5 * half_step,
                     gl.where(exponent == 1, 1.0 + 0.5 * half_step,
                              gl.where(exponent == 2, 2.0 + half_step, 4.0 + 2.0 * half_step)))
    return gl.where((code & 8) != 0, -value, value)


@gluon.jit
def _e8m0_to_float(code):
    """E8M0 bytes -> 2^(code - 127) in fp32 (code 0 -> 0: only all-zero blocks carry it)."""
    return (code.to(gl.int32) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _mxfp4_as_bf16(packed_ptrs, scale_ptrs, o_d, mask):
    """Dequantize MXFP4 values at element index o_d (bytes o_d // 2) to bf16, exactly."""
    byte = gl.load(packed_ptrs, mask=mask, other=0)
    code = (byte >> ((o_d % 2) * 4).to(gl.uint8)) & 15
    scale = _e8m0_to_float(gl.load(scale_ptrs, mask=mask, other=0))
    return (_decode_e2m1(code) * scale).to(gl.bfloat16)


@gluon.jit
def indexer_score_kernel(
    # pointers
    q_values_ptr, q_scales_ptr, head_weights_ptr,
    key_values_ptr, key_scales_ptr, block_table_ptr,
    group_rows_ptr, group_max_position_ptr, row_request_ptr, row_position_ptr, scores_ptr,
    # sizes
    num_heads, block_size,
    # strides, in elements
    stride_kv_block, stride_kv_token, stride_ks_block, stride_ks_token,
    stride_bt_request, stride_scores_row,
    # meta-parameters
    KEY_FORMAT: gl.constexpr,  # "fp8" | "mxfp4"
    FP8_FNUZ: gl.constexpr,  # e4m3fnuz keys (gfx942) instead of e4m3fn
    MATMUL: gl.constexpr,  # "mfma_scaled" | "mfma" | "mma_v2"
    ROWS: gl.constexpr, HEADS: gl.constexpr, BLOCK_S: gl.constexpr,
    ACC_LAYOUT: gl.constexpr, Q_LAYOUT: gl.constexpr, K_LAYOUT: gl.constexpr,
    K_WIDTH: gl.constexpr,
):
    i_s = gl.program_id(0)
    i_g = gl.program_id(1)
    max_position = gl.load(group_max_position_ptr + i_g)
    if i_s * BLOCK_S <= max_position:
        first_row = gl.load(group_rows_ptr + i_g * ROWS)
        request = gl.load(row_request_ptr + first_row)
        # Bytes per key (and per query head) in storage: 128 e4m3 or 64 packed e2m1 pairs.
        if KEY_FORMAT == "mxfp4" and MATMUL == "mfma_scaled":
            WIDTH: gl.constexpr = 64
        else:
            WIDTH: gl.constexpr = 128
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_LAYOUT,
                                                     k_width=K_WIDTH)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ACC_LAYOUT,
                                                     k_width=K_WIDTH)

        # ---- the key tile, [WIDTH, BLOCK_S], loaded once for all rows of the group ----
        o_s = i_s * BLOCK_S + gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, K_LAYOUT))
        o_d = gl.arange(0, WIDTH, layout=gl.SliceLayout(1, K_LAYOUT))
        block, offset, m_s = _key_slots(block_table_ptr, request, o_s, o_s <= max_position,
                                        block_size, stride_bt_request)
        p_token = block[None, :] * stride_kv_block + offset[None, :] * stride_kv_token
        m_k = m_s[None, :] & (o_d[:, None] >= 0)
        if KEY_FORMAT == "mxfp4" and MATMUL == "mma_v2":
            p_scale = block[None, :] * stride_ks_block + offset[None, :] * stride_ks_token
            b_k = _mxfp4_as_bf16(key_values_ptr + p_token + o_d[:, None] // 2,
                                 key_scales_ptr + p_scale + o_d[:, None] // 32, o_d[:, None], m_k)
        else:
            b_k = gl.load(key_values_ptr + p_token + o_d[:, None], mask=m_k, other=0)
            if KEY_FORMAT == "fp8":
                if FP8_FNUZ:
                    b_k = b_k.to(gl.float8e4b8, bitcast=True)
                else:
                    b_k = b_k.to(gl.float8e4nv, bitcast=True)
                if MATMUL == "mma_v2":
                    b_k = b_k.to(gl.bfloat16)
        b_k = gl.convert_layout(b_k, b_layout)

        # Per-key scales in the accumulator's column layout (FP8) or the scaled-MFMA layout.
        o_s_acc = i_s * BLOCK_S + gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, ACC_LAYOUT))
        block_acc, offset_acc, m_s_acc = _key_slots(block_table_ptr, request, o_s_acc,
                                                    o_s_acc <= max_position, block_size,
                                                    stride_bt_request)
        if KEY_FORMAT == "fp8":
            b_key_scale = gl.load(key_scales_ptr + block_acc * stride_ks_block
                                  + offset_acc * stride_ks_token, mask=m_s_acc, other=0.0)
        if KEY_FORMAT == "mxfp4" and MATMUL == "mfma_scaled":
            ks_layout: gl.constexpr = gl.amd.cdna4.get_mfma_scale_layout(b_layout, [BLOCK_S, 4])
            o_s_ks = i_s * BLOCK_S + gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, ks_layout))
            o_g_ks = gl.arange(0, 4, layout=gl.SliceLayout(0, ks_layout))
            block_ks, offset_ks, m_s_ks = _key_slots(block_table_ptr, request, o_s_ks,
                                                     o_s_ks <= max_position, block_size,
                                                     stride_bt_request)
            b_key_scale = gl.load(key_scales_ptr + block_ks[:, None] * stride_ks_block
                                  + offset_ks[:, None] * stride_ks_token + o_g_ks[None, :],
                                  mask=m_s_ks[:, None] & (o_g_ks[None, :] >= 0), other=0)

        # ---- every row of the group against the tile ----
        o_h = gl.arange(0, HEADS, layout=gl.SliceLayout(1, Q_LAYOUT))
        o_dq = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, Q_LAYOUT))
        m_q = (o_h[:, None] < num_heads) & (o_dq[None, :] >= 0)
        o_h_acc = gl.arange(0, HEADS, layout=gl.SliceLayout(1, ACC_LAYOUT))
        m_h_acc = o_h_acc < num_heads
        for r in range(ROWS):
            row = gl.load(group_rows_ptr + i_g * ROWS + r)
            if row >= 0:
                position = gl.load(row_position_ptr + row)
                p_head = (row * num_heads + o_h[:, None]).to(gl.int64)
                if KEY_FORMAT == "mxfp4" and MATMUL == "mma_v2":
                    b_q = _mxfp4_as_bf16(q_values_ptr + p_head * 64 + o_dq[None, :] // 2,
                                         q_scales_ptr + p_head * 4 + o_dq[None, :] // 32,
                                         o_dq[None, :], m_q)
                else:
                    b_q = gl.load(q_values_ptr + p_head * WIDTH + o_dq[None, :], mask=m_q,
                                  other=0)
                    if KEY_FORMAT == "fp8":
                        if FP8_FNUZ:
                            b_q = b_q.to(gl.float8e4b8, bitcast=True)
                        else:
                            b_q = b_q.to(gl.float8e4nv, bitcast=True)
                        if MATMUL == "mma_v2":
                            b_q = b_q.to(gl.bfloat16)
                b_q = gl.convert_layout(b_q, a_layout)
                acc = gl.zeros([HEADS, BLOCK_S], gl.float32, layout=ACC_LAYOUT)
                if MATMUL == "mfma_scaled":
                    if KEY_FORMAT == "mxfp4":
                        qs_layout: gl.constexpr = gl.amd.cdna4.get_mfma_scale_layout(
                            a_layout, [HEADS, 4])
                        o_h_qs = gl.arange(0, HEADS, layout=gl.SliceLayout(1, qs_layout))
                        o_g_qs = gl.arange(0, 4, layout=gl.SliceLayout(0, qs_layout))
                        b_q_scale = gl.load(
                            q_scales_ptr + (row * num_heads + o_h_qs[:, None]).to(gl.int64) * 4
                            + o_g_qs[None, :],
                            mask=(o_h_qs[:, None] < num_heads) & (o_g_qs[None, :] >= 0), other=0)
                        acc = gl.amd.cdna4.mfma_scaled(b_q, b_q_scale, "e2m1", b_k, b_key_scale,
                                                       "e2m1", acc)
                    else:
                        acc = gl.amd.cdna4.mfma_scaled(b_q, None, "e4m3", b_k, None, "e4m3", acc)
                elif MATMUL == "mfma":
                    acc = gl.amd.cdna3.mfma(b_q, b_k, acc)
                else:
                    acc = gl.nvidia.ampere.mma_v2(b_q, b_k, acc)
                if KEY_FORMAT == "fp8":
                    b_q_scale = gl.load(q_scales_ptr + row * num_heads + o_h_acc, mask=m_h_acc,
                                        other=0.0)
                    acc = acc * b_q_scale[:, None] * b_key_scale[None, :]
                b_w = gl.load(head_weights_ptr + row * num_heads + o_h_acc, mask=m_h_acc,
                              other=0.0)
                b_score = gl.sum(gl.maximum(acc, 0.0) * b_w[:, None], axis=0)
                m_out = m_s_acc & (o_s_acc <= position)
                gl.store(scores_ptr + row.to(gl.int64) * stride_scores_row + o_s_acc, b_score,
                         mask=m_out)


def max_row_groups(num_rows: int, num_requests: int, rows_per_group: int = ROWS) -> int:
    """An upper bound, from host-known counts only, on the groups `group_query_rows` makes of
    `num_rows` rows of at most `num_requests` requests: request r's n_r rows make
    ceil(n_r / R) groups, and sum_r ceil(n_r / R) <= (Nq + (R - 1) N') / R with N' =
    min(N, Nq) requests holding rows (exact for decode: one row a request)."""
    holding = min(num_requests, num_rows)
    return min(num_rows, (num_rows + (rows_per_group - 1) * holding) // rows_per_group)


def group_query_rows(
    row_request: torch.Tensor, row_position: torch.Tensor, num_groups: int,
    rows_per_group: int = ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups of up to ``rows_per_group`` query rows of one request, for one program each.

    Rows of a request are ordered by position before they are cut into groups, so a prefill's
    group spans consecutive positions and its programs stop near the group's causal bound.
    ``num_groups``: at least the groups there are (`max_row_groups`); the rest stay empty.
    Device work only (no value read back). Returns (group_rows [num_groups, rows_per_group]
    int32, -1 padded; group_max_position [num_groups] int32, -1 for an empty group).
    """
    device = row_request.device
    group_rows = torch.full((num_groups, rows_per_group), -1, dtype=torch.int32, device=device)
    group_max_position = torch.full((num_groups,), -1, dtype=torch.int32, device=device)
    num_rows = row_request.shape[0]
    if num_rows == 0:
        return group_rows, group_max_position
    # Sort by (request, position): positions < 2^31, so one int64 key orders both.
    order = torch.argsort(row_request.long() * (1 << 32) + row_position.long(), stable=True)
    sorted_request = row_request[order].long()
    is_new_request = torch.ones_like(sorted_request, dtype=torch.bool)
    is_new_request[1:] = sorted_request[1:] != sorted_request[:-1]
    index = torch.arange(num_rows, device=device)
    run_start = torch.cummax(torch.where(is_new_request, index, 0), dim=0).values
    index_in_run = index - run_start
    is_group_start = (index_in_run % rows_per_group) == 0
    group_of_row = torch.cumsum(is_group_start.long(), dim=0) - 1
    group_rows[group_of_row, index_in_run % rows_per_group] = order.to(torch.int32)
    group_max_position.scatter_reduce_(0, group_of_row, row_position[order].to(torch.int32),
                                       reduce="amax", include_self=False)
    return group_rows, group_max_position


def padded_heads(num_heads: int) -> int:
    """Heads per matmul tile: a power of two, at least the 16 rows of one MFMA/MMA tile."""
    return max(16, triton.next_power_of_2(num_heads))


def check_key_format(target: GluonTarget, index_format: str, fp8_variant: str) -> None:
    """Raise ValueError unless ``target`` executes this key format (host values only)."""
    if index_format == "mxfp4" and not target.has_fp4:
        raise ValueError(f"MXFP4 index keys need FP4 support, which {target.arch} lacks; "
                         "use --index-key-dtype fp8 (MODEL_SPEC §4.6.1)")
    if index_format == "fp8" and fp8_variant != target.fp8_variant:
        raise ValueError(f"{target.arch} executes {target.fp8_variant} FP8, got a "
                         f"{fp8_variant} key cache; build the cache with {target.fp8_variant}")


def indexer_score_gluon(
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
) -> torch.Tensor:
    """Indexer scores [Nq, L] fp32 (the `indexer_score` contract) with the Gluon kernel;
    `num_positions` as in the contract (L from the host: no device read, so graphs capture
    the launch)."""
    target = active_target()
    check_key_format(target, index_format, fp8_variant)
    num_rows = row_request.shape[0]
    if num_positions is None:
        num_positions = int(row_position.max()) + 1 if num_rows else 0  # a device sync
    scores = torch.full((num_rows, num_positions), -torch.inf, device=q.device)
    if num_rows == 0 or num_positions == 0:
        return scores
    if index_values.stride(-1) != 1 or (index_format == "mxfp4" and index_scales.stride(-1) != 1):
        raise ValueError("index cache rows must be contiguous in their last dim; pass page "
                         "views of the engine's pool")
    q_values, q_scales = quantize_index_keys(q, index_format, fp8_variant)
    num_groups = max_row_groups(num_rows, block_table.shape[0])
    group_rows, group_max_position = group_query_rows(row_request, row_position, num_groups)
    launch_indexer_score(
        target=target, index_format=index_format,
        q_values=q_values.contiguous().view(torch.uint8), q_scales=q_scales.contiguous(),
        head_weights=head_weights.float().contiguous(),
        key_values=index_values.view(torch.uint8), key_scales=index_scales,
        block_table=block_table.to(torch.int32), group_rows=group_rows,
        group_max_position=group_max_position, row_request=row_request.to(torch.int32),
        row_position=row_position.to(torch.int32), scores=scores, block_size=block_size)
    return scores


def launch_indexer_score(
    target: GluonTarget,
    index_format: str,
    q_values: torch.Tensor,
    q_scales: torch.Tensor,
    head_weights: torch.Tensor,
    key_values: torch.Tensor,
    key_scales: torch.Tensor,
    block_table: torch.Tensor,
    group_rows: torch.Tensor,
    group_max_position: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    scores: torch.Tensor,
    block_size: int,
) -> None:
    """Grid and launch of `indexer_score_kernel` on prepared (quantized, grouped) inputs."""
    num_heads = head_weights.shape[1]
    grid = (triton.cdiv(scores.shape[1], BLOCK_S), group_rows.shape[0])
    indexer_score_kernel[grid](
        q_values, q_scales, head_weights, key_values, key_scales, block_table,
        group_rows, group_max_position, row_request, row_position, scores,
        num_heads, block_size,
        key_values.stride(0), key_values.stride(1), key_scales.stride(0), key_scales.stride(1),
        block_table.stride(0), scores.stride(0),
        **kernel_constexprs(target, index_format, num_heads),
        num_warps=NUM_WARPS,
    )


def kernel_constexprs(target: GluonTarget, index_format: str, num_heads: int) -> dict:
    """The constexpr arguments of `indexer_score_kernel` for one target and key format."""
    return dict(
        KEY_FORMAT=index_format, FP8_FNUZ=target.fp8_variant == "e4m3fnuz",
        MATMUL=target.matmul, ROWS=ROWS, HEADS=padded_heads(num_heads), BLOCK_S=BLOCK_S,
        ACC_LAYOUT=accumulator_layout(target, NUM_WARPS),
        Q_LAYOUT=row_major_layout(target, NUM_WARPS),
        K_LAYOUT=column_major_layout(target, NUM_WARPS),
        K_WIDTH=operand_k_width(target),
    )
