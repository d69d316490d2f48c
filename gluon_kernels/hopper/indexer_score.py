"""Host side of the Hopper Gluon indexer (indexer_score_kernel.py: contract, numerics, design):
the TMA descriptors of the key pages, the rows a program owns and the launcher
`indexer_score_hopper` (query preparation, grid, launch).

The op (`atomk31.ops.indexer_score`) checks its arguments before this runs, and the registry
runs it only on sm_90 with FP8 keys in pages of a multiple of 64 tokens; what the kernel needs
beyond that of the tensors themselves (TMA's alignment rules, e4m3fn keys, at most 128 heads)
`check_inputs` checks on the host, with no device read.
"""

import functools

import torch
import triton
from triton.experimental.gluon import language as gl

from atomk31.triton_kernels.runtime import num_sms
from gluon_kernels.hopper.indexer_score_kernel import (
    KERNEL_MAX_REGISTERS, MAX_COLUMNS, MAX_HEADS, indexer_score_hopper_kernel, stages_that_fit,
)
from gluon_kernels.hopper.indexer_score_query_prep import prepare_queries
from gluon_kernels.hopper.indexer_score_work_split import BLOCK_N, INDEX_DIM


def heads_padded(num_heads: int) -> int:
    """Query columns per row: a power of two, at least wgmma's N of 8."""
    return max(8, triton.next_power_of_2(num_heads))


def check_inputs(q: torch.Tensor, index_values: torch.Tensor, index_scales: torch.Tensor,
                 block_size: int) -> None:
    """Raise ValueError unless the kernel can take these tensors (host metadata only): e4m3fn
    keys, at most MAX_HEADS heads, 64-key tiles inside a page, TMA's stride rules."""
    if index_values.dtype != torch.float8_e4m3fn:
        raise ValueError(f"the Hopper indexer reads e4m3fn FP8 keys, got {index_values.dtype}; "
                         "build the index cache with --index-key-dtype fp8 (e4m3fn)")
    if heads_padded(q.shape[1]) > MAX_HEADS:
        raise ValueError(f"the Hopper indexer takes up to {MAX_HEADS} heads, got "
                         f"H_I={q.shape[1]}; run the triton backend's indexer")
    if block_size % BLOCK_N.value:
        raise ValueError(f"the Hopper indexer needs block_size a multiple of {BLOCK_N.value} "
                         f"(a key tile in one page), got {block_size}")
    values, scales = index_values, index_scales
    if values.dim() != 3 or values.stride(2) != 1 or scales.dim() != 2 or \
            scales.stride(1) != 1 or scales.dtype != torch.float32:
        raise ValueError(f"the Hopper indexer needs [blocks, block_size, 128] values and "
                         f"[blocks, block_size] fp32 scales with unit last strides, got "
                         f"strides {values.stride()} and {scales.dtype} {scales.stride()}")
    if values.data_ptr() % 16 or scales.data_ptr() % 16 or values.stride(0) % 16 or \
            values.stride(1) % 16 or (scales.stride(0) * 4) % 16:
        raise ValueError(f"TMA needs 16-byte aligned bases and strides: values at "
                         f"{values.data_ptr() % 16} mod 16 with strides {values.stride()[:2]} "
                         f"B, scales at {scales.data_ptr() % 16} mod 16 with block stride "
                         f"{scales.stride(0) * 4} B; pass page views of the engine's pool")


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


def rows_per_program(num_rows: int, num_requests: int, heads_pad: int) -> int:
    """About the rows of one request (host-known Nq / N, as the Triton launcher), a power of
    two, at most MAX_COLUMNS / HEADS_PAD."""
    rows_per_request = triton.cdiv(num_rows, max(1, num_requests))
    return max(1, min(triton.next_power_of_2(rows_per_request), MAX_COLUMNS // heads_pad))


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
) -> torch.Tensor:
    """Indexer scores [Nq, L] fp32, L = max(row_position) + 1 or `num_positions` (the
    `indexer_score` contract; index_format "fp8" with e4m3fn keys). ValueError when
    `check_inputs` finds the tensors unfit for the kernel."""
    del index_format, fp8_variant  # "fp8" / "e4m3fn": the registry's and check_inputs' say
    check_inputs(q, index_values, index_scales, block_size)
    num_rows = row_request.shape[0]
    if num_positions is None:
        num_positions = int(row_position.max()) + 1 if num_rows else 0  # a device sync
    elif not 0 <= num_positions < 2**31:
        raise ValueError(f"num_positions must be in [0, 2^31) (int32 positions), got "
                         f"{num_positions}")
    scores = torch.empty(num_rows, num_positions, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_positions == 0:
        return scores

    heads_pad = heads_padded(q.shape[1])
    q_codes, weights = prepare_queries(q, head_weights, heads_pad)
    rows = rows_per_program(num_rows, block_table.shape[0], heads_pad)
    num_row_tiles = triton.cdiv(num_rows, rows)
    tiles_per_row_tile = triton.cdiv(num_positions, BLOCK_N.value)
    grid = min(num_sms(q.device), num_row_tiles * tiles_per_row_tile)
    key_desc, scale_desc = _descriptors(index_values, index_scales)
    indexer_score_hopper_kernel[(grid,)](
        key_desc, scale_desc, q_codes, weights, block_table, row_request, row_position, scores,
        num_rows, num_positions, block_size, tiles_per_row_tile, num_row_tiles,
        block_table.stride(0), scores.stride(0),
        ROWS=rows, HEADS_PAD=heads_pad, NUM_STAGES=stages_that_fit(rows, heads_pad),
        num_warps=4, maxnreg=KERNEL_MAX_REGISTERS)
    return scores
