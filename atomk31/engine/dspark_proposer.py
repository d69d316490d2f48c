"""DSpark drafts for a step: the draft's block pass, then its Markov head (MODEL_SPEC §5.5).

For each decoding sequence with k drafts (the scheduler's `num_draft_tokens`) whose token x_a
at position p+1 is the next to compute (its target states at 0..p are final), the block rows
`[x_a, mask, ..., mask]` (k rows at p+1..p+k) run through the draft in one pass
(`DSparkDraft.block_logits`), giving base logits U_0..U_{k-1}. The Markov head then picks one
draft per row, in order: `z_j = U_j + W1[x_{j-1}] W2ᵀ` (x_{-1} = x_a) and

* greedy (a greedy request, or `draft_sample_method` "greedy"): `d_j = argmax z_j` (ties ->
  lowest id), Q_j one-hot;
* probabilistic (a sampled request): Q_j = softmax of `z_j` processed with the request's
  temperature, top-k, top-p and min-p (the same filters the target's rows get, §5.6), and d_j
  drawn from it by the exponential race, with the request's generator.

The block pass reads the context rows 0..p of the draft's pages, written after every target
forward (engine/speculative.py), and writes its block rows at p+1..p+k, which the verify pass's
context rows then overwrite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from atomk31.cache import MLACacheView
from atomk31.engine.step_batch import upload
from atomk31.engine.sampler import filtered_logits
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.model.dspark import DraftBatch, DSparkDraft
from atomk31.ops import OpTable


@dataclass
class Proposal:
    """The drafts of one step, per proposing request r (in the order given):

    tokens [N, K] int64 (K = the most drafts of any request; row r's entries past its k are
    padding), probs [N, K, V] fp32: Q of the probabilistic requests (None when every request
    drafted greedily), is_one_hot [N]: request r's drafts are one-hot (greedy) picks."""

    tokens: torch.Tensor
    probs: torch.Tensor | None
    is_one_hot: list[bool]
    num_drafts: list[int]


class DSparkProposer:
    def __init__(self, draft: DSparkDraft, caches: list[MLACacheView], block_size: int,
                 sample_method: str, device: torch.device):
        self.draft = draft
        self.caches = caches
        self.block_size = block_size
        self.is_greedy_method = sample_method == "greedy"
        self.device = device

    def batch(self, items: list[ScheduledSequence]) -> DraftBatch:
        """The block rows of `items` (each with num_draft_tokens > 0)."""
        ids, positions, keys, rows_request, slots, counts = [], [], [], [], [], []
        bs, mask = self.block_size, self.draft.config.mask_token_id
        for r, item in enumerate(items):
            seq, k = item.seq, item.num_draft_tokens
            start = seq.num_computed_tokens               # x_a's position, p + 1
            ids.extend([seq.all_token_ids[start]] + [mask] * (k - 1))
            positions.extend(range(start, start + k))
            keys.extend([start + k - 1] * k)              # every block row sees the whole block
            rows_request.extend([r] * k)
            slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(start, start + k))
            counts.append(k)
        width = max(len(item.seq.block_table) for item in items)
        tables = [b for item in items
                  for b in item.seq.block_table + [-1] * (width - len(item.seq.block_table))]
        t = upload(self.device, {
            "ids": (ids, torch.int64), "positions": (positions, torch.int64),
            "keys": (keys, torch.int64), "slots": (slots, torch.int64),
            "rows": (rows_request, torch.int32), "tables": (tables, torch.int32)})
        return DraftBatch(input_ids=t["ids"], positions=t["positions"], key_positions=t["keys"],
                          token_request=t["rows"], block_tables=t["tables"].view(len(items), width),
                          slot_mapping=t["slots"], block_size=bs, max_position=max(keys),
                          rows_per_request=math.gcd(*counts))

    def propose(self, items: list[ScheduledSequence], generators: list[torch.Generator],
                ops: OpTable, base_logits: torch.Tensor | None = None) -> Proposal:
        """Drafts for `items`; generators[r]: request r's (its own, or the step's).
        `base_logits` [sum k, V]: the block pass's U when a graph already ran it."""
        if base_logits is None:
            base_logits = self.draft.block_logits(self.batch(items), self.caches, ops)
        counts = [item.num_draft_tokens for item in items]
        params = [item.seq.sampling_params for item in items]
        starts = torch.tensor([0] + counts[:-1], device=self.device).cumsum(0)
        width = max(counts)
        # row j of request r: U row starts[r] + min(j, k_r - 1) (padding repeats the last)
        index = starts[:, None] + torch.minimum(
            torch.arange(width, device=self.device)[None, :],
            torch.tensor(counts, device=self.device)[:, None] - 1)
        base = base_logits[index]                                             # [N, K, V]
        is_one_hot = [self.is_greedy_method or p.is_greedy for p in params]
        previous = torch.tensor([item.seq.all_token_ids[item.seq.num_computed_tokens]
                                 for item in items], device=self.device)
        tokens = torch.empty(len(items), width, dtype=torch.int64, device=self.device)
        probs = None if all(is_one_hot) else torch.zeros_like(base)
        for j in range(width):
            z = base[:, j] + self.draft.markov_bias(previous)
            picked, q = self._pick(z, params, is_one_hot, generators,
                                   [j < k for k in counts])
            tokens[:, j] = picked
            if probs is not None:
                probs[:, j] = q
            previous = picked
        return Proposal(tokens, probs, is_one_hot, counts)

    def _pick(self, z: torch.Tensor, params: list, is_one_hot: list[bool],
              generators: list[torch.Generator], is_live: list[bool]
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft per request from z [N, V]: argmax for one-hot requests, a sample of the
        processed distribution (returned as q [N, V], zeros for one-hot rows) for the rest."""
        picked = z.argmax(dim=-1)
        sampled = [r for r, one_hot in enumerate(is_one_hot) if not one_hot]
        if not sampled:
            return picked, None
        rows = torch.tensor(sampled, device=z.device)
        chosen = [params[r] for r in sampled]
        q = filtered_logits(
            z[rows], torch.tensor([p.temperature for p in chosen], device=z.device),
            torch.tensor([p.top_k for p in chosen], device=z.device),
            torch.tensor([p.top_p for p in chosen], device=z.device),
            torch.tensor([p.min_p for p in chosen], device=z.device)).softmax(dim=-1)
        noise = torch.ones_like(q)
        for i, r in enumerate(sampled):
            if is_live[r]:                  # padding rows draw nothing (seeded runs repeat)
                noise[i].exponential_(generator=generators[r])
        picked[rows] = (q / noise.clamp(min=torch.finfo(q.dtype).tiny)).argmax(dim=-1)
        full = torch.zeros_like(z)
        full[rows] = q
        return picked, full
