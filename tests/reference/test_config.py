"""The oracle's config reading (MODEL_SPEC §2, §9 #9, §9 #13, §9 #14)."""

from collections.abc import Callable
from typing import Any

import pytest

from atomk31.reference import parse_config

TinyConfigFactory = Callable[..., dict[str, Any]]


def test_tiny_config_layer_plan_is_zero_based(make_tiny_config: TinyConfigFactory) -> None:
    config = parse_config(make_tiny_config())
    assert config.mla_layer_ids == (3, 7)
    assert config.kda_layer_ids == (0, 1, 2, 4, 5, 6)
    assert [config.is_moe_layer(layer) for layer in range(8)] == [False] + [True] * 7
    assert [layer for layer in range(8) if config.closes_attn_res_block(layer)] == [0, 3, 6]
    assert config.index_topk == 64 and config.situ_beta == 4.0 and config.situ_linear_beta == 25.0


def test_flat_and_nested_configs_read_the_same(make_tiny_config: TinyConfigFactory) -> None:
    nested = make_tiny_config()
    flat = make_tiny_config()["text_config"]
    quantization = flat.pop("quantization_config")
    root_quantized = {"quantization_config": quantization, **flat}   # may sit at the root instead
    assert parse_config(nested) == parse_config(flat) == parse_config(root_quantized)


def test_null_situ_betas_and_missing_index_topk(make_tiny_config: TinyConfigFactory) -> None:
    nulls = {"activation_situ_beta": None, "activation_situ_linear_beta": None}
    root = make_tiny_config(nulls, removed=("index_topk",))
    config = parse_config(root)
    assert config.situ_beta == 1.0                             # §9 #14
    assert config.situ_linear_beta is None
    assert config.index_topk is None                           # plain K3: dense MLA, §9 #13


def test_unsupported_variants_are_all_listed_in_one_error(make_tiny_config: TinyConfigFactory) -> None:
    root = make_tiny_config({"hidden_act": "silu", "mla_use_nope": False, "num_expert_group": 2})
    root["text_config"]["linear_attn_config"]["use_full_rank_gate"] = False
    with pytest.raises(ValueError) as error:
        parse_config(root)
    message = str(error.value)
    expected = (
        "hidden_act must be 'situ', got 'silu'",
        "mla_use_nope",
        "use_full_rank_gate",
        "num_expert_group must be 1",
    )
    for field in expected:
        assert field in message


def test_layer_lists_must_be_disjoint_and_cover_every_layer(make_tiny_config: TinyConfigFactory) -> None:
    root = make_tiny_config()
    root["text_config"]["linear_attn_config"]["kda_layers"] = [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match=r"overlap at 1-based \[4\]"):
        parse_config(root)


def test_indexer_rope_and_bad_head_dim_are_rejected(make_tiny_config: TinyConfigFactory) -> None:
    root = make_tiny_config({"index_rope_head_dim": 64, "index_head_dim": 96})
    with pytest.raises(ValueError, match="index_head_dim must be a multiple of 128") as error:
        parse_config(root)
    assert "index_rope_head_dim must be absent, 0 or null" in str(error.value)


def test_attn_res_block_size_must_be_positive_or_null(make_tiny_config: TinyConfigFactory) -> None:
    with pytest.raises(ValueError, match="attn_res_block_size must be an int >= 1 or null, got 0"):
        parse_config(make_tiny_config({"attn_res_block_size": 0}))


def test_missing_field_is_named(make_tiny_config: TinyConfigFactory) -> None:
    with pytest.raises(ValueError, match="missing field 'vocab_size'"):
        parse_config(make_tiny_config(removed=("vocab_size",)))
