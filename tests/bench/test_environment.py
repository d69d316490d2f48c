"""atomk31/bench/environment.py: what a result file says about where it was measured."""

from __future__ import annotations

import json
import re

import torch

from atomk31.bench.environment import environment, git_commit, write_result_file


def test_environment_names_the_device_versions_and_commit():
    env = environment(torch.device("cpu"))
    assert env["device"] == "CPU" and env["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", env["date"])
    assert env["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", env["commit"])


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert git_commit(tmp_path) == ("unknown", None)


def test_result_files_hold_dtypes_and_paths_as_text(tmp_path):
    path = tmp_path / "deep" / "r.json"
    write_result_file(path, {"dtype": torch.bfloat16, "model": tmp_path, "n": 3})
    assert json.loads(path.read_text()) == {"dtype": "bfloat16", "model": str(tmp_path), "n": 3}
