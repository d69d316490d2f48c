"""The scheduler: which sequences run in the next step, and with how many tokens.

One step holds decodes and prefill chunks together under a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`). Running sequences go first,
oldest first; then waiting ones are admitted while the budget, the KDA state slots and the
blocks allow. A prompt longer than the budget is prefilled in chunks over several steps.

Memory. Each running sequence holds one KDA state slot and the blocks covering its computed
tokens. When blocks run out, the most recently admitted running sequence is preempted: its
blocks and state slot are freed and it returns to the front of the waiting queue with its
generated tokens kept; when it is admitted again it recomputes prompt + outputs (through the
prefix cache where its blocks survived), so it resumes exactly where it stopped.

Prefix caching. Full blocks are named by chained hashes. On admission a sequence reuses the
longest cached prefix whose end also has a KDA state snapshot (KDA's state cannot be rebuilt
from the latent cache), restores that snapshot into its slot and starts computing after it.
A step asks the model for a snapshot of the state at the block boundaries it crosses that are
worth one: the end of the prompt's last full block (what the next turn of a conversation, or a
repeat of the prompt, hits) and every `snapshot_interval_blocks` blocks (shared prefixes such
as system prompts, and long generations). Not at every block: one K3.1 state is 449 MB, so
snapshots at every 128 tokens would fill the snapshot budget with states no hit will use and
copy 449 MB per block of prefill. A sequence that asks for prompt logprobs computes its whole
prompt (no reuse).

n > 1 completions. Only a request's first sequence is scheduled; the step that computes its
last prompt token samples a first token for every completion from that one logits row
(`ScheduledSequence.sampled_seqs`), and then `fork` gives each other completion the full
prompt blocks (one more reference each), a copy of the partly filled last block and a copy of
the KDA state in a slot of its own. A completion that finds no free slot, block or batch seat
waits instead and recomputes its prompt (through the prefix cache), as a preempted one does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from atomk31.cache import BlockPool, KDAStatePool, SnapshotIndex, hash_block, usable_prefix
from atomk31.engine.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    # (m, snapshot slot, block hash): after its first m new tokens of this step the sequence
    # crosses the end of the block named by `block hash`; its KDA state there goes to the slot
    snapshots: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def is_last_chunk(self) -> bool:
        """This step computes the sequence's last token: it then samples a new one."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens

    @property
    def sampled_seqs(self) -> list[Sequence]:
        """The sequences that take a token from this item's last logits row: none before the
        last chunk; the sequence, and at the end of its prefill the completions waiting to
        fork from it (n > 1: one prompt, n first tokens)."""
        if not self.is_last_chunk:
            return []
        return [self.seq, *(fork for fork in self.seq.forks if not fork.is_finished)]


class Scheduler:
    def __init__(self, block_pool: BlockPool, state_pool: KDAStatePool,
                 snapshots: SnapshotIndex, max_num_seqs: int, max_num_batched_tokens: int,
                 snapshot_interval_blocks: int = 1,
                 copy_block: Callable[[int, int], None] | None = None):
        """copy_block(src, dst): copy one cache block's contents (every layer's pages), for the
        partly filled prompt block a forked completion gets (None: forks always recompute)."""
        self.block_pool = block_pool
        self.snapshot_interval_blocks = snapshot_interval_blocks   # 0: prompt ends only
        self.copy_block = copy_block
        self.state_pool = state_pool
        self.snapshots = snapshots
        self.block_size = block_pool.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self._hashes: dict[Sequence, list[int]] = {}   # chained hashes of full blocks
        self.num_preemptions = 0

    # -- queues -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Release everything a finished or aborted sequence holds."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        self._hashes.pop(seq, None)

    # -- one step -----------------------------------------------------------------------
    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue   # preempted by an earlier sequence of this loop
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._grow_or_preempt(seq, n):
                continue
            scheduled.append(self._plan(seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._grow(seq, n):
                self._preempt(seq)   # nothing was computed: back to the waiting queue
                break
            scheduled.append(self._plan(seq, n))
            budget -= n
        return scheduled

    def complete(self, scheduled: list[ScheduledSequence]) -> None:
        """After the model ran the step: advance computed counts, publish full blocks."""
        for item in scheduled:
            seq = item.seq
            before = seq.num_computed_tokens
            seq.num_computed_tokens = before + item.num_new_tokens
            hashes = self._hashes[seq]
            for b in range(before // self.block_size, seq.num_computed_tokens // self.block_size):
                self.block_pool.register_full(seq.block_table[b], hashes[b])
            for _, _, block_hash in item.snapshots:
                self.snapshots.commit(block_hash)   # written by the step: now restorable

    def fork(self, parent: Sequence) -> None:
        """After the step that computed `parent`'s prompt and sampled every completion's first
        token: the unfinished ones of `parent.forks` continue from its cache, or wait to
        recompute when there is no room. Call before `parent` is released."""
        forks, parent.forks = [f for f in parent.forks if not f.is_finished], []
        bs = self.block_size
        num_full = parent.num_prompt_tokens // bs
        has_partial = parent.num_prompt_tokens % bs != 0
        for child in forks:
            if not self._can_fork(has_partial):
                self.waiting.appendleft(child)   # recomputes prompt + its first token
                continue
            child.state_slot = self.state_pool.allocate()
            self.state_pool.copy(parent.state_slot, child.state_slot)
            shared = parent.block_table[:num_full]
            self.block_pool.share(shared)
            child.block_table = list(shared)
            if has_partial:   # the last prompt block is still written to: copy it
                [block] = self.block_pool.allocate(1)
                self.copy_block(parent.block_table[num_full], block)
                child.block_table.append(block)
            parent.fork(child)
            self._hashes[child] = self._hashes[parent][:num_full]
            self.running.append(child)

    def place_computed(self, seq: Sequence, num_computed_tokens: int) -> bool:
        """Benchmark hook (`atomk31 bench latency`): admit the waiting `seq` as if its first
        `num_computed_tokens` tokens had been prefilled, without running them. It takes a state
        slot and the blocks covering those tokens and skips the prefix cache; the caller writes
        the cache rows and the KDA state. False, with nothing taken, when no slot, too few
        blocks or no room under max_num_seqs is left."""
        if seq not in self.waiting:
            raise ValueError(f"{seq!r} is not waiting; place a sequence right after adding it")
        if not 0 < num_computed_tokens < seq.num_tokens:
            raise ValueError(f"num_computed_tokens must be in 1..{seq.num_tokens - 1} (at least "
                             f"one token left to compute), got {num_computed_tokens}")
        num_blocks = -(-num_computed_tokens // self.block_size)
        if (self.state_pool.num_free_slots == 0 or len(self.running) >= self.max_num_seqs
                or not self.block_pool.can_allocate(num_blocks)):
            return False
        self.waiting.remove(seq)
        seq.state_slot = self.state_pool.allocate()
        seq.block_table = self.block_pool.allocate(num_blocks)
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_computed_tokens
        self.running.append(seq)
        return True

    # -- internals ----------------------------------------------------------------------
    def _can_fork(self, has_partial: bool) -> bool:
        if len(self.running) >= self.max_num_seqs or self.state_pool.num_free_slots == 0:
            return False
        return not has_partial or (self.copy_block is not None
                                   and self.block_pool.can_allocate(1))

    def _admit(self, seq: Sequence) -> bool:
        """Give a waiting sequence a state slot and its cached prefix; False if none is free."""
        if self.state_pool.num_free_slots == 0:
            return False
        seq.state_slot = self.state_pool.allocate()
        seq.status = SequenceStatus.RUNNING
        tokens = seq.all_token_ids
        hashes = self._hash_blocks(seq)
        # at least the last token is computed, to get the logits of the next one
        # (none when prompt logprobs are wanted: every prompt position must be computed)
        max_reuse = 0 if seq.needs_prompt_logprobs else (len(tokens) - 1) // self.block_size
        n = usable_prefix(hashes[:max_reuse], self.block_pool, self.snapshots)
        if n:
            blocks = self.block_pool.lookup(hashes[:n])
            self.block_pool.acquire_cached(blocks)
            seq.block_table = blocks
            self.state_pool.copy(self.snapshots.get(hashes[n - 1]), seq.state_slot)
        seq.num_computed_tokens = seq.num_cached_tokens = n * self.block_size
        self.block_pool.record_query(len(tokens), n * self.block_size)
        return True

    def _grow_or_preempt(self, seq: Sequence, n: int) -> bool:
        """Blocks for `n` more tokens of a running sequence, preempting newer ones if needed."""
        while not self._grow(seq, n):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _grow(self, seq: Sequence, n: int) -> bool:
        needed = -(-(seq.num_computed_tokens + n) // self.block_size) - len(seq.block_table)
        if needed <= 0:
            return True
        if not self.block_pool.can_allocate(needed):
            return False
        seq.block_table = seq.block_table + self.block_pool.allocate(needed)
        return True

    def _preempt(self, seq: Sequence) -> None:
        logger.debug("preempting %s at %d tokens", seq.request_id, seq.num_tokens)
        self.num_preemptions += 1
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.PREEMPTED
        seq.num_computed_tokens = 0
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.block_table:
            self.block_pool.free(seq.block_table)
            seq.block_table = []
        if seq.state_slot is not None:
            self.state_pool.free(seq.state_slot)
            seq.state_slot = None

    def _hash_blocks(self, seq: Sequence) -> list[int]:
        """Chained hashes of the sequence's full blocks, extended incrementally."""
        hashes = self._hashes.setdefault(seq, [])
        tokens, bs = seq.all_token_ids, self.block_size
        for b in range(len(hashes), len(tokens) // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[b * bs:(b + 1) * bs]))
        return hashes

    def _plan(self, seq: Sequence, n: int) -> ScheduledSequence:
        """The step's work for `seq`, with a KDA snapshot at each block boundary it crosses
        that is worth one (module docstring)."""
        item = ScheduledSequence(seq, n)
        start, bs = seq.num_computed_tokens, self.block_size
        hashes = self._hash_blocks(seq)
        prompt_end, every = seq.num_prompt_tokens // bs, self.snapshot_interval_blocks
        for boundary in range(start // bs + 1, (start + n) // bs + 1):
            if boundary != prompt_end and not (every and boundary % every == 0):
                continue
            slot = self.snapshots.reserve(hashes[boundary - 1])
            if slot is not None:
                item.snapshots.append((boundary * bs - start, slot, hashes[boundary - 1]))
        return item
