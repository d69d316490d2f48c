"""The trainer's batched block pass equals the float32 oracle's one-request pass (MODEL_SPEC
§5.5), block by block, for blocks of several anchors sharing one sequence's context."""

import json

import torch

from atomk31.checkpoint.dspark_writer import write_draft
from atomk31.demo.shipped import SHIPPED_DIR
from atomk31.demo.train_draft.data import TargetBatch, cut_blocks
from atomk31.demo.train_draft.draft_config import draft_config
from atomk31.demo.train_draft.draft_model import TrainableDraft
from atomk31.reference.dspark import ReferenceDraft
from atomk31.speculative_config import DraftConfig

MASK = 2000


def test_every_block_of_the_batched_pass_equals_the_oracle(tmp_path):
    config_json = draft_config("toy", json.loads((SHIPPED_DIR / "config.json").read_text()), MASK)
    draft = TrainableDraft(DraftConfig.from_dict(config_json))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():                  # BF16-exact weights: the checkpoint holds the same
        for parameter in draft.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
            parameter.copy_(parameter.bfloat16().float())
    reference = ReferenceDraft.from_pretrained(write_draft(config_json, draft.state_dict(), tmp_path))
    length, rows = 30, 4
    embed = torch.randn(2048, 256, generator=generator)
    lm_head = 0.05 * torch.randn(2048, 256, generator=generator)
    aux = torch.randn(2, length, 5 * 256, generator=generator)
    ids = torch.randint(0, 1000, (2, length), generator=generator)
    batch = TargetBatch(ids, torch.tensor([length, length]), torch.tensor([10, 12]), aux,
                        torch.randint(0, 1000, (2, length), generator=generator),
                        torch.tensor([0, 1]))
    anchors = torch.tensor([[12, 20], [15, 25]])
    blocks = cut_blocks(batch, anchors, rows, MASK)
    with torch.no_grad():
        base = draft.block_logits(aux, blocks.ids, blocks.positions, blocks.visible, embed,
                                  lm_head)
    for s in range(2):
        for k in range(2):
            a = int(anchors[s, k])
            expected = reference.block_logits(aux[s, :a], int(ids[s, a]), rows, embed, lm_head)
            torch.testing.assert_close(base[s, k * rows:(k + 1) * rows], expected,
                                       atol=1e-4, rtol=1e-4)
