"""dense_mla: absorbed MLA attention of query rows over all their causal latent-cache rows.

Contract (§4.5; the dense case of §4.6 "Effect on MLA": p + 1 <= index_topk, or no indexer)
--------
Inputs:
  q              [Nq, H, 576] float: absorbed queries [q_nope·W_uk (512) | q_lane (64)].
  latent_cache   [num_blocks, block_size, 576] float32 | bfloat16 | float8_e4m3fn(uz), any
                 strides; latent_scale as in `sparse_mla`.
  block_table    [N, max_blocks] int32, -1 padded.
  row_request    [Nq] int32: the request of each query row.
  row_position   [Nq] int: the row's absolute position p; it attends to keys 0..p of its
                 request (decode, verification rows with consecutive positions, prefill).
  block_size     power of two.
  softmax_scale  float: 1/sqrt(192) for K3.1.
  max_position   optional int, keyword: at least max(row_position), known on the host (the
                 engine's ForwardBatch.max_position); lets the Triton path size its key
                 splits without reading the device. Ignored by the torch path.
  rows_per_request optional int, keyword: the rows come in runs of this many consecutive
                 rows per request (1 for decode, the verification width for speculative
                 rows; the last run may be short); lets the Triton path read a request's keys
                 once for several rows. Ignored by the torch path.
Outputs: out [Nq, H, 512] fp32 and lse [Nq, H] fp32, defined exactly as `sparse_mla` with
  slots = every causal slot 0..p of the row's request.
Accumulation: fp32. Tests: equal to `sparse_mla` with full causal selection and to a naive
causal softmax, rtol 1e-5, atol 1e-5.
"""

import torch

from atomk31.ops.kv_write import check_latent_cache, read_latent
from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import (
    READS_DEVICE, all_of, needs_compute, needs_gpu, needs_hopper, needs_latent,
)
from atomk31.ops.sparse_mla import LATENT_VALUE_DIM, check_mla_query, softmax_attend
from atomk31.ops.topk import causal_slots_of_request, check_paged_rows, group_rows_by_request

# Bound on the [rows, H, keys] scores held at once (fp32 elements, 256 MiB).
MAX_SCORE_ELEMENTS = 1 << 26


def dense_mla_torch(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    softmax_scale: float,
    *,
    max_position: int | None = None,
    rows_per_request: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H]).
    The host-side hints max_position and rows_per_request are for the Triton path."""
    check_latent_cache(latent_cache, latent_scale)
    check_paged_rows(block_table, row_request, row_position, block_size)
    if latent_cache.shape[1] != block_size:
        raise ValueError(
            f"latent cache pages hold {latent_cache.shape[1]} tokens but block_size is "
            f"{block_size}; pass the block size the cache was built with"
        )
    num_rows = row_request.shape[0]
    check_mla_query(q, num_rows)
    num_heads = q.shape[1]
    out = torch.zeros(num_rows, num_heads, LATENT_VALUE_DIM, device=q.device)
    lse = torch.full((num_rows, num_heads), -torch.inf, device=q.device)

    # Rows of one request share their keys: gather them once, mask per row (causal).
    for request, rows, key_length in group_rows_by_request(row_request, row_position):
        slots = causal_slots_of_request(block_table, request, key_length, block_size)
        keys = read_latent(latent_cache, latent_scale, slots)  # [S, 576]
        key_positions = torch.arange(key_length, device=q.device)
        chunk = max(1, MAX_SCORE_ELEMENTS // max(1, num_heads * key_length))
        for chunk_rows in rows.split(chunk):
            scores = (q[chunk_rows].float() @ keys.T) * softmax_scale  # [n, H, S]
            is_future = key_positions[None, :] > row_position[chunk_rows, None]
            scores = scores.masked_fill(is_future[:, None, :], -torch.inf)
            out[chunk_rows], lse[chunk_rows] = softmax_attend(
                scores, keys[:, :LATENT_VALUE_DIM]
            )
    return out, lse


dense_mla = dense_mla_torch


def check_dense_mla(q: torch.Tensor, latent_cache: torch.Tensor, latent_scale: float,
                    block_table: torch.Tensor, row_request: torch.Tensor,
                    row_position: torch.Tensor, block_size: int, softmax_scale: float,
                    **hints) -> None:
    """The host-side argument check of `dense_mla` (shapes and dtypes; no device reads)."""
    check_latent_cache(latent_cache, latent_scale)
    if latent_cache.shape[1] != block_size:
        raise ValueError(f"latent cache pages hold {latent_cache.shape[1]} tokens but "
                         f"block_size is {block_size}; pass the block size the cache was "
                         "built with")
    if block_table.dim() != 2 or row_request.dim() != 1 or \
            row_position.shape != row_request.shape:
        raise ValueError(f"block_table must be [N, max_blocks] and row_request, row_position "
                         f"[Nq], got {list(block_table.shape)}, {list(row_request.shape)} and "
                         f"{list(row_position.shape)}")
    check_mla_query(q, row_request.shape[0])


define_op("dense_mla", check=check_dense_mla)
register("dense_mla", "torch", dense_mla_torch, not_in_graph=READS_DEVICE)
register("dense_mla", "triton", "atomk31.triton_kernels.dense_mla:dense_mla_triton",
         why_not=needs_gpu)
register("dense_mla", "hopper", "gluon_kernels.hopper.dense_mla:dense_mla_hopper",
         why_not=all_of(needs_hopper, needs_latent(torch.float8_e4m3fn),
                        needs_compute(torch.bfloat16, torch.float16)))
