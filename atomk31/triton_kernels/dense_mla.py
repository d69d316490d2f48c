"""dense_mla in Triton: absorbed MLA attention of query rows over all their causal cache rows.

Contract: `atomk31.ops.dense_mla` (MODEL_SPEC §4.5; the dense case of §4.6): each row at
position p attends to slots 0..p of its request through the block table; out [Nq, H, 512]
and lse [Nq, H] exactly as `sparse_mla` with the full causal selection.

It runs the sparse-MLA kernel in its dense mode (`IS_DENSE`: the slot of position t is
block_table[request, t // block_size] * block_size + t % block_size, computed, not read),
split along the keys so that a long context spreads over the whole GPU (flash-decoding),
then merges the splits by their log-sum-exp. When consecutive rows share a request
(verification rows: 4 per request), one program takes 4 (or 2) of them, so their keys are
read once and the 96 heads tile 64 query vectors exactly (16 heads x 4 rows) instead of
being padded to 128, with a causal mask per row.

Roofline: with an FP8 latent and 96 heads one row does 2 * 96 * (576 + 512) / 576 = 363
FLOP per byte read, above the H200's bf16 ridge (~180), so decode is bound by the matrix
rate, not by the copy bandwidth; the benchmark reports both fractions.
"""

import torch

from atomk31.triton_kernels.sparse_mla import (
    LATENT_DIM,
    check_latent_cache_layout,
    choose_tiles,
    launch_mla,
    product_dtype,
)

GROUPABLE_ROWS = (4, 2)  # rows per program tried, largest first


def dense_mla_triton(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    softmax_scale: float,
    num_splits: int | None = None,
    block_h: int | None = None,
    rows_per_program: int | None = None,
    block_n: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    scores_via_memory: bool = False,
    prefetch_keys: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H]).

    q [Nq, H, 576], latent_cache [num_blocks, block_size, 576] (contiguous last dim),
    block_table [N, max_blocks] int32, row_request [Nq], row_position [Nq]. Every position
    0..p of a row must have a block. `rows_per_program` (None: 4 or 2 when every group of
    that many consecutive rows shares a request, else 1) and the other knobs tune it (see
    sparse_mla_triton).
    """
    check_latent_cache_layout(latent_cache)
    if latent_cache.shape[1] != block_size:
        raise ValueError(
            f"latent cache pages hold {latent_cache.shape[1]} tokens but block_size is "
            f"{block_size}; pass the block size the cache was built with")
    num_rows = row_request.shape[0]
    if row_position.shape != (num_rows,) or block_table.dim() != 2:
        raise ValueError(
            f"row_request and row_position must both be [Nq] and block_table [N, max_blocks], "
            f"got {list(row_request.shape)}, {list(row_position.shape)}, "
            f"{list(block_table.shape)}")
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != LATENT_DIM:
        raise ValueError(f"q must be [Nq={num_rows}, H, {LATENT_DIM}] absorbed queries, got "
                         f"{list(q.shape)}")
    if num_rows == 0:
        tiles = choose_tiles(q, product_dtype(q, latent_cache), 0, 0, 1, 1, block_h, block_n,
                             num_warps, num_stages)
        return launch_mla(q, latent_cache, latent_scale, softmax_scale, None, block_table,
                          row_request, row_position, 0, tiles)
    # One host read for both: the longest causal range and which row groups share a request.
    max_position, *groups_share = torch.stack(
        [row_position.max().to(torch.int64)]
        + [_groups_share_request(row_request, rows) for rows in GROUPABLE_ROWS]).tolist()
    if rows_per_program is None:
        rows_per_program = next((rows for rows, ok in zip(GROUPABLE_ROWS, groups_share) if ok),
                                1)
    elif rows_per_program not in (1, *GROUPABLE_ROWS):
        raise ValueError(f"rows_per_program must be 1, 2 or 4, got {rows_per_program}")
    elif rows_per_program > 1 and not groups_share[GROUPABLE_ROWS.index(rows_per_program)]:
        raise ValueError(f"rows_per_program={rows_per_program} needs every {rows_per_program} "
                         "consecutive rows to share a request; pass None to choose")
    num_groups = -(-num_rows // rows_per_program)
    tiles = choose_tiles(q, product_dtype(q, latent_cache), num_groups, max_position + 1,
                         rows_per_program, num_splits, block_h, block_n, num_warps, num_stages,
                         scores_via_memory, prefetch_keys)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, None, block_table,
                      row_request, row_position, max_position + 1, tiles)


def _groups_share_request(row_request: torch.Tensor, rows: int) -> torch.Tensor:
    """0-dim int64 tensor: 1 when each group of `rows` consecutive rows (the last one may be
    short) has a single request, else 0."""
    num_rows = row_request.shape[0]
    padding = -num_rows % rows
    padded = torch.cat([row_request, row_request[-1:].expand(padding)]).view(-1, rows)
    return (padded == padded[:, :1]).all().to(torch.int64)
