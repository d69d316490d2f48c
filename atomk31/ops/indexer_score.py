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
    why_triton_unavailable,
)
from atomk31.ops.registry import register
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


def indexer_score_triton(
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
    """`indexer_score` in Triton (atomk31/triton_kernels/indexer_score.py): each request's keys
    are read once for all its rows; same tolerance as the torch implementation.
    num_positions: L = max(row_position) + 1 when the caller knows it on the host (no device
    read). Exact products with fp32 sums on every target: bf16 (e4m3 and E2M1 x 2^e values are
    bf16 values), fp16 for FP8 keys on CUDA (e4m3 values are fp16 values); the launcher's fp8
    tensor-core path is opt-in only (outside the tolerance)."""
    from atomk31.triton_kernels.indexer_score import indexer_score_triton as launch

    return launch(q, head_weights, index_values, index_scales, index_format, fp8_variant,
                  block_table, row_request, row_position, block_size,
                  num_positions=num_positions)


register("indexer_score", "torch", indexer_score_torch)
register("indexer_score", "triton", indexer_score_triton,
         why_unavailable=why_triton_unavailable)
