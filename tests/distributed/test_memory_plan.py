"""Each rank reads only its slices of the checkpoint, and `weight_bytes_per_rank` says how many
bytes that is (issue 18: loading per rank; the figure `atomk31 info` prints)."""

import pytest
import torch

from atomk31.checkpoint.slices import CheckpointSlices
from atomk31.config import ModelConfig
from atomk31.distributed.layout import ParallelLayout
from atomk31.distributed.memory_plan import weight_bytes_per_rank
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model import K31Model


@pytest.mark.parametrize("layout", [
    ParallelLayout(1, 0), ParallelLayout(2, 1), ParallelLayout(4, 2, expert_parallel=True),
    ParallelLayout(4, 3, dcp_size=2), ParallelLayout(4, 1, dcp_size=4),
], ids=["single", "tp2-rank1", "ep4-rank2", "tp4-dcp2-rank3", "tp4-dcp4-rank1"])
def test_a_rank_reads_exactly_its_predicted_bytes(tiny_checkpoint, layout):
    config = ModelConfig.from_pretrained(tiny_checkpoint)
    tensors = CheckpointSlices.open(tiny_checkpoint, config, progress=False)
    K31Model(config, tensors, torch.float32, torch.device("cpu"),
             parallel=ParallelContext(layout=layout))
    assert len(tensors) == 0, "every tensor is taken or skipped"
    assert tensors.bytes_read == weight_bytes_per_rank(config, layout)
    if layout.tp_size > 1:
        whole = weight_bytes_per_rank(config, ParallelLayout())
        assert tensors.bytes_read < 0.75 * whole, "a rank must not read the whole checkpoint"


def test_a_tp2_rank_holds_its_heads_and_vocabulary(tiny_checkpoint):
    config = ModelConfig.from_pretrained(tiny_checkpoint)
    tensors = CheckpointSlices.open(tiny_checkpoint, config, progress=False)
    model = K31Model(config, tensors, torch.float32, torch.device("cpu"),
                     parallel=ParallelContext(layout=ParallelLayout(2, 1)))
    kda, mla = model.layers[0].mixer, model.layers[3].mixer
    assert kda.num_heads == 2 and kda.qkv_proj.linear.weight.shape == (3 * 2 * 128, 256)
    assert kda.o_proj.linear.weight.shape == (256, 2 * 128)
    assert mla.num_heads == mla.num_out_heads == 2 and mla.w_uk.shape == (2, 128, 512)
    assert mla.w_index_q.shape == (4 * 128, 256), "the indexer is replicated"
    assert model.lm_head.weight.shape == (512, 256)
