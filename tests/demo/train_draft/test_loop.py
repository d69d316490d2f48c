"""A toy-size distillation run of a few steps (the toy draft of a random toy-size target) writes
a draft that the engine's config check and checkpoint loader accept, with its result file; the
demo-size draft config fits the shipped target; the mask token is a reserved slot; a bad size is
refused; a run continues from a draft it wrote, and only from one of its own config."""

import dataclasses
import json

import pytest
import torch

from atomk31.checkpoint import Tokenizer
from atomk31.checkpoint.dspark_schema import load_draft_checkpoint
from atomk31.config import ModelConfig
from atomk31.demo.model_config import demo_config
from atomk31.demo.shipped import SHIPPED_DIR
from atomk31.demo.train.export import write_checkpoint
from atomk31.demo.train.model import DemoModel
from atomk31.demo.train_draft.draft_config import draft_config, mask_token_of
from atomk31.demo.train_draft.loop import DraftRunOptions, DraftTrainer
from atomk31.speculative_config import DraftConfig, resolve_speculative_config

TARGET = ModelConfig.from_dict(json.loads((SHIPPED_DIR / "config.json").read_text()))


@pytest.fixture(scope="module")
def toy_target(tmp_path_factory, demo_tokenizer_dir):
    config_json = demo_config("toy")
    model = DemoModel(ModelConfig.from_dict(config_json))
    return write_checkpoint(model, config_json, demo_tokenizer_dir,
                            tmp_path_factory.mktemp("toy") / "target")


def test_a_few_toy_steps_write_a_draft_the_engine_loads(tmp_path, toy_target):
    options = DraftRunOptions(target=toy_target, out=tmp_path / "draft", steps=3, size="toy",
                              sequences_per_batch=2, blocks_per_sequence=2,
                              steps_per_target_batch=2, eval_per_family=1,
                              family_weights=(0.0, 0.0, 0.0, 1.0), eval_families=("chat",))
    result = DraftTrainer(options).run()
    assert result["steps"] == 3 and result["history"][-1]["step"] == 3
    written = json.loads((tmp_path / "draft" / "train_result.json").read_text())
    assert set(written["best"]["acceptance_length"]) == {"3", "5", "7"}
    target = ModelConfig.from_dict(json.loads((toy_target / "config.json").read_text()))
    spec = resolve_speculative_config({"model": str(tmp_path / "draft"),
                                       "num_speculative_tokens": 5}, target, 4096)
    assert spec.draft.hidden_size == 128 and spec.draft.target_layer_ids == (0, 1)
    tensors = load_draft_checkpoint(tmp_path / "draft", spec.draft)
    assert tensors["markov_head.markov_w2.weight"].abs().sum() > 0   # trained away from zero

    further = DraftTrainer(dataclasses.replace(options, init_from=tmp_path / "draft"))
    state = further.draft.state_dict()
    assert all(torch.equal(state[name], tensors[name].float()) for name in tensors)
    with pytest.raises(ValueError, match="holds a draft of another config than this run's "
                                         "--size demo"):
        DraftTrainer(dataclasses.replace(options, size="demo", init_from=tmp_path / "draft"))


def test_the_demo_draft_config_fits_the_target():
    tokenizer = Tokenizer.from_pretrained(SHIPPED_DIR)
    mask = mask_token_of(tokenizer, TARGET.vocab_size)
    assert tokenizer.decode([mask]) == f"<|reserved_token_{mask}|>"
    config = DraftConfig.from_dict(draft_config("demo", json.loads(
        (SHIPPED_DIR / "config.json").read_text()), mask))
    assert config.problems_against(TARGET, TARGET.max_position_embeddings) == []
    assert config.target_layer_ids == (0, 1, 2, 3, 4)


def test_an_unknown_size_and_a_tokenizer_without_reserved_slots_are_refused():
    with pytest.raises(ValueError, match="unknown draft size 'huge'; expected one of"):
        draft_config("huge", {}, 0)

    class NoSlots:
        def decode(self, ids):
            return "x"

    with pytest.raises(ValueError, match="no reserved special slot for the draft's mask token"):
        mask_token_of(NoSlots(), 16)


def test_the_command_line_refuses_a_step_count_below_one(tmp_path):
    from atomk31.demo.train_draft.__main__ import main

    with pytest.raises(SystemExit, match="--steps must be >= 1, got 0"):
        main(["--target", str(tmp_path), "--out", str(tmp_path / "out"), "--steps", "0"])
