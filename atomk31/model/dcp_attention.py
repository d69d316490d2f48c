"""MLA attention under decode context parallelism (DCP): each rank over its share of the keys.

Layout (DECIDED HERE): round-robin by token. Global position ``p`` of a request lives on DCP
rank ``p % W`` at local position ``p // W``; the engine's blocks hold ``block_size x W`` tokens
and block ``b`` of a request is page ``b`` on every rank of the group (one block table serves
them all, and the scheduler and prefix cache run unchanged on blocks of ``block_size x W``).
Round-robin rather than whole blocks per rank because it balances every context length to
within one token per rank (a block layout leaves ranks idle below W blocks and makes
decode's new rows land on one rank for a whole block), and each rank's share of a row's top-k
is then spread evenly too, which keeps the per-rank sparse attention balanced.

Per MLA layer and step, on each rank of a group (all ranks attend every head of their head
group; the query projections are replicated across the group, so no query is exchanged):

1. the rows this rank holds were written by the layer (``batch.slot_mapping`` is -1 for the
   others); the indexer and every query are computed for every row;
2. each row scores this rank's keys at positions <= p (a local causal bound);
3. one exact global top-k of each row (``distributed/dcp_topk.py``: candidate scores are
   exchanged, token ids stay local); dense steps (every key selected) skip 2-3;
4. sparse attention over the selected rows this rank holds -> partial (out, lse);
5. the partials merged by log-sum-exp into this rank's TP heads (``distributed/lse_merge.py``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from atomk31.cache import MLACacheView
from atomk31.distributed.dcp_topk import counts_per_rank, dcp_topk_positions
from atomk31.distributed.lse_merge import merge_partials
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.batch import ForwardBatch
from atomk31.ops import OpTable


class ScoredAttention(Protocol):
    """What this module needs of the MLA mixer (``mla_layer.MLAMixer``)."""

    parallel: ParallelContext
    index_topk: int | None
    softmax_scale: float

    def index_scores(self, x: torch.Tensor, cq: torch.Tensor, row_request: torch.Tensor,
                     row_position: torch.Tensor, num_positions: int,
                     block_tables: torch.Tensor, block_size: int, cache: MLACacheView,
                     ops: OpTable) -> torch.Tensor: ...


def dcp_attend(mixer: ScoredAttention, x: torch.Tensor, cq: torch.Tensor, q_abs: torch.Tensor,
               batch: ForwardBatch, cache: MLACacheView, ops: OpTable) -> torch.Tensor:
    """Attention outputs [T, H/TP, 512] fp32 of this rank's TP heads (module docstring)."""
    comm = mixer.parallel.dcp
    world, rank = comm.world_size, comm.rank
    positions = batch.positions
    num_local = counts_per_rank(positions, world)[rank]          # keys <= p held here
    local_length = max(0, (batch.max_position - rank) // world + 1)
    is_dense = mixer.index_topk is None or batch.max_position + 1 <= mixer.index_topk
    if is_dense:
        columns = torch.arange(max(local_length, 1), device=x.device)
        local = torch.where(columns[None, :] < num_local[:, None], columns[None, :], -1)
    else:
        k = min(mixer.index_topk, batch.max_position + 1)
        scores = local_scores(mixer, x, cq, batch, cache, ops, num_local, local_length)
        local = dcp_topk_positions(scores, k, positions, comm)
    slots = ops.positions_to_slots(local, batch.block_tables, batch.token_request,
                                   batch.block_size)
    out, lse = ops.sparse_mla(q_abs, cache.latent, cache.latent_scale, slots,
                              mixer.softmax_scale)
    return merge_partials(out, lse, comm, exchange_dtype=x.dtype)


def local_scores(mixer: ScoredAttention, x: torch.Tensor, cq: torch.Tensor, batch: ForwardBatch,
                 cache: MLACacheView, ops: OpTable, num_local: torch.Tensor,
                 local_length: int) -> torch.Tensor:
    """Indexer scores [T, local_length] of every row over this rank's keys (local positions;
    a row sees the first ``num_local`` of them, the rest are ignored by the top-k)."""
    if local_length == 0:
        return torch.empty(x.shape[0], 0, device=x.device)
    last_local = (num_local - 1).clamp_min(0)
    return mixer.index_scores(x, cq, batch.token_request, last_local, local_length,
                              batch.block_tables, batch.block_size, cache, ops)
