"""indexer_score: DSA lightning-indexer scores of query rows against a paged index-key cache.

Contract (§4.6, incl. "Quantized evaluation"; §9 #4)
--------
Inputs:
  q             [Nq, H_I, 128] float: indexer queries (`cq @ Wiq.T`, no rotary).
  head_weights  [Nq, H_I] fp32: w_h, already including 1/sqrt(H_I)/sqrt(d_I).
  index_values / index_scales / index_format / fp8_variant: one layer's index-key cache,
                laid out as in `kv_write` (§4.6.1); any strides.
  block_table   [N, max_blocks] int32, -1 padded.
  row_request   [Nq] int32: the request of each query row.
  row_position  [Nq] int: the row's absolute position p (it sees keys 0..p of its request).
  block_size    power of two.
Output:
  scores [Nq, L] fp32, L = max(row_position) + 1:
    scores[i, s] = sum_h w_h relu(q̂_h · k̂_s)  for s <= row_position[i],  -inf beyond.
  q̂ is q quantized per head to the key format with the keys' quantizer (`quantize_index_keys`)
  and dequantized; k̂ are the dequantized keys. Rows: decode rows, several verification rows
  of one request (each with its own causal bound), prefill rows, in any order.
Accumulation: fp32. Tests: against a naive per-row loop, rtol 1e-5 and atol 1e-5 * the row's
largest |score|.
"""

import torch

from atomk31.ops.kv_write import (
    INDEX_DIM,
    check_index_cache,
    dequantize_index_keys,
    quantize_index_keys,
    read_index_keys,
)
from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import (
    READS_DEVICE, all_of, needs_gpu, needs_hopper, needs_index_format, needs_rocm,
)
from atomk31.ops.target import KernelContext
from atomk31.ops.topk import causal_slots_of_request, check_paged_rows, group_rows_by_request

# Bound on the [rows, H_I, keys] logits held at once (fp32 elements, 256 MiB): rows of a long
# prefill are scored in chunks so the torch path also runs at real sizes on a GPU.
MAX_LOGIT_ELEMENTS = 1 << 26


def indexer_score_torch(
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
    """Indexer scores [Nq, L] fp32 of every query row over its causal keys (module docstring).

    num_positions: L when the caller knows it on the host (the engine does: its batch's
    largest position + 1); None reads max(row_position) + 1 from the device. A wider L gives
    -inf columns; a narrower one is the caller's error and is not checked (that would read
    the device too)."""
    check_index_cache(index_values, index_scales, index_format, fp8_variant)
    check_paged_rows(block_table, row_request, row_position, block_size)
    if index_values.shape[1] != block_size:
        raise ValueError(
            f"index cache pages hold {index_values.shape[1]} tokens but block_size is "
            f"{block_size}; pass the block size the cache was built with"
        )
    num_rows = row_request.shape[0]
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != INDEX_DIM:
        raise ValueError(f"q must be [Nq={num_rows}, H_I, {INDEX_DIM}], got {list(q.shape)}")
    num_heads = q.shape[1]
    if tuple(head_weights.shape) != (num_rows, num_heads):
        raise ValueError(
            f"head_weights must be [Nq={num_rows}, H_I={num_heads}], got "
            f"{list(head_weights.shape)}"
        )
    if num_positions is not None:
        length = num_positions
    else:
        length = int(row_position.max()) + 1 if num_rows else 0
    scores = torch.full((num_rows, length), -torch.inf, device=q.device)

    # Quantized evaluation (§4.6): queries go through the keys' quantizer, per head.
    q_values, q_scales = quantize_index_keys(q, index_format, fp8_variant)
    q_hat = dequantize_index_keys(q_values, q_scales, index_format)
    weights = head_weights.float()

    for request, rows, key_length in group_rows_by_request(row_request, row_position):
        slots = causal_slots_of_request(block_table, request, key_length, block_size)
        keys = read_index_keys(index_values, index_scales, index_format, slots)  # [S, 128]
        key_positions = torch.arange(key_length, device=q.device)
        chunk = max(1, MAX_LOGIT_ELEMENTS // max(1, num_heads * key_length))
        for chunk_rows in rows.split(chunk):
            logits = torch.relu(q_hat[chunk_rows] @ keys.T)  # [n, H_I, S]
            row_scores = (weights[chunk_rows, :, None] * logits).sum(dim=1)  # [n, S]
            is_future = key_positions[None, :] > row_position[chunk_rows, None]
            scores[chunk_rows, :key_length] = row_scores.masked_fill(is_future, -torch.inf)
    return scores


indexer_score = indexer_score_torch


def check_indexer_score(q: torch.Tensor, head_weights: torch.Tensor,
                        index_values: torch.Tensor, index_scales: torch.Tensor,
                        index_format: str, fp8_variant: str, block_table: torch.Tensor,
                        row_request: torch.Tensor, row_position: torch.Tensor,
                        block_size: int, num_positions: int | None = None) -> None:
    """The host-side argument check of `indexer_score` (shapes and dtypes; no device reads)."""
    check_index_cache(index_values, index_scales, index_format, fp8_variant)
    num_rows = row_request.shape[0]
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != INDEX_DIM:
        raise ValueError(f"q must be [Nq={num_rows}, H_I, {INDEX_DIM}], got {list(q.shape)}")
    if tuple(head_weights.shape) != (num_rows, q.shape[1]):
        raise ValueError(f"head_weights must be [Nq={num_rows}, H_I={q.shape[1]}], got "
                         f"{list(head_weights.shape)}")
    if index_values.shape[1] != block_size:
        raise ValueError(f"index cache pages hold {index_values.shape[1]} tokens but "
                         f"block_size is {block_size}; pass the block size the cache was "
                         "built with")


def _hopper_block_size(context: KernelContext) -> str | None:
    # the kernel's 64-key tiles must not straddle two pages
    if context.block_size % 64:
        return f"needs a block size that is a multiple of 64, got {context.block_size}"
    return None


def _amd_key_format(context: KernelContext) -> str | None:
    # §4.6.1: gfx942 has no FP4 matrix instruction, so no MXFP4 index keys there
    if context.index_format == "mxfp4" and context.target.name == "gfx942":
        return "reads fp8 index keys on gfx942 (no FP4 there), the cache has mxfp4"
    return None


define_op("indexer_score", check=check_indexer_score)
register("indexer_score", "torch", indexer_score_torch, not_in_graph=READS_DEVICE)
register("indexer_score", "triton", "atomk31.triton_kernels.indexer_score:indexer_score_triton",
         why_not=needs_gpu)
register("indexer_score", "hopper", "gluon_kernels.hopper.indexer_score:indexer_score_hopper",
         why_not=all_of(needs_hopper, needs_index_format("fp8"), _hopper_block_size),
         not_in_eager="a Gluon launch costs ~70 us more host time than Triton's, so it pays "
                      "only when replayed from a graph")
register("indexer_score", "amd", "gluon_kernels.amd.indexer_score:indexer_score_gluon",
         why_not=all_of(needs_rocm(("gfx950", "gfx942")), _amd_key_format))
