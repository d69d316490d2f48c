"""dense_mla in Triton: absorbed MLA attention of query rows over all their causal cache rows.

Contract: `atomk31.ops.dense_mla` (MODEL_SPEC §4.5; the dense case of §4.6): each row at
position p attends to slots 0..p of its request through the block table; out [Nq, H, 512]
and lse [Nq, H] exactly as `sparse_mla` with the full causal selection. The op checks its
arguments before this launcher runs.

It runs the sparse-MLA kernel in its dense mode (`IS_DENSE`: the slot of position t is
block_table[request, t // block_size] * block_size + t % block_size, computed, not read),
split along the keys so that a long context spreads over the whole GPU (flash-decoding),
then merges the splits by their log-sum-exp. When consecutive rows share a request
(verification rows: 4 per request), one program takes 4 (or 2) of them, so their keys are
read once and the 96 heads tile 64 query vectors exactly (16 heads x 4 rows) instead of
being padded to 128, with a causal mask per row.

No host sync: the caller passes what the host knows (`max_position`, `rows_per_request`,
from the engine's ForwardBatch); without max_position the key range is bounded by the block
table's width (programs past a request's last position find no key and weigh 0 in the
merge), and without rows_per_request each program takes one row.

Roofline: with an FP8 latent and 96 heads one row does 2 * 96 * (576 + 512) / 576 = 363
FLOP per byte read, above the H200's bf16 ridge (~180), so decode is bound by the matrix
rate, not by the copy bandwidth; the benchmark reports both fractions.
"""

import torch

from atomk31.triton_kernels.mla_launch import (
    check_latent_cache_layout,
    choose_mla_tiles,
    launch_mla,
)
from atomk31.triton_kernels.mla_splits import rows_per_program
from atomk31.triton_kernels.mla_tiles import MLATileConfig


def dense_mla_triton(
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
    config: MLATileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H]).

    q [Nq, H, 576], latent_cache [num_blocks, block_size, 576] (contiguous last dim),
    block_table [N, max_blocks] int32, row_request [Nq], row_position [Nq]. Every position
    0..p of a row must have a block. Host-side hints of the op's contract (no device read):
    `max_position`, at least max(row_position) (None: the block table's width bounds it);
    `rows_per_request`, when the rows come in runs of that many consecutive rows per request
    (the last run may be short): then 4 or 2 rows share a program. config: tile knobs a
    caller fixes (None: chosen for the target, mla_tiles.py).
    """
    check_latent_cache_layout(latent_cache)
    num_rows = row_request.shape[0]
    rows = rows_per_program(rows_per_request)
    max_keys = block_table.shape[1] * block_size if max_position is None else max_position + 1
    max_keys = 0 if num_rows == 0 else max_keys
    tiles = choose_mla_tiles(q, latent_cache, -(-num_rows // rows), max_keys, rows, config)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, None, block_table,
                      row_request, row_position, max_keys, tiles)
