"""The trainer end to end at toy size: a few steps on CPU, the loss falls, and the checkpoint it
writes loads in the reference and in the engine, which generate the same tokens."""

import json

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.checkpoint import Tokenizer
from atomk31.demo.render import prompt_segments
from atomk31.demo.tasks import generate
from atomk31.demo.train.__main__ import main
from atomk31.reference import ReferenceModel


@pytest.mark.slow
def test_toy_run_learns_and_writes_a_checkpoint_both_paths_load(tmp_path):
    out = tmp_path / "run"
    assert main(["--seed", "0", "--out", str(out), "--profile", "toy", "--steps", "8",
                 "--device", "cpu"]) == 0
    result = json.loads((out / "train_result.json").read_text())
    losses = [entry["loss"] for entry in result["log"]]
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0], losses
    assert result["stopped_by"] == "steps" and result["total_steps"] == 8
    assert set(result["best"]["accuracy"]) >= {"arithmetic", "tools", "chat", "score"}
    checkpoint = out / "checkpoint"
    assert (checkpoint / "train_result.json").is_file()

    tokenizer = Tokenizer.from_pretrained(checkpoint)
    prompt = tokenizer.encode_segments(prompt_segments(generate("tools", "eval", 0, 0)))
    assert len(prompt) > 32                                   # past the toy index_topk
    with torch.inference_mode():
        expected = ReferenceModel.from_pretrained(checkpoint, index_key_format="fp8").greedy(
            torch.tensor(prompt), 4)
    llm = LLM(checkpoint, block_size=16, kernel_backend="torch")
    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert list(output[0].outputs[0].token_ids) == expected


def test_steps_must_be_positive():
    with pytest.raises(SystemExit, match="--steps must be >= 1, got 0"):
        main(["--out", "/nonexistent", "--steps", "0"])
    with pytest.raises(SystemExit, match="--peak-lr must be > 0, got 0.0"):
        main(["--out", "/nonexistent", "--peak-lr", "0"])


@pytest.mark.parametrize("weights", ["0.5,0.5,0", "1,1,-1,1", "0,0,0,0", "a,b,c,d"])
def test_bad_family_weights_are_refused(weights, capsys):
    with pytest.raises(SystemExit):
        main(["--out", "/nonexistent", "--family-weights", weights])
    assert "expected 4 non-negative weights, not all 0, for arithmetic, passkey, tools, " \
           "chat" in capsys.readouterr().err


def test_family_weights_replace_the_profiles(tmp_path):
    from atomk31.demo.train.loop import RunOptions, Trainer
    from atomk31.demo.train.settings import PROFILES

    trainer = Trainer(RunOptions(seed=0, out=tmp_path, profile="toy", device="cpu",
                                 family_weights=(0.2, 0.1, 0.6, 0.1), peak_lr=1e-4))
    assert trainer.settings.data.family_weights == (0.2, 0.1, 0.6, 0.1)
    assert trainer.settings.peak_lr == 1e-4 and trainer.schedule.peak_lr == 1e-4
    assert trainer.settings.data.short_batch == PROFILES["toy"].data.short_batch
    assert Trainer(RunOptions(seed=0, out=tmp_path / "b", profile="toy", device="cpu")
                   ).settings == PROFILES["toy"]
