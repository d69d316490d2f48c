"""Token-sharded MLA attention for long prefill steps under tensor parallelism.

Head-sharded attention (the default) gives each of the TP ranks every token and H/TP heads.
Its indexer is replicated: every rank scores every token of the step against the whole
context and takes the same top-k, so at long prefill the indexer's T x L work is done TP times
over. Token-sharded attention instead gives each rank a contiguous 1/TP of the step's tokens
and all heads:

    q_abs [T, H/TP, 576]  --all-to-all-->  [T/TP, H, 576]    (my tokens, every head)
    indexer + top-k + sparse MLA for my T/TP rows only        (each row scored once)
    out   [T/TP, H, 512]  --all-to-all-->  [T, H/TP, 512]    (back to my heads)

The latent cache is replicated under TP (one latent "head"), so every rank can attend any
token; each rank has written every token's row before this runs. A step's tokens are padded
to a multiple of TP with copies of its last row, whose outputs are dropped. The result is the
head-sharded one up to summation order. The two all-to-alls move 2 x (TP-1)/TP x T x H/TP x
(576 + 512) elements per rank, cheap next to the indexer work they save at long contexts;
below ``token_sharded_prefill_min_tokens`` (engine option) a step stays head-sharded. That
threshold is a default, not a measurement yet (the seed measured 1.69x TTFT at 340K tokens on
8 GPUs); ``distributed/collective_bytes.py`` gives the bytes either way.
"""

from __future__ import annotations

from typing import Protocol

import torch

from atomk31.cache import MLACacheView
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.batch import AttentionRows, ForwardBatch
from atomk31.ops import OpTable


class RowAttention(Protocol):
    """What this module needs of the MLA mixer (``mla_layer.MLAMixer``)."""

    parallel: ParallelContext

    def attend_rows(self, x: torch.Tensor, cq: torch.Tensor, q_abs: torch.Tensor,
                    rows: AttentionRows, cache: MLACacheView, ops: OpTable) -> torch.Tensor: ...


def token_shards(num_tokens: int, num_ranks: int) -> int:
    """Rows per rank: the step's tokens padded up to a multiple of ``num_ranks``."""
    return -(-num_tokens // num_ranks)


def token_sharded_attend(mixer: RowAttention, x: torch.Tensor, cq: torch.Tensor,
                         q_abs: torch.Tensor, batch: ForwardBatch, cache: MLACacheView,
                         ops: OpTable) -> torch.Tensor:
    """Attention outputs [T, H/TP, 512] fp32 of this rank's heads (module docstring)."""
    comm = mixer.parallel.tp
    world, rank = comm.world_size, comm.rank
    T, heads, width = q_abs.shape
    per_rank = token_shards(T, world)
    # row i of the padded step is token min(i, T - 1)
    padded = torch.arange(per_rank * world, device=x.device).clamp_max(T - 1)
    q_send = q_abs[padded].view(world, per_rank, heads, width)        # chunk s -> rank s
    q_recv = comm.all_to_all(q_send)                                   # from r: r's heads
    q_mine = q_recv.permute(1, 0, 2, 3).reshape(per_rank, world * heads, width)
    mine = padded[rank * per_rank:(rank + 1) * per_rank]
    rows = AttentionRows.of_batch(batch).subset(mine)
    out = mixer.attend_rows(x[mine], cq[mine], q_mine, rows, cache, ops)   # [n, H, 512]
    # sent in the compute dtype, which the output projection reads it in anyway
    out_send = out.to(x.dtype).view(per_rank, world, heads, -1).permute(1, 0, 2, 3)
    out_recv = comm.all_to_all(out_send)                                    # from r: r's tokens
    return out_recv.reshape(world * per_rank, heads, -1)[:T].float()
