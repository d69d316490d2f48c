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

No host sync: the caller passes what the host knows (`max_position`, `rows_per_request`,
from the engine's ForwardBatch); without max_position the key range is bounded by the block
table's width (programs past a request's last position find no key and weigh 0 in the
merge), and without rows_per_request each program takes one row.

Roofline: with an FP8 latent and 96 heads one row does 2 * 96 * (576 + 512) / 576 = 363
FLOP per byte read, above the H200's bf16 ridge (~180), so decode is bound by the matrix
rate, not by the copy bandwidth; the benchmark reports both fractions.

On Hopper (bf16 / fp16 queries over an FP8 e4m3fn latent, no tile knob set) the default is
the warp-specialized Gluon sparse kernel in its dense mode instead
(gluon_kernels/dense_mla_hopper.py, `kernel="gluon_hopper_ws"`).
"""

import torch

from atomk31.triton_kernels.mla_kernel import LATENT_DIM
from atomk31.triton_kernels.mla_launch import (
    check_latent_cache_layout,
    choose_mla_tiles,
    launch_mla,
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
    max_position: int | None = None,
    rows_per_request: int | None = None,
    num_splits: int | None = None,
    block_h: int | None = None,
    rows_per_program: int | None = None,
    block_n: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    scores_via_memory: bool | None = None,
    value_splits: int | None = None,
    prefetch: int | None = None,
    fp16_operands: bool | None = None,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each row over its request's keys: (out [Nq, H, 512], lse [Nq, H]).

    q [Nq, H, 576], latent_cache [num_blocks, block_size, 576] (contiguous last dim),
    block_table [N, max_blocks] int32, row_request [Nq], row_position [Nq]. Every position
    0..p of a row must have a block. Host-side hints (no device read): `max_position`, at
    least max(row_position) (None: the block table's width bounds it); `rows_per_request`,
    when the rows come in runs of that many consecutive rows per request (the last run may
    be short): then 4 or 2 rows share a program. `rows_per_program` (1, 2 or 4; checked
    against row_request on the device, a sync: for tests and benchmarks) overrides that
    choice; the other knobs tune it (see sparse_mla_triton). `kernel`: "triton" (this file's
    launch of mla_kernel.py), "gluon_hopper_ws" (gluon_kernels/dense_mla_hopper.py; takes
    num_splits only) or None: "gluon_hopper_ws" where it applies and no other knob is set.
    """
    tile_knobs = dict(block_h=block_h, rows_per_program=rows_per_program, block_n=block_n,
                      num_stages=num_stages, num_warps=num_warps,
                      scores_via_memory=scores_via_memory, value_splits=value_splits,
                      prefetch=prefetch, fp16_operands=fp16_operands)
    fixed = [name for name, value in tile_knobs.items() if value is not None]
    kernel = kernel or "triton"
    if kernel == "gluon_hopper_ws":
        if fixed:
            raise ValueError(f"kernel={kernel!r} takes num_splits only, got {fixed}")
        from gluon_kernels.dense_mla_hopper import dense_mla_hopper

        return dense_mla_hopper(q, latent_cache, latent_scale, block_table, row_request,
                                row_position, block_size, softmax_scale,
                                max_position=max_position, rows_per_request=rows_per_request,
                                num_splits=num_splits)
    if kernel != "triton":
        raise ValueError(f"kernel must be 'triton' or 'gluon_hopper_ws', got {kernel!r}")
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
    if rows_per_program is None:
        rows_per_program = next((rows for rows in GROUPABLE_ROWS
                                 if rows_per_request is not None and rows_per_request % rows == 0),
                                1)
    elif rows_per_program not in (1, *GROUPABLE_ROWS):
        raise ValueError(f"rows_per_program must be 1, 2 or 4, got {rows_per_program}")
    elif rows_per_program > 1 and num_rows > 0 \
            and not _groups_share_request(row_request, rows_per_program):
        raise ValueError(f"rows_per_program={rows_per_program} needs every {rows_per_program} "
                         "consecutive rows to share a request; pass None to choose")
    max_keys = block_table.shape[1] * block_size if max_position is None else max_position + 1
    max_keys = 0 if num_rows == 0 else max_keys
    tiles = choose_mla_tiles(q, latent_cache, -(-num_rows // rows_per_program), max_keys,
                             rows_per_program, num_splits=num_splits, block_h=block_h,
                             block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                             scores_via_memory=scores_via_memory, value_splits=value_splits,
                             prefetch=prefetch, fp16_operands=fp16_operands)
    return launch_mla(q, latent_cache, latent_scale, softmax_scale, None, block_table,
                      row_request, row_position, max_keys, tiles)


def _groups_share_request(row_request: torch.Tensor, rows: int) -> bool:
    """Whether each group of `rows` consecutive rows (the last one may be short) has a single
    request (reads the device)."""
    num_rows = row_request.shape[0]
    padding = -num_rows % rows
    padded = torch.cat([row_request, row_request[-1:].expand(padding)]).view(-1, rows)
    return bool((padded == padded[:, :1]).all())
