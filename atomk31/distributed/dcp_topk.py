"""One exact global top-k over keys sharded across a DCP group, from an exchange of scores.

Layout: the W ranks of a DCP group hold a request's keys round-robin by token: global
position ``p`` lives on DCP rank ``p % W`` at local position ``p // W``. Each rank has scored
its own keys (``scores [Nq, L_local]``). The selection must be exactly the single-device one
(``ops/topk.py``): the ``k_row = min(k, p + 1)`` best keys of a row, higher score first, equal
scores to the lower position, -0.0 equal to +0.0.

1. Each rank sorts its keys by that rule and keeps its k best scores ``[Nq, k]``: the global
   top-k takes at most k keys from any rank, and a rank's share of it is a prefix of its own
   order (its positions rise with its local positions, so the local tie rule is the global
   one restricted to the rank).
2. One all-gather of those scores (fp32, k per row: 8 KiB per query row per rank at k = 2048);
   token ids stay local. Every rank now computes the same threshold ``tau`` (the k_row-th
   largest score of the row over all ranks, counting only each rank's real candidates, which
   every rank can count from the row's position), the keys above it (taken) and ``need``, how
   many keys scoring exactly ``tau`` the row still takes.
3. Ties at the threshold. When the ranks' keys scoring ``tau`` are exactly ``need`` (the usual
   case), each rank takes all of its own. Only when they are more (a tie straddles the cut)
   does the rule need positions: then the ranks all-gather the global positions of their
   listed ``tau`` keys (one more exchange, of that row's tied keys only in effect), and every
   rank takes its tied keys among the ``need`` lowest positions. Whether any row straddles is
   known identically on every rank (from the same gathered scores), so all take part or none.

A rank's listed tied keys are its lowest-position ones, and a rank never contributes more
than k keys, so the keys beyond a rank's list never enter the selection: truncating each
rank's list to k loses nothing.

The result on each rank: the local positions it attends, ascending, -1 padded to ``[Nq, k]``.
"""

from __future__ import annotations

import torch

from atomk31.distributed.communicator import LocalCommunicator, TorchCommunicator

NO_POSITION = torch.iinfo(torch.int64).max


def counts_per_rank(positions: torch.Tensor, world: int) -> torch.Tensor:
    """[W, Nq]: how many keys at positions 0..p each DCP rank holds, for each row's p."""
    ranks = torch.arange(world, device=positions.device)[:, None]
    return ((positions[None, :] - ranks) // world + 1).clamp_min(0)


def local_candidates(scores: torch.Tensor, num_local: torch.Tensor,
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's k best keys per row: (scores [Nq, k] fp32 descending, local positions
    [Nq, k] int64). Entries beyond the row's ``num_local`` candidates are padding (-inf)."""
    num_rows, length = scores.shape
    columns = torch.arange(length, device=scores.device)
    is_candidate = columns[None, :] < num_local[:, None]
    # -0.0 -> +0.0 (§9 #6); a stable sort keeps equal scores in position order
    ranked = torch.where(scores == 0, 0.0, scores.float()).masked_fill(~is_candidate, -torch.inf)
    values, order = torch.sort(ranked, dim=1, descending=True, stable=True)
    values, order = values[:, :k], order[:, :k]
    if values.shape[1] < k:     # fewer local keys than k: pad
        pad = k - values.shape[1]
        values = torch.nn.functional.pad(values, (0, pad), value=-torch.inf)
        order = torch.nn.functional.pad(order, (0, pad), value=0)
    return values, order


def threshold(gathered: torch.Tensor, listed: torch.Tensor,
              k_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From every rank's candidate scores ``gathered [W, Nq, k]`` (the first ``listed [W, Nq]``
    of each real): (tau [Nq], need [Nq]: keys at tau still to take, straddle [Nq] bool:
    more keys score tau than are needed)."""
    world, num_rows, k = gathered.shape
    is_real = torch.arange(k, device=gathered.device)[None, None, :] < listed[..., None]
    values = gathered.masked_fill(~is_real, -torch.inf)
    merged = values.permute(1, 0, 2).reshape(num_rows, world * k)
    best = torch.sort(merged, dim=1, descending=True).values
    tau = best.gather(1, (k_row - 1).clamp_min(0)[:, None]).squeeze(1)
    above = ((values > tau[None, :, None]) & is_real).sum(dim=(0, 2))
    at_tau = ((values == tau[None, :, None]) & is_real).sum(dim=(0, 2))
    need = k_row - above
    return tau, need, at_tau > need


def dcp_topk_positions(scores: torch.Tensor, k: int, positions: torch.Tensor,
                       comm: LocalCommunicator | TorchCommunicator) -> torch.Tensor:
    """This rank's share of every row's global top-k (module docstring).

    scores [Nq, L_local] fp32: the row's scores of this rank's keys (local positions 0..);
    k: index_topk; positions [Nq] int64: each row's global position p (it sees keys 0..p).
    -> local positions [Nq, k] int64, ascending, -1 padded.
    """
    world, rank = comm.world_size, comm.rank
    counts = counts_per_rank(positions, world)                  # [W, Nq]
    values, order = local_candidates(scores, counts[rank], k)
    gathered = comm.all_gather(values)                          # [W, Nq, k]
    listed = counts.clamp_max(k)
    k_row = torch.clamp(positions + 1, max=k)
    tau, need, straddle = threshold(gathered, listed, k_row)
    is_real = torch.arange(k, device=scores.device)[None, :] < listed[rank][:, None]
    above = (values > tau[:, None]) & is_real
    tied = (values == tau[:, None]) & is_real
    if bool(straddle.any()):
        tied = tied & _lowest_tied(order, tied, need, straddle, rank, world, comm)
    chosen = above | tied
    local = torch.where(chosen, order, NO_POSITION)
    local = torch.sort(local, dim=1).values
    return torch.where(local == NO_POSITION, -1, local)


def _lowest_tied(order: torch.Tensor, tied: torch.Tensor, need: torch.Tensor,
                 straddle: torch.Tensor, rank: int, world: int,
                 comm: LocalCommunicator | TorchCommunicator) -> torch.Tensor:
    """[Nq, k] bool: which of this rank's tied keys are among the ``need`` lowest global
    positions of the row's tied keys (every tied key where the row does not straddle)."""
    global_position = torch.where(tied, order * world + rank, NO_POSITION)
    everyone = comm.all_gather(global_position)                 # [W, Nq, k]
    world_size, num_rows, k = everyone.shape
    lowest = torch.sort(everyone.permute(1, 0, 2).reshape(num_rows, world_size * k),
                        dim=1).values
    cut = lowest.gather(1, (need - 1).clamp_min(0)[:, None]).squeeze(1)
    cut = torch.where(need > 0, cut, -1)
    taken = global_position <= cut[:, None]
    return taken | ~straddle[:, None]
