"""Host side of the Hopper Gluon indexer (gluon_kernels/indexer_score_hopper.py: contract,
numerics, design, limits): whether the kernel takes the inputs (`why_not_hopper`), the TMA
descriptors of the key pages, the rows a program owns, the launcher `indexer_score_hopper`
(checks, query preparation, grid, launch) and the offline compile examples.
"""

import functools

import torch
import triton
from triton.experimental.gluon import language as gl

from gluon_kernels.indexer_score_hopper import (
    MAX_COLUMNS, MAX_HEADS, PRODUCTS, indexer_score_hopper_kernel, kernel_max_registers,
    stages_that_fit,
)
from gluon_kernels.indexer_score_hopper_query_prep import prepare_queries
from gluon_kernels.indexer_score_hopper_work_split import BLOCK_N, INDEX_DIM


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
        PRODUCT=product, num_warps=4, maxnreg=kernel_max_registers(product))
    return scores


def descriptor_type(dtype_name: str, block_shape: list[int], is_fp8: bool) -> str:
    """The signature type of a host TMA descriptor argument (offline compiles)."""
    return f"tensordesc<{dtype_name}{block_shape},{_shared_layout(tuple(block_shape), is_fp8)!r}>"


def compile_examples(target: object) -> list:
    """What the bench's launches compile on sm_90 (K3.1's 32 heads; 4 verification rows in
    each product mode, 8 rows and 1 row of fp16, 1 row of fp16_ss), for offline compiles
    (gluon_kernels/compile.py; the launch adds maxnreg = kernel_max_registers(product)); none
    off sm_90."""
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
    for rows, product in ((4, "fp16"), (8, "fp16"), (1, "fp16"), (4, "fp8_acc32"), (4, "fp8"),
                          (4, "fp16_ss"), (1, "fp16_ss")):
        constexprs = {"ROWS": rows, "HEADS_PAD": 32, "PRODUCT": product,
                      "NUM_STAGES": stages_that_fit(rows, 32, product)}
        types = signature if product.startswith("fp16") else {**signature,
                                                              "q_ptr": "*fp8e4nv"}
        examples.append(CompileExample(f"indexer_score_hopper[{product} rows{rows}]",
                                       indexer_score_hopper_kernel, types, constexprs,
                                       num_warps=4))
    return examples
