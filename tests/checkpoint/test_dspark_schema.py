"""The DSpark draft checkpoint's tensors (atomk31/checkpoint/dspark_schema.py, MODEL_SPEC §5.2):
every problem reported at once; optional and ignored tensors (issue 21)."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from atomk31.checkpoint import CheckpointError, make_checkpoint
from atomk31.checkpoint.dspark_schema import expected_draft_tensors, load_draft_checkpoint
from atomk31.checkpoint.dspark_writer import draft_preset_config
from atomk31.speculative_config import DraftConfig


def test_the_schema_follows_spec_5_2_at_full_size():
    full = draft_preset_config("tiny-dspark")
    full.update(hidden_size=7168, num_hidden_layers=5, num_attention_heads=96,
                q_lora_rank=1536, intermediate_size=14336, vocab_size=163840, markov_rank=512,
                target_hidden_size=7168, target_layer_ids=[88, 89, 90, 91, 92],
                max_position_embeddings=1 << 20)
    specs = expected_draft_tensors(DraftConfig.from_dict(full))
    assert specs["context_proj.weight"].shape == (7168, 35840)
    assert specs["layers.4.self_attn.q_b_proj.weight"].shape == (18432, 1536)
    assert specs["layers.0.self_attn.kv_b_proj.weight"].shape == (24576, 512)
    assert specs["layers.0.self_attn.o_proj.weight"].shape == (7168, 12288)
    assert specs["layers.0.mlp.gate_proj.weight"].shape == (14336, 7168)
    assert specs["markov_head.markov_w2.weight"].shape == (163840, 512)
    assert not any("g_proj" in name for name in specs)       # the draft MLA is ungated
    assert len(specs) == 2 + 5 * 12 + 3


def test_every_problem_is_listed_and_extra_tensors_are_sorted_out(tmp_path):
    path = make_checkpoint("tiny-dspark", seed=0, out=tmp_path, progress=False)
    tensors = load_file(path / "model.safetensors")
    del tensors["final_norm.weight"]
    tensors["layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    tensors["layers.0.self_attn.g_proj.weight"] = torch.zeros(1, dtype=torch.bfloat16)
    tensors["lm_head.weight"] = torch.zeros(1024, 256, dtype=torch.bfloat16)     # ignored
    tensors["confidence_head.proj.weight"] = torch.zeros(1, 288, dtype=torch.float32)
    tensors["confidence_head.proj.bias"] = torch.zeros(1, dtype=torch.float32)
    save_file(tensors, path / "model.safetensors")
    config = DraftConfig.from_pretrained(path)
    with pytest.raises(CheckpointError) as info:
        load_draft_checkpoint(path, config)
    error = info.value
    assert error.missing == ["final_norm.weight"]
    assert error.unused == ["layers.0.self_attn.g_proj.weight"]
    assert error.mismatched == ["layers.0.mlp.up_proj.weight: expected shape [512, 256], dtype "
                                "BF16; found shape [3, 3], dtype BF16"]
    assert "regenerate it with `atomk31 make-checkpoint --preset tiny-dspark`" in str(error)
    del tensors["layers.0.self_attn.g_proj.weight"]
    tensors["final_norm.weight"] = torch.ones(256, dtype=torch.bfloat16)
    tensors["layers.0.mlp.up_proj.weight"] = torch.zeros(512, 256, dtype=torch.bfloat16)
    save_file(tensors, path / "model.safetensors")
    loaded = load_draft_checkpoint(path, config)
    assert "confidence_head.proj.weight" in loaded and "lm_head.weight" not in loaded
