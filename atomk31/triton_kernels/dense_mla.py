"""dense_mla in Triton: absorbed MLA attention of query rows over all their causal cache rows.

Contract: `atomk31.ops.dense_mla` (MODEL_SPEC §4.5; the dense case of §4.6): each row at
position p attends to slots 0..p of its request through the block table; out [Nq, H, 512]
and lse [Nq, H] exactly as `sparse_mla` with the full causal selection.

It runs the sparse-MLA kernel in its dense mode (`IS_DENSE`: the slot of position t is
block_table[request, t // block_size] * block_size + t % block_size, computed, not read),
split along the keys so that a long context spreads over the whole GPU (flash-decoding),
then merges the splits by their log-sum-exp. This is the baseline the sparse path is judged
against and the path for contexts within top-k.
"""

import torch

from atomk31.triton_kernels.sparse_mla import LATENT_DIM, check_latent_cache_layout, launch_mla


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H]).

    q [Nq, H, 576], latent_cache [num_blocks, block_size, 576] (contiguous last dim),
    block_table [N, max_blocks] int32, row_request [Nq], row_position [Nq]. Every position
    0..p of a row must have a block. `num_splits` / `block_h` tune it (see sparse_mla_triton).
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
    max_keys = int(row_position.max()) + 1 if num_rows else 0
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, None, block_table,
                      row_request, row_position, max_keys, num_splits, block_h)
