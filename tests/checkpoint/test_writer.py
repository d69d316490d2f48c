"""make_checkpoint / write_random_checkpoint: files, sharding, determinism, stale files."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from atomk31.checkpoint import (
    Tokenizer,
    load_checkpoint,
    make_checkpoint,
    preset_config,
    write_random_checkpoint,
)
from atomk31.checkpoint.random_init import plan_parameters
from atomk31.checkpoint.writer import plan_shards, shard_file_names
from atomk31.config import ModelConfig

P = "language_model.model."


def test_tiny_checkpoint_files(tiny_checkpoint: Path) -> None:
    names = sorted(f.name for f in tiny_checkpoint.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tiktoken.model", "tokenizer_config.json"]
    assert json.loads((tiny_checkpoint / "config.json").read_text()) == preset_config("tiny")
    generation = json.loads((tiny_checkpoint / "generation_config.json").read_text())
    tokenizer = Tokenizer.from_pretrained(tiny_checkpoint)
    assert generation["eos_token_id"] == tokenizer.token_id("<|end_of_msg|>") == 770
    assert generation["bos_token_id"] == tokenizer.token_id("[BOS]") == 768


def test_same_seed_same_bytes(tiny_checkpoint: Path, tmp_path: Path) -> None:
    again = make_checkpoint("tiny", seed=1234, out=tmp_path / "again", progress=False)
    assert (again / "model.safetensors").read_bytes() == \
        (tiny_checkpoint / "model.safetensors").read_bytes()


def test_sharded_write_then_single_file_rewrite(
    tiny_checkpoint: Path, tiny_config: ModelConfig, tmp_path: Path
) -> None:
    out = make_checkpoint("tiny", seed=5, out=tmp_path, max_shard_bytes=3 << 20, progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == shard_file_names(len(files)) and len(files) > 2
    stored = {}
    for file in files:
        stored.update({name: file for name in load_file(out / file)})
    assert stored == index["weight_map"]                                # every tensor once
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for f in files for t in load_file(out / f).values())
    # A rewrite into the same directory must not leave the old index or shards behind.
    make_checkpoint("tiny", seed=1234, out=out, progress=False)
    assert sorted(f.name for f in out.glob("model*")) == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == \
        (tiny_checkpoint / "model.safetensors").read_bytes()
    assert P + "norm.weight" in load_checkpoint(out, tiny_config, progress=False)


def test_shard_names() -> None:
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(3) == ["model-00001-of-00003.safetensors",
                                   "model-00002-of-00003.safetensors",
                                   "model-00003-of-00003.safetensors"]


def test_proxy_shard_plan_without_writing() -> None:
    plan = plan_parameters(ModelConfig.from_dict(preset_config("proxy")))
    limit = 2 << 30
    shards = plan_shards(plan, limit)
    assert [p for shard in shards for p in shard] == plan               # order kept
    for shard in shards:
        assert len(shard) == 1 or sum(p.nbytes for p in shard) <= limit
    # The embedding (2.35 GB) exceeds the limit, so it gets a shard of its own.
    assert shards[0] == [plan[0]] and plan[0].names == (P + "embed_tokens.weight",)
    assert 11 <= len(shards) <= 14


def test_a_plain_k3_variant_can_be_written(tmp_path: Path) -> None:
    config_json = preset_config("tiny")
    for key in ("index_n_heads", "index_head_dim", "index_topk"):
        del config_json["text_config"][key]
    out = write_random_checkpoint(config_json, seed=0, out=tmp_path, progress=False)
    config = ModelConfig.from_pretrained(out)
    assert not config.has_indexer
    loaded = load_checkpoint(out, config, progress=False)
    assert not any(".indexer." in name for name in loaded)


def test_invalid_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown checkpoint preset 'small'"):
        make_checkpoint("small", seed=0, out=tmp_path)
    with pytest.raises(ValueError, match="max_shard_bytes must be >= 1, got 0"):
        make_checkpoint("tiny", seed=0, out=tmp_path, max_shard_bytes=0)
