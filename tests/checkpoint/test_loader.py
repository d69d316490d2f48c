"""load_checkpoint / iter_checkpoint: round trips, sharding, and the one-error problem listing."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from atomk31.checkpoint import (
    CheckpointError,
    expected_tensors,
    iter_checkpoint,
    load_checkpoint,
    make_checkpoint,
)
from atomk31.config import ModelConfig
from atomk31.quant import dequantize_mxfp4

P = "language_model.model."
# write_variant(tensors) -> a checkpoint directory (conftest.py)
VariantWriter = Callable[[dict[str, torch.Tensor]], Path]
SHARD_BYTES = 4 << 20


@pytest.fixture(scope="session")
def tiny_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset with the session checkpoint's seed, forced into ~4 MiB shards."""
    return make_checkpoint("tiny", seed=1234, out=tmp_path_factory.mktemp("tiny_sharded"),
                           max_shard_bytes=SHARD_BYTES, progress=False)


def test_load_tiny_round_trip(
    tiny_checkpoint: Path, tiny_config: ModelConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    loaded = load_checkpoint(tiny_checkpoint, tiny_config, progress=False)
    specs = expected_tensors(tiny_config)
    assert list(loaded) != [] and set(loaded) == set(specs) == set(tiny_tensors)
    for name, tensor in loaded.items():
        assert tensor.dtype == tiny_tensors[name].dtype, name
        assert torch.equal(tensor, tiny_tensors[name]), name
        assert tensor.dtype in specs[name].dtypes and specs[name].accepts_shape(tensor.shape)
    # Experts stay packed as stored: uint8 [I, latent/2] codes and [I, latent/32] scales.
    packed = loaded[P + "layers.1.block_sparse_moe.experts.15.w1.weight_packed"]
    scale = loaded[P + "layers.1.block_sparse_moe.experts.15.w1.weight_scale"]
    assert packed.dtype == scale.dtype == torch.uint8
    assert packed.shape == (128, 64) and scale.shape == (128, 4)


def test_load_sharded_checkpoint_equals_single_file(
    tiny_checkpoint: Path, tiny_sharded: Path, tiny_config: ModelConfig
) -> None:
    index = json.loads((tiny_sharded / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 2
    assert shard_files[0] == f"model-00001-of-{len(shard_files):05d}.safetensors"
    assert not (tiny_sharded / "model.safetensors").exists()
    single = load_checkpoint(tiny_checkpoint, tiny_config, progress=False)
    sharded = load_checkpoint(tiny_sharded, tiny_config, progress=False)
    assert set(single) == set(sharded)
    assert all(torch.equal(single[n], sharded[n]) for n in single)


def test_iter_checkpoint_streams_shard_by_shard(
    tiny_sharded: Path, tiny_config: ModelConfig
) -> None:
    index = json.loads((tiny_sharded / "model.safetensors.index.json").read_text())
    files_in_yield_order = [index["weight_map"][name]
                            for name, _ in iter_checkpoint(tiny_sharded, tiny_config,
                                                           progress=False)]
    # Each shard is read once, completely, before the next: the file sequence is sorted.
    runs = [f for i, f in enumerate(files_in_yield_order)
            if i == 0 or f != files_in_yield_order[i - 1]]
    assert runs == sorted(set(files_in_yield_order))


def test_every_safetensors_file_is_read_without_an_index(
    tiny_sharded: Path, tiny_config: ModelConfig, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(tiny_sharded, tmp_path / "no_index"))
    (copy / "model.safetensors.index.json").unlink()
    loaded = load_checkpoint(copy, tiny_config, progress=False)
    assert set(loaded) == set(expected_tensors(tiny_config))


def test_missing_shard_file_is_named(
    tiny_sharded: Path, tiny_config: ModelConfig, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(tiny_sharded, tmp_path / "broken"))
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[1]
    num_lost = sum(1 for f in index["weight_map"].values() if f == lost)
    (copy / lost).unlink()
    with pytest.raises(CheckpointError, match=rf"missing from .*\n  {lost} \({num_lost} tensors"):
        load_checkpoint(copy, tiny_config, progress=False)


def test_no_weights_in_directory(tiny_config: ModelConfig, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no checkpoint in .*expected model.safetensors"):
        load_checkpoint(tmp_path, tiny_config, progress=False)


def test_one_error_lists_missing_unused_and_mismatched(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    deleted = P + "layers.2.self_attn.b_proj.weight"
    stray = P + "layers.2.self_attn.stray.weight"
    reshaped = P + "layers.3.self_attn.kv_a_layernorm.weight"
    retyped = P + "layers.0.mlp.up_proj.weight"
    del tiny_tensors[deleted]
    tiny_tensors[stray] = torch.zeros(3)
    tiny_tensors[reshaped] = torch.ones(511, dtype=torch.bfloat16)
    tiny_tensors[retyped] = tiny_tensors[retyped].to(torch.float16)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    error, message = caught.value, str(caught.value)
    assert error.missing == [deleted] and error.unused == [stray]
    assert len(error.mismatched) == 2 and error.rejected == []
    assert "4 problem(s)" in message
    assert f"{reshaped}: expected shape [512], dtype BF16; found shape [511], dtype BF16" in message
    assert f"{retyped}: expected shape [512, 256], dtype BF16; found shape [512, 256], dtype F16" \
        in message
    assert deleted in message and stray in message


def test_long_lists_are_summarised_by_pattern(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    experts = [n for n in tiny_tensors if ".layers.1.block_sparse_moe.experts." in n]
    assert len(experts) == 16 * 3 * 2
    for name in experts:
        del tiny_tensors[name]
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    message = str(caught.value)
    assert "missing tensors (96)" in message
    assert "layers.{l}.block_sparse_moe.experts.{e}.w2.weight_scale: 16 tensor(s)" in message
    assert len(message.splitlines()) < 15


def test_fp8_indexer_tensors_are_rejected(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    weight = P + "layers.3.self_attn.indexer.wk.weight"
    tiny_tensors[weight] = tiny_tensors[weight].to(torch.float8_e4m3fn)
    tiny_tensors[P + "layers.3.self_attn.indexer.wk.weight_scale_inv"] = torch.ones(1)
    with pytest.raises(CheckpointError, match=r"indexer\.wk\.weight: an FP8 indexer tensor "
                                              r"\(F8_E4M3\); the indexer stays BF16") as caught:
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    assert len(caught.value.rejected) == 2
    assert caught.value.unused == [] and caught.value.mismatched == []


def test_dequantized_expert_variant_is_accepted(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    expert = P + "layers.4.block_sparse_moe.experts.3.w2."
    packed = tiny_tensors.pop(expert + "weight_packed")
    scale = tiny_tensors.pop(expert + "weight_scale")
    dense = dequantize_mxfp4(packed, scale).to(torch.bfloat16)        # [latent 128, I 128]
    tiny_tensors[expert + "weight"] = dense
    loaded = load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    assert torch.equal(loaded[expert + "weight"], dense)
    assert expert + "weight_packed" not in loaded
    assert (P + "layers.4.block_sparse_moe.experts.3.w1.weight_packed") in loaded


def test_expert_in_both_forms_is_rejected(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    expert = P + "layers.4.block_sparse_moe.experts.3.w2."
    tiny_tensors[expert + "weight"] = torch.zeros(128, 128, dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match="keep one form per expert matrix"):
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)


def test_dequantized_expert_with_wrong_shape_is_a_mismatch(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    expert = P + "layers.4.block_sparse_moe.experts.3.w1."
    del tiny_tensors[expert + "weight_packed"], tiny_tensors[expert + "weight_scale"]
    tiny_tensors[expert + "weight"] = torch.zeros(128, 96, dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"w1\.weight: expected shape \[128, 128\]"):
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)


@pytest.mark.parametrize("shape", [(4,), (128,), (1, 1, 4, 1)], ids=["H", "K", "1x1xHx1"])
def test_a_log_of_any_shape_with_num_heads_entries(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter,
    shape: tuple[int, ...]
) -> None:
    tiny_tensors[P + "layers.0.self_attn.A_log"] = torch.zeros(shape, dtype=torch.bfloat16)
    loaded = load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    assert loaded[P + "layers.0.self_attn.A_log"].shape == shape


def test_a_log_with_too_few_entries_is_a_mismatch(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    tiny_tensors[P + "layers.0.self_attn.A_log"] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=r"A_log: expected any shape with >= 4 entries"):
        load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)


def test_vision_tensors_are_skipped(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    tiny_tensors["vision_tower.patch_embed.weight"] = torch.zeros(2, 2)
    tiny_tensors["mm_projector.proj.weight"] = torch.zeros(2, 2)
    loaded = load_checkpoint(write_variant(tiny_tensors), tiny_config, progress=False)
    assert not any(n.startswith(("vision_tower.", "mm_projector.")) for n in loaded)


def test_names_without_the_language_model_prefix_get_a_hint(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    renamed = {name.removeprefix("language_model."): t for name, t in tiny_tensors.items()}
    with pytest.raises(CheckpointError, match="hint: text tensor names start with "
                                              "'language_model.'"):
        load_checkpoint(write_variant(renamed), tiny_config, progress=False)


def test_dtype_map_converts_after_checking(tiny_checkpoint: Path, tiny_config: ModelConfig) -> None:
    loaded = load_checkpoint(tiny_checkpoint, tiny_config, progress=False,
                             dtype_map={torch.bfloat16: torch.float32})
    assert loaded[P + "embed_tokens.weight"].dtype == torch.float32
    assert loaded[P + "layers.1.block_sparse_moe.experts.0.w3.weight_packed"].dtype == torch.uint8
    with pytest.raises(ValueError, match="cannot convert torch.uint8"):
        load_checkpoint(tiny_checkpoint, tiny_config, dtype_map={torch.uint8: torch.float32})


def test_iter_checkpoint_checks_before_the_first_tensor(
    tiny_tensors: dict[str, torch.Tensor], tiny_config: ModelConfig, write_variant: VariantWriter
) -> None:
    del tiny_tensors[P + "norm.weight"]
    path = write_variant(tiny_tensors)
    with pytest.raises(CheckpointError, match=r"missing tensors \(1\)"):
        iter_checkpoint(path, tiny_config, progress=False)  # raises at the call, not on next()



def test_index_naming_a_tensor_its_shard_lacks(
    tiny_sharded: Path, tiny_config: ModelConfig, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(tiny_sharded, tmp_path / "bad_index"))
    index_path = copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"][P + "ghost.weight"] = sorted(set(index["weight_map"].values()))[0]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"lists 1 tensor\(s\) that their shard does not "
                                              r"hold:\n  .*ghost\.weight \(index says model-00001"):
        load_checkpoint(copy, tiny_config, progress=False)
    index_path.write_text("{not json")
    with pytest.raises(CheckpointError, match="is not a valid index"):
        load_checkpoint(copy, tiny_config, progress=False)


def test_a_file_that_is_not_safetensors(tiny_config: ModelConfig, tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(CheckpointError, match=r"is not a safetensors file \(shorter than 8"):
        load_checkpoint(tmp_path, tiny_config, progress=False)
    (tmp_path / "model.safetensors").write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{bad")
    with pytest.raises(CheckpointError, match="unreadable safetensors header"):
        load_checkpoint(tmp_path, tiny_config, progress=False)
