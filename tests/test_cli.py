"""The command line: generate (engine and oracle agree), info, make-checkpoint."""

import re

from atomk31.cli import main


def _tokens(output: str) -> list[str]:
    return re.findall(r"^tokens: (.*)$", output, flags=re.MULTILINE)


def test_generate_with_the_engine_equals_the_reference(tiny_checkpoint, capsys):
    args = ["generate", "--model", str(tiny_checkpoint), "--prompt", "Hello there",
            "--prompt", "x", "--max-tokens", "4", "--block-size", "16"]
    assert main(args) == 0
    engine = _tokens(capsys.readouterr().out)
    assert main(args + ["--reference"]) == 0
    assert engine == _tokens(capsys.readouterr().out) and len(engine) == 2


def test_info_lists_every_op_with_its_backend(capsys):
    assert main(["info", "--kernel-backend", "torch", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for op in ("indexer_score", "sparse_mla", "kda_prefill", "moe_experts_mxfp4"):
        assert re.search(rf"^\s+{op}( \[\w+\])?\s+torch", out, flags=re.MULTILINE), out
    assert "decode steps: eager (no GPU)" in out


def test_make_checkpoint_snake_and_kebab_flags(tmp_path, capsys):
    assert main(["make-checkpoint", "--preset", "tiny", "--seed", "3", "--out",
                 str(tmp_path / "a"), "--max_shard_bytes", str(8 << 20)]) == 0
    assert (tmp_path / "a" / "model.safetensors.index.json").is_file()
