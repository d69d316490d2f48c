"""Training batches: task instances rendered and tokenized as the server does, padded, with the
positions whose next token is supervised and the query rows that train the indexer.

A step's data is a pure function of (seed, step): batch `s` of family `f` takes instances
`s * batch_size + i` of the train stream (seed, f), so a run is reproducible whatever the number
of data-loader workers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from atomk31.checkpoint import Tokenizer
from atomk31.demo.render import encode_example
from atomk31.demo.tasks import FAMILIES, Example, generate

IGNORE = -100
KL_ROWS = 64              # indexer KL rows per sequence: the answer's first, then random ones
PAD_MULTIPLE = 64         # pad lengths to whole KDA chunks
SHORT_GROUPS = 3          # the mixed batch runs as this many length-sorted micro-batches


@dataclass
class EncodedExample:
    ids: list[int]
    num_prompt: int
    family: str


@dataclass
class Batch:
    """input_ids, targets [B, T] (IGNORE where unsupervised), token_mask [B, T] bool,
    kl_rows [B, R] int64 and kl_valid [B, R] bool, families [B] (index into FAMILIES).

    A micro-batch of a larger set: `ce_denominator` is the set's number of supervised tokens
    (its CE sum divided by it gives the set's mean), `share` its share of the set's sequences.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    token_mask: torch.Tensor
    kl_rows: torch.Tensor
    kl_valid: torch.Tensor
    families: torch.Tensor
    ce_denominator: int = 0
    share: float = 1.0

    def _map(self, function) -> "Batch":
        tensors = (self.input_ids, self.targets, self.token_mask, self.kl_rows, self.kl_valid,
                   self.families)
        return Batch(*(function(t) for t in tensors), self.ce_denominator, self.share)

    def split(self, max_positions: int) -> list["Batch"]:
        """This batch cut along the batch dim into pieces of at most `max_positions` padded
        positions (at least one sequence each), shares divided accordingly."""
        size, length = self.input_ids.shape
        per_piece = max(1, max_positions // length)
        if per_piece >= size:
            return [self]
        pieces = []
        for start in range(0, size, per_piece):
            rows = slice(start, start + per_piece)
            piece = self._map(lambda t: t[rows])
            piece.share = self.share * piece.input_ids.shape[0] / size
            pieces.append(piece)
        return pieces

    def to(self, device: torch.device) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> "Batch":
        """Called by the DataLoader's pinning thread."""
        return self._map(lambda t: t.pin_memory())

    @property
    def num_tokens(self) -> int:
        return int(self.token_mask.sum())


def encode(example: Example, tokenizer: Tokenizer) -> EncodedExample:
    ids, num_prompt = encode_example(example, tokenizer)
    return EncodedExample(ids, num_prompt, example.family)


def collate(examples: list[EncodedExample], pad_id: int, rng: random.Random) -> Batch:
    """Right-padded batch; the target at position t is token t + 1 when it belongs to the
    completion."""
    length = max(len(e.ids) for e in examples)
    length = math.ceil(length / PAD_MULTIPLE) * PAD_MULTIPLE
    size, rows = len(examples), min(KL_ROWS, length)
    input_ids = torch.full((size, length), pad_id, dtype=torch.long)
    targets = torch.full((size, length), IGNORE, dtype=torch.long)
    token_mask = torch.zeros(size, length, dtype=torch.bool)
    kl_rows = torch.zeros(size, rows, dtype=torch.long)
    kl_valid = torch.zeros(size, rows, dtype=torch.bool)
    for i, example in enumerate(examples):
        n = len(example.ids)
        input_ids[i, :n] = torch.tensor(example.ids)
        targets[i, example.num_prompt - 1:n - 1] = torch.tensor(example.ids[example.num_prompt:])
        token_mask[i, :n] = True
        answer = list(range(example.num_prompt - 1, n - 1))[: rows // 2]
        others = rng.sample(range(n), min(n, rows - len(answer)))
        chosen = (answer + others)[:rows]
        kl_rows[i, :len(chosen)] = torch.tensor(chosen)
        kl_valid[i, :len(chosen)] = True
    families = torch.tensor([FAMILIES.index(e.family) for e in examples])
    num_supervised = int((targets != IGNORE).sum())
    return Batch(input_ids, targets, token_mask, kl_rows, kl_valid, families, num_supervised)


def collate_groups(examples: list[EncodedExample], pad_id: int, rng: random.Random,
                   num_groups: int) -> list[Batch]:
    """`examples` sorted by length and cut into `num_groups` micro-batches (less padding), with
    the set's supervised-token count and each group's share filled in."""
    ordered = sorted(examples, key=lambda e: len(e.ids))
    size = math.ceil(len(ordered) / num_groups)
    batches = [collate(ordered[i:i + size], pad_id, rng) for i in range(0, len(ordered), size)]
    total = sum(b.ce_denominator for b in batches)
    for batch in batches:
        batch.ce_denominator = total
        batch.share = batch.input_ids.shape[0] / len(ordered)
    return batches


@dataclass(frozen=True)
class DataPlan:
    """What each step trains on.

    short_batch: sequences of the mixed batch, families drawn with `family_weights` (passkey
    ones at `short_passkey_tokens`); long_tokens: the token budget of the passkey batch, whose
    prompt length is drawn log-uniformly from `long_passkey_tokens` (0 disables it).
    """

    short_batch: int
    family_weights: tuple[float, ...]
    short_passkey_tokens: tuple[int, int]
    long_tokens: int
    long_passkey_tokens: tuple[int, int]


def _draw_tokens(rng: random.Random, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def step_examples(plan: DataPlan, seed: int, step: int) -> tuple[list[Example], list[Example]]:
    """The (short, long) instances of one step."""
    rng = random.Random(f"atomk31-demo/batch/{seed}/{step}")
    short = []
    for i in range(plan.short_batch):
        family = rng.choices(FAMILIES, weights=plan.family_weights)[0]
        index = step * plan.short_batch + i
        short.append(generate(family, "train", seed, index,
                              num_tokens=_draw_tokens(rng, plan.short_passkey_tokens)))
    long = []
    if plan.long_tokens:
        num_tokens = _draw_tokens(rng, plan.long_passkey_tokens)
        count = min(64, max(1, plan.long_tokens // num_tokens))
        # a separate index space from the short batch's passkey instances
        long = [generate("passkey", "train", seed + 1_000_003, step * 64 + i, num_tokens=num_tokens)
                for i in range(count)]
    return short, long


class StepBatches(torch.utils.data.IterableDataset):
    """Endless (short, long) batches from step `start`; worker w of W makes steps w, w+W, ..."""

    def __init__(self, plan: DataPlan, seed: int, tokenizer_dir: str, pad_id: int,
                 start: int = 0) -> None:
        super().__init__()
        self.plan, self.seed, self.tokenizer_dir, self.pad_id = plan, seed, tokenizer_dir, pad_id
        self.start = start

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        tokenizer = Tokenizer.from_pretrained(self.tokenizer_dir)
        step = self.start + worker
        while True:
            short, long = step_examples(self.plan, self.seed, step)
            rng = random.Random(f"atomk31-demo/rows/{self.seed}/{step}")
            batches = collate_groups([encode(e, tokenizer) for e in short], self.pad_id, rng,
                                     SHORT_GROUPS)
            if long:
                batches += collate_groups([encode(e, tokenizer) for e in long], self.pad_id, rng, 1)
            yield batches
            step += num_workers
