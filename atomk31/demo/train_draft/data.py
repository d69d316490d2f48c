"""What the draft trains on: task text run through the frozen target, and blocks cut from it.

The sequences are task-family conversations rendered and tokenized as the server does (the demo
trainer's `encode`), teacher-forced through the target. The labels are the target's own greedy
next tokens at every position, not the text's: the draft must predict what greedy verification
accepts. Conditioning on the text rather than on the target's free-running outputs is the cheap
choice (no generation loop), and on these tasks the two agree almost everywhere (the target's
argmax equals the completion text on more than 99% of its tokens).

A block with anchor position a stands for the decode step whose last final target state is at
p = a - 1 (MODEL_SPEC §5.5): its rows are `[x_a, mask, ...]` at positions a..a+Tb-1, row j is
labelled with the target's greedy token after position a+j, and its Markov input is the token
at a+j (the anchor, then the labels before it). Anchors lie in the completion, where decoding
happens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from atomk31.checkpoint import Tokenizer
from atomk31.demo.tasks import FAMILIES, generate
from atomk31.demo.train.data import IGNORE, EncodedExample, encode
from atomk31.demo.train_draft.target import FrozenTarget


@dataclass
class TargetBatch:
    """Right-padded sequences with the target's outputs: input_ids [B, T], lengths and
    num_prompt [B], aux [B, T, n*D], greedy [B, T], families [B] (indices into FAMILIES)."""

    input_ids: torch.Tensor
    lengths: torch.Tensor
    num_prompt: torch.Tensor
    aux: torch.Tensor
    greedy: torch.Tensor
    families: torch.Tensor


@dataclass
class Blocks:
    """K blocks of Tb rows per sequence, flattened to Q = K * Tb rows: ids, positions,
    previous (the Markov input) and labels [B, Q] (IGNORE past the sequence), visible
    [B, Q, T + Q]."""

    ids: torch.Tensor
    positions: torch.Tensor
    previous: torch.Tensor
    labels: torch.Tensor
    visible: torch.Tensor
    block_rows: int


def draw_examples(rng: random.Random, split: str, seed: int, count: int,
                  family_weights: tuple[float, ...], passkey_tokens: tuple[int, int],
                  tokenizer: Tokenizer, start_index: int) -> list[EncodedExample]:
    """`count` encoded instances, families drawn with `family_weights` (FAMILIES order)."""
    examples = []
    for i in range(count):
        family = rng.choices(FAMILIES, weights=family_weights)[0]
        tokens = int(math.exp(rng.uniform(*map(math.log, passkey_tokens))))
        examples.append(encode(generate(family, split, seed, start_index + i, num_tokens=tokens),
                               tokenizer))
    return examples


def run_target(target: FrozenTarget, examples: list[EncodedExample], pad_id: int,
               tap_layer_ids: tuple[int, ...]) -> TargetBatch:
    """Pad `examples` into one batch and run the target over it."""
    length = max(len(e.ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    for i, example in enumerate(examples):
        input_ids[i, :len(example.ids)] = torch.tensor(example.ids)
    lengths = torch.tensor([len(e.ids) for e in examples])
    token_mask = torch.arange(length)[None, :] < lengths[:, None]
    outputs = target.run(input_ids.to(target.embed.device), token_mask.to(target.embed.device),
                         tap_layer_ids)
    return TargetBatch(input_ids=input_ids, lengths=lengths,
                       num_prompt=torch.tensor([e.num_prompt for e in examples]),
                       aux=outputs.aux.cpu(), greedy=outputs.greedy.cpu(),
                       families=torch.tensor([FAMILIES.index(e.family) for e in examples]))


def anchors_of(batch: TargetBatch, num_blocks: int, generator: torch.Generator) -> torch.Tensor:
    """[B, K] anchor positions, uniform over each completion's positions num_prompt..n-2."""
    low = batch.num_prompt
    span = (batch.lengths - 1 - low).clamp(min=1)
    draws = torch.rand(len(low), num_blocks, generator=generator)
    return low[:, None] + (draws * span[:, None]).long()


def cut_blocks(batch: TargetBatch, anchors: torch.Tensor, block_rows: int,
               mask_token_id: int) -> Blocks:
    """The blocks at `anchors` [B, K], Tb = `block_rows` rows each."""
    b, k = anchors.shape
    t = batch.input_ids.shape[1]
    offsets = torch.arange(block_rows)
    positions = (anchors[:, :, None] + offsets).reshape(b, -1)                  # [B, Q]
    label_at = positions.clamp(max=t - 1)
    labels = torch.gather(batch.greedy, 1, label_at)
    labels[positions > (batch.lengths[:, None] - 2)] = IGNORE
    anchor_ids = torch.gather(batch.input_ids, 1, anchors)                       # [B, K]
    ids = torch.full((b, k, block_rows), mask_token_id, dtype=torch.long)
    ids[:, :, 0] = anchor_ids
    previous_greedy = torch.gather(batch.greedy, 1, (positions - 1).clamp(max=t - 1))
    previous = previous_greedy.view(b, k, block_rows).clone()
    previous[:, :, 0] = anchor_ids
    context = torch.arange(t)[None, None, :] < anchors.repeat_interleave(block_rows, 1)[:, :, None]
    block_of = torch.arange(k).repeat_interleave(block_rows)
    same_block = (block_of[:, None] == block_of[None, :]).expand(b, -1, -1)
    return Blocks(ids=ids.view(b, -1), positions=positions, previous=previous.view(b, -1),
                  labels=labels, visible=torch.cat([context, same_block], dim=-1),
                  block_rows=block_rows)
