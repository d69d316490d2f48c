"""Loading checkpoints: sharded or not, MXFP4 or dequantized experts, missing tensors (MODEL_SPEC §3, §9 #16)."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from atomk31.reference import ReferenceModel, build_model_weights, load_config
from atomk31.reference.safetensors_io import read_text_tensors

TinyCheckpointWriter = Callable[..., Path]


def test_sharded_checkpoint_gives_the_same_logits(
    make_tiny_checkpoint: TinyCheckpointWriter, tiny_model: ReferenceModel, tiny_prompt: torch.Tensor
) -> None:
    sharded = ReferenceModel.from_pretrained(make_tiny_checkpoint("sharded", num_shards=3))
    assert torch.equal(sharded.forward(tiny_prompt[:20]), tiny_model.forward(tiny_prompt[:20]))


def test_dequantized_experts_give_the_same_logits(
    make_tiny_checkpoint: TinyCheckpointWriter, tiny_model: ReferenceModel, tiny_prompt: torch.Tensor
) -> None:
    dequantized = ReferenceModel.from_pretrained(make_tiny_checkpoint("dequantized", packed_experts=False))
    assert torch.equal(dequantized.forward(tiny_prompt[:20]), tiny_model.forward(tiny_prompt[:20]))


def test_reading_strips_the_prefix_skips_vision_and_converts_to_float32(tiny_checkpoint: Path) -> None:
    tensors = read_text_tensors(tiny_checkpoint)
    assert "lm_head.weight" in tensors and "model.embed_tokens.weight" in tensors
    assert not any("vision_tower" in name for name in tensors)
    assert tensors["model.layers.1.block_sparse_moe.experts.0.w1.weight_packed"].dtype == torch.uint8
    assert {t.dtype for t in tensors.values()} == {torch.float32, torch.uint8}


def test_padded_a_log_uses_the_first_num_heads_entries(tiny_checkpoint: Path, tiny_model: ReferenceModel) -> None:
    stored = read_text_tensors(tiny_checkpoint)["model.layers.0.self_attn.A_log"]
    assert stored.shape == (128,)
    kda = tiny_model.weights.layers[0].kda
    assert kda is not None and torch.equal(kda.A_log, stored[:4])


def test_missing_and_misshapen_tensors_are_named(tiny_checkpoint: Path) -> None:
    config = load_config(tiny_checkpoint)
    tensors = read_text_tensors(tiny_checkpoint)
    missing = dict(tensors)
    del missing["model.layers.3.self_attn.indexer.wk.weight"]
    expected = (
        r"missing tensor language_model.model.layers.3.self_attn.indexer.wk.weight"
        r" \(expected shape \[128, 256\]\)"
    )
    with pytest.raises(ValueError, match=expected):
        build_model_weights(missing, config)
    misshapen = dict(tensors)
    misshapen["model.layers.2.self_attn.b_proj.weight"] = torch.zeros(5, 256)
    with pytest.raises(ValueError, match=r"b_proj.weight must have shape \[4, 256\], got \[5, 256\]"):
        build_model_weights(misshapen, config)


def test_a_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected a model directory with config.json"):
        ReferenceModel.from_pretrained(tmp_path)
