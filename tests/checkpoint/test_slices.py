"""CheckpointSlices (atomk31/checkpoint/slices.py): a rank reads whole tensors or slices of
them straight from the safetensors files, and counts the bytes it read (issue 18)."""

import pytest
import torch
from safetensors.torch import load_file

from atomk31.checkpoint.errors import CheckpointError
from atomk31.checkpoint.slices import CheckpointSlices, Shard
from atomk31.config import ModelConfig

NAME = "language_model.model.layers.0.self_attn.o_proj.weight"       # [256, 512]


@pytest.fixture()
def slices(tiny_checkpoint):
    config = ModelConfig.from_pretrained(tiny_checkpoint)
    return CheckpointSlices.open(tiny_checkpoint, config, progress=False)


@pytest.fixture(scope="module")
def stored(tiny_checkpoint):
    return load_file(tiny_checkpoint / "model.safetensors")


@pytest.mark.parametrize("shard", [Shard(0, 64, 128), Shard(1, 256, 512), Shard(1, 0, 512)],
                         ids=["rows", "columns", "whole-columns"])
def test_a_shard_reads_exactly_those_rows_or_columns(slices, stored, shard):
    got = slices.pop(NAME, shard)
    want = stored[NAME].narrow(shard.dim, shard.start, shard.stop - shard.start)
    assert torch.equal(got, want)
    assert slices.bytes_read == want.numel() * want.element_size()
    assert NAME not in slices, "a tensor is taken once"


def test_discarded_tensors_are_never_read(slices):
    slices.discard(NAME)
    assert NAME not in slices and slices.bytes_read == 0
    with pytest.raises(KeyError):
        slices.pop(NAME)


def test_a_checkpoint_that_does_not_match_is_refused_before_any_read(tiny_checkpoint):
    config = ModelConfig.from_pretrained(tiny_checkpoint).replace(num_hidden_layers=9)
    with pytest.raises(CheckpointError, match="layers.8"):
        CheckpointSlices.open(tiny_checkpoint, config, progress=False)
