"""`atomk31 info --model DIR --tensor-parallel-size 8 [--decode-context-parallel-size 8]` on
the real K3.1 config (MODEL_SPEC §2.3): the plan's figures against MODEL_SPEC §7 (issue 18)."""

import json

import pytest

from atomk31.cli import main
from k31_config import k31_pro_config

GB = 1e9


@pytest.fixture(scope="module")
def k31_dir(tmp_path_factory):
    """The full K3.1 Pro config.json (§2.3): the proxy's widths with 93 layers, 896 experts."""
    out = tmp_path_factory.mktemp("k31")
    (out / "config.json").write_text(json.dumps(k31_pro_config()))
    return out


def plan(capsys, k31_dir, *flags: str) -> dict[str, list[str]]:
    assert main(["info", "--target", "cpu", "--model", str(k31_dir), *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("distributed plan"))
    rows = {" ".join(line.split()[:2]): line.split() for line in lines[start + 5:start + 9]}
    return {"head": lines[start:start + 5], **rows}


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_tp8_and_dcp8_plans_match_the_spec_budget(capsys, k31_dir):
    tp8 = plan(capsys, k31_dir, "--tensor-parallel-size", "8", "--enable-expert-parallel")
    dcp8 = plan(capsys, k31_dir, "--tensor-parallel-size", "8", "--enable-expert-parallel",
                "--decode-context-parallel-size", "8")
    head = "\n".join(tp8["head"])
    assert "the checkpoint: 1,560.32 GB" in head                       # §7.4: 1.56 TB
    assert "KDA state per request per rank: 56,171,520 B" in head      # §7.3 at TP8
    weights = number(tp8["head"][1].split()[3])
    assert 195 <= weights <= 215, "§7.4: about 195 GB per GPU plus the replicated parts"
    # §7.2: every TP rank holds each token's whole row; DCP8 holds 1/8 of the tokens
    assert [number(v) for v in tp8["fp8 fp8"][2:5]] == [13824, 3168, 16992]
    assert [number(v) for v in dcp8["fp8 fp8"][2:5]] == [1728, 396, 2124]
    assert number(tp8["fp8 mxfp4"][4]) == 15456 and number(tp8["bf16 fp8"][4]) == 30816
    budget = (288 * 0.9 - weights) * GB
    assert number(tp8["fp8 fp8"][5]) == pytest.approx(budget / 16992, rel=1e-4)  # GB rounded
    # full 1M contexts: a few under TP8 (the seed: 3), about 8x the tokens under DCP8
    assert 1 <= int(tp8["fp8 fp8"][6]) <= 4
    assert number(dcp8["fp8 fp8"][5]) > 7 * number(tp8["fp8 fp8"][5])
    assert int(dcp8["fp8 mxfp4"][6]) >= 20


def test_a_plan_that_does_not_split_says_why(k31_dir):
    with pytest.raises(SystemExit, match="must divide --tensor-parallel-size"):
        main(["info", "--target", "cpu", "--model", str(k31_dir), "--tensor-parallel-size", "8",
              "--decode-context-parallel-size", "3"])
    with pytest.raises(SystemExit, match=r"num_attention_heads \(96\) must be divisible by "
                                         r"tensor_parallel_size \(7\)"):
        main(["info", "--target", "cpu", "--model", str(k31_dir), "--tensor-parallel-size", "7"])
