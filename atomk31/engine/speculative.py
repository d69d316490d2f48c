"""Speculative decoding with a DSpark draft that shares the target's cache (MODEL_SPEC §5).

With `--speculative-config`, every engine step runs through `SpeculativeRunner.run`:

1. Drafts. Each decoding sequence the scheduler granted k drafts (`DraftPolicy`) gets them from
   the draft's block pass and Markov head (dspark_proposer.py).
2. One target forward over the whole step: prefill chunks, plain decodes and, per drafting
   sequence, the `1 + k` verify rows `[x_a, d_1..d_k]` at p+1..p+k+1, each row with its own
   causal bound (the MLA and indexer ops bound every row by its position). It returns the
   logits of every verify row and the tapped target states of every token, from which the
   draft's context rows are written into its pages (§5.4), so context rows exist for every
   position the target computed, prefix-cache hits included (a block's draft pages move with
   it).
3. Plain rows are sampled as without speculation; verify rows are accepted or rejected
   (rejection.py, §5.6).

State after verification (§5.7). A drafting sequence holds `1 + Tb` KDA state slots (its own
and `extra_state_slots`). The verify pass writes the state (recurrent and conv window) after
row i into the i-th of them (`row_states`); once n drafts are accepted the sequence's state
slot becomes the one after row n: no copy, nothing to roll back. Latent rows, index keys and
context rows of rejected positions are left in place and overwritten by later passes. KDA
prefix snapshots of a verify step are reserved after verification, for accepted rows only, and
copied from the slot of their row (`settle`).

Requests that cannot take drafts in a step decode without speculation in it: when the rows of
a step's budget, the blocks, the context length or max_tokens leave no room, and while
min_tokens holds EOS and stop tokens back (verification has no suppressed tokens); the last is
logged once per request. Logprobs work: a verify row gives the logprobs of the token it emits.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from atomk31.cache import KDAStatePool
from atomk31.checkpoint.dspark_schema import load_draft_checkpoint
from atomk31.engine.dspark_proposer import DSparkProposer, Proposal
from atomk31.engine.model_runner import ModelRunner, prompt_logprob_rows
from atomk31.engine.outputs import TokenLogprobs
from atomk31.engine.rejection import verify_drafts
from atomk31.engine.sampler import token_logprobs
from atomk31.engine.scheduler import ScheduledSequence
from atomk31.engine.sequence import Sequence
from atomk31.engine.spec_stats import SpeculationStats
from atomk31.model import ForwardBatch, K31Model
from atomk31.model.dspark import DSparkDraft
from atomk31.ops import OpTable
from atomk31.speculative_config import SpeculativeConfig

logger = logging.getLogger(__name__)

_SEED_MIX = 0x9E3779B97F4A7C15   # spreads (engine seed, step) over the 63-bit seed space


@dataclass
class StepTokens:
    """What one sequence emits this step: tokens in order and their logprobs (None where not
    asked); for a verification, its scheduled item and the drafts it accepted."""

    seq: Sequence
    tokens: list[int]
    logprobs: list[TokenLogprobs | None]
    verified: ScheduledSequence | None = None
    num_accepted: int = 0


def load_draft(config: SpeculativeConfig, target: K31Model, dtype: torch.dtype,
               device: torch.device) -> DSparkDraft:
    """The draft of `config`, checked and loaded onto `device`, sharing the target's
    embedding and LM head (§5.2)."""
    tensors = load_draft_checkpoint(config.model, config.draft, device)
    return DSparkDraft(config.draft, tensors, target.embed, target.lm_head.weight, dtype, device)


class DraftPolicy:
    """How many drafts a decoding sequence verifies in a step: `num_speculative_tokens`, fewer
    when the step's budget, max_tokens or the context length leave less room, none while
    min_tokens suppresses tokens (module docstring)."""

    def __init__(self, num_speculative_tokens: int, max_model_len: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        self._told: weakref.WeakSet[Sequence] = weakref.WeakSet()

    def __call__(self, seq: Sequence, budget: int) -> int:
        params = seq.sampling_params
        if seq.num_output_tokens < params.min_tokens:
            if seq not in self._told:
                self._told.add(seq)
                logger.info("request %s decodes without speculation until its min_tokens (%d) "
                            "are out: verification cannot hold EOS and stop tokens back",
                            seq.request_id, params.min_tokens)
            return 0
        # the step emits up to k + 1 tokens: within max_tokens and the context length
        room = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - seq.num_output_tokens - 1)
        return max(0, min(self.num_speculative_tokens, budget, room))


class SpeculativeRunner:
    """Runs an engine's steps with the draft (module docstring). ``runner`` owns the target,
    its caches and the sampler; ``proposer`` the draft and its pages."""

    def __init__(self, runner: ModelRunner, proposer: DSparkProposer,
                 tap_layer_ids: tuple[int, ...], num_speculative_tokens: int,
                 state_pool: KDAStatePool,
                 reserve_snapshots: Callable[[Sequence, int, int], list[tuple[int, int, int]]],
                 seed: int):
        self.runner = runner
        self.proposer = proposer
        self.tap_layer_ids = tap_layer_ids
        self.state_pool = state_pool
        self.reserve_snapshots = reserve_snapshots
        self.seed = seed
        self.device = runner.device
        self.stats = SpeculationStats(num_speculative_tokens)
        self.num_steps = 0
        self.graphs = None              # speculative_graphs.SpeculativeGraphs on a GPU

    def forward(self, batch: ForwardBatch, ops: OpTable | None = None) -> torch.Tensor:
        """The target over ``batch`` (logits of its logits_indices), then the draft's context
        rows of every token of the batch."""
        runner, ops = self.runner, ops or self.runner.kernels.eager
        logits, aux = runner.model.forward_with_taps(
            batch, runner.kv_views, runner.state_pool.conv, runner.state_pool.recurrent, ops,
            self.tap_layer_ids)
        self.proposer.draft.write_context(aux, batch.positions, batch.slot_mapping,
                                          self.proposer.caches, ops)
        return logits

    def run(self, scheduled: list[ScheduledSequence]) -> list[StepTokens]:
        """One step (module docstring): -> the tokens of every item that emits any."""
        self.num_steps += 1
        step_generator = torch.Generator(device=self.device).manual_seed(
            (self.seed * _SEED_MIX + self.num_steps) % (1 << 63))
        generators = [item.seq.generator(self.device) or step_generator for item in scheduled]
        verify = [r for r, item in enumerate(scheduled) if item.num_draft_tokens]
        drafts: list[list[int]] = [[] for _ in scheduled]
        proposal = None
        if verify:
            proposal = self._propose([scheduled[r] for r in verify],
                                     [generators[r] for r in verify])
            for i, row in enumerate(proposal.tokens.tolist()):
                drafts[verify[i]] = row[:proposal.num_drafts[i]]
        prompt_rows = prompt_logprob_rows(scheduled)
        logits = (self.graphs.run(scheduled, drafts)
                  if self.graphs is not None and not prompt_rows else None)
        if logits is None:
            batch = self.runner.prepare(scheduled, drafts, self.row_states(scheduled, drafts))
            logits = self.runner.forward_step(batch, prompt_rows, self.forward)
        return self._emit(scheduled, logits, verify, proposal, generators)

    def _propose(self, items: list[ScheduledSequence],
                 generators: list[torch.Generator]) -> Proposal:
        base = self.graphs.draft_logits(items) if self.graphs is not None else None
        return self.proposer.propose(items, generators, self.runner.kernels.eager, base)

    @staticmethod
    def row_states(scheduled: list[ScheduledSequence],
                   drafts: list[list[int]]) -> list[tuple[int, int, int]]:
        """(r, i + 1, slot): the state after verify row i of request r goes to the i-th of its
        slots, its own first (§5.7)."""
        rows = []
        for r, item in enumerate(scheduled):
            if drafts[r]:
                slots = [item.seq.state_slot] + item.seq.extra_state_slots
                rows.extend((r, i + 1, slots[i]) for i in range(len(drafts[r]) + 1))
        return rows

    def _emit(self, scheduled: list[ScheduledSequence], logits: torch.Tensor,
              verify: list[int], proposal: Proposal | None,
              generators: list[torch.Generator]) -> list[StepTokens]:
        """Sample the plain rows, verify the drafts; logits rows follow prepare's order."""
        plain, plain_rows, verify_rows, cursor = [], [], [], 0
        for item in scheduled:
            if item.num_draft_tokens:
                verify_rows.append(cursor)
                cursor += 1 + item.num_draft_tokens
            elif item.is_last_chunk:
                plain.append(item)
                plain_rows.append(cursor)
                cursor += 1
        out = []
        if plain:       # as without speculation (forks of a finished prefill included)
            out = [StepTokens(seq, [token], [logprobs]) for seq, token, logprobs
                   in self.runner.sample(plain, logits[plain_rows])]
        if verify:
            out += self._verify([scheduled[r] for r in verify], logits, verify_rows, proposal,
                                [generators[r] for r in verify])
        return out

    def _verify(self, items: list[ScheduledSequence], logits: torch.Tensor, starts: list[int],
                proposal: Proposal, generators: list[torch.Generator]) -> list[StepTokens]:
        width = max(proposal.num_drafts) + 1
        counts = torch.tensor(proposal.num_drafts, device=logits.device)
        # request r's rows starts[r] .. starts[r] + k_r; padding repeats its last row
        index = torch.tensor(starts, device=logits.device)[:, None] + torch.minimum(
            torch.arange(width, device=logits.device)[None, :], counts[:, None])
        rows = logits[index]                                               # [N, R, V]
        params = [item.seq.sampling_params for item in items]
        result = verify_drafts(rows, proposal.tokens, proposal.probs, proposal.is_one_hot,
                               proposal.num_drafts, params, generators)
        out = []
        for r, item in enumerate(items):
            tokens = result.tokens[r]
            logprobs: list[TokenLogprobs | None] = [None] * len(tokens)
            if params[r].logprobs is not None:      # token i from verify row i
                logprobs = token_logprobs(rows[r, :len(tokens)],
                                          torch.tensor(tokens, device=logits.device),
                                          params[r].logprobs)
            out.append(StepTokens(item.seq, tokens, logprobs, item, result.num_accepted[r]))
        return out

    def settle(self, step: StepTokens, num_appended: int) -> None:
        """After a verify item's tokens were appended (``num_appended``: fewer than emitted when
        a stop ended the sequence): the rows kept, its state slot, its snapshots, the stats."""
        item, seq = step.verified, step.seq
        kept_drafts = min(step.num_accepted, num_appended)
        self.stats.record(item.num_draft_tokens, step.num_accepted)
        slots = [seq.state_slot] + seq.extra_state_slots
        item.num_new_tokens = 1 + kept_drafts
        item.snapshots = self.reserve_snapshots(seq, seq.num_computed_tokens,
                                                item.num_new_tokens)
        for m, snapshot_slot, _ in item.snapshots:
            self.state_pool.copy(slots[m - 1], snapshot_slot)
        seq.state_slot = slots[kept_drafts]
        seq.extra_state_slots = slots[:kept_drafts] + slots[kept_drafts + 1:]
