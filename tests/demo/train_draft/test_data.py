"""Blocks cut from a target batch (MODEL_SPEC §5.5): anchor then mask tokens at a..a+Tb-1, labels
the target's greedy tokens after each row (none past the sequence), Markov inputs the tokens
before each row, context visible up to a-1, block rows visible within their block only."""

import torch

from atomk31.demo.train.data import IGNORE
from atomk31.demo.train_draft.data import TargetBatch, anchors_of, cut_blocks

MASK = 99


def batch_of(lengths=(12, 9), num_prompt=(5, 4), width=12):
    ids = torch.arange(100, 100 + 2 * width).view(2, width)
    greedy = ids + 1000                         # "the target's token after position t"
    return TargetBatch(ids, torch.tensor(lengths), torch.tensor(num_prompt),
                       torch.zeros(2, width, 4), greedy, torch.tensor([0, 1]))


def test_a_block_reads_its_anchor_labels_and_markov_inputs():
    batch = batch_of()
    blocks = cut_blocks(batch, torch.tensor([[6, 8], [5, 7]]), 3, MASK)
    assert blocks.ids[0].tolist() == [106, MASK, MASK, 108, MASK, MASK]
    assert blocks.positions[1].tolist() == [5, 6, 7, 7, 8, 9]
    assert blocks.labels[0].tolist() == [1106, 1107, 1108, 1108, 1109, 1110]
    # sequence 1 has 9 tokens: the last label is the target's token after position 7
    assert blocks.labels[1].tolist() == [1117, 1118, 1119, 1119, IGNORE, IGNORE]
    assert blocks.previous[0].tolist() == [106, 1106, 1107, 108, 1108, 1109]


def test_blocks_see_the_context_before_their_anchor_and_their_own_rows():
    blocks = cut_blocks(batch_of(), torch.tensor([[6, 8], [5, 7]]), 3, MASK)
    visible = blocks.visible[0]                 # [Q, T + Q]
    assert visible[:3, :12].sum(dim=1).tolist() == [6, 6, 6]
    assert visible[3:, :12].sum(dim=1).tolist() == [8, 8, 8]
    assert visible[:3, 12:].tolist() == [[True] * 3 + [False] * 3] * 3
    assert visible[3:, 12:].tolist() == [[False] * 3 + [True] * 3] * 3


def test_anchors_lie_in_the_completion():
    batch = batch_of()
    anchors = anchors_of(batch, 200, torch.Generator().manual_seed(0))
    for row, (low, length) in enumerate(zip(batch.num_prompt.tolist(), batch.lengths.tolist())):
        assert set(anchors[row].tolist()) == set(range(low, length - 1))
