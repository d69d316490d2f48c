"""Random DSpark drafts (atomk31/checkpoint/dspark_writer.py): `make-checkpoint --preset
tiny-dspark` writes the MODEL_SPEC §5.8 draft, loadable and deterministic (issue 21)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from atomk31.checkpoint import make_checkpoint
from atomk31.checkpoint.dspark_schema import expected_draft_tensors, load_draft_checkpoint
from atomk31.checkpoint.dspark_writer import draft_preset_config
from atomk31.cli import main
from atomk31.speculative_config import DraftConfig

SPEC_5_8 = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "q_lora_rank": 256, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 512,
            "vocab_size": 1024, "markov_rank": 32, "target_hidden_size": 256,
            "num_target_layers": 5, "target_layer_ids": [3, 4, 5, 6, 7], "mask_token_id": 1023,
            "rms_norm_eps": 1e-5}


def test_tiny_dspark_is_the_spec_config():
    config = draft_preset_config("tiny-dspark")
    assert {k: config[k] for k in SPEC_5_8} == SPEC_5_8
    assert config["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 1024, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0}
    with pytest.raises(ValueError, match="unknown draft preset 'huge'; expected one of "
                                         r"\['tiny-dspark'\]"):
        draft_preset_config("huge")


def test_make_checkpoint_cli_writes_a_loadable_deterministic_draft(tmp_path, capsys):
    assert main(["make-checkpoint", "--preset", "tiny-dspark", "--seed", "3",
                 "--out", str(tmp_path / "a")]) == 0
    assert "wrote the tiny-dspark checkpoint (seed 3)" in capsys.readouterr().out
    config = DraftConfig.from_pretrained(tmp_path / "a")
    tensors = load_draft_checkpoint(tmp_path / "a", config)
    specs = expected_draft_tensors(config)
    assert list(tensors) == list(specs)
    assert all(tuple(tensors[n].shape) == s.shape and tensors[n].dtype == torch.bfloat16
               for n, s in specs.items())
    assert tensors["context_proj.weight"].shape == (256, 5 * 256)
    assert tensors["markov_head.markov_w1.weight"].shape == (1024, 32)
    again = make_checkpoint("tiny-dspark", seed=3, out=tmp_path / "b", progress=False)
    other = make_checkpoint("tiny-dspark", seed=4, out=tmp_path / "c", progress=False)
    first, second = load_file(tmp_path / "a" / "model.safetensors"), load_file(
        again / "model.safetensors")
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert not torch.equal(first["context_proj.weight"],
                           load_file(other / "model.safetensors")["context_proj.weight"])
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model_type"] == "k3_dspark"


def test_write_draft_casts_to_the_schema_and_refuses_tensors_that_do_not_fit(tmp_path):
    from atomk31.checkpoint.dspark_writer import write_draft
    from atomk31.checkpoint.errors import CheckpointError

    config_json = draft_preset_config("tiny-dspark")
    specs = expected_draft_tensors(DraftConfig.from_dict(config_json))
    tensors = {name: torch.randn(spec.shape) for name, spec in specs.items()}   # float32
    write_draft(config_json, tensors, tmp_path / "good")
    stored = load_file(tmp_path / "good" / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    torch.testing.assert_close(stored["context_norm.weight"].float(),
                               tensors["context_norm.weight"].bfloat16().float())
    tensors["final_norm.weight"] = torch.ones(7)
    with pytest.raises(CheckpointError, match=r"(?s)does not match its config.json.*"
                                              r"final_norm.weight: expected shape \[256\]"):
        write_draft(config_json, tensors, tmp_path / "bad")
