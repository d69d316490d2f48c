"""Which share of the model each rank holds (distributed/layout.py), and the errors for sizes
that do not split (issue 18)."""

import pytest

from atomk31.config import ConfigError, EngineConfig, ModelConfig
from atomk31.checkpoint.presets import preset_config
from atomk31.distributed.layout import ParallelLayout, check_parallel, parallel_problems


@pytest.fixture(scope="module")
def tiny_config() -> ModelConfig:
    return ModelConfig.from_dict(preset_config("tiny"))


def test_tp4_dcp2_head_groups_and_shares():
    ranks = [ParallelLayout(4, t, 2) for t in range(4)]
    assert [r.dcp_rank for r in ranks] == [0, 1, 0, 1]
    assert [r.head_group for r in ranks] == [0, 0, 1, 1]
    assert [r.dcp_group_ranks() for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # a DCP group attends its head group's heads; each rank projects its TP heads, which lie
    # inside them
    assert [r.attention_head_range(96) for r in ranks] == [(0, 48), (0, 48), (48, 96), (48, 96)]
    assert [r.tp_range(96) for r in ranks] == [(0, 24), (24, 48), (48, 72), (72, 96)]


def test_expert_parallel_partitions_experts_and_keeps_them_whole():
    ep = ParallelLayout(8, 3, expert_parallel=True)
    assert ep.expert_range(896) == (336, 448) and ep.expert_channel_range(3072) == (0, 3072)
    tp = ParallelLayout(8, 3)
    assert tp.expert_range(896) == (0, 896) and tp.expert_channel_range(3072) == (1152, 1536)


def test_the_full_model_splits_eight_ways(tiny_config):
    full = ModelConfig.from_dict({**preset_config("proxy")})
    assert parallel_problems(full, 8, 8, True) == []
    assert parallel_problems(full, 8, 1, False) == []
    assert parallel_problems(tiny_config, 4, 4, False) == []


@pytest.mark.parametrize("tp,dcp,ep,message", [
    (3, 1, False, r"num_attention_heads \(4\) must be divisible by tensor_parallel_size \(3\)"),
    (8, 1, False, r"must leave a multiple of 32 channels per rank .* --enable-expert-parallel"),
    (3, 1, True, r"num_experts \(16\) must be divisible by tensor_parallel_size \(3\)"),
])
def test_sizes_that_do_not_split_are_named(tiny_config, tp, dcp, ep, message):
    with pytest.raises(ConfigError, match=message):
        check_parallel(tiny_config, tp, dcp, ep)


def test_head_groups_must_split_the_heads(tiny_config):
    problems = parallel_problems(tiny_config.replace(num_attention_heads=6, kda_num_heads=8),
                                 8, 2, True)
    assert any("number of head groups, tensor_parallel_size / decode_context_parallel_size (4)"
               in p for p in problems), problems


@pytest.mark.parametrize("options,message", [
    (dict(tensor_parallel_size=0), r"tensor_parallel_size must be an integer >= 1, got 0"),
    (dict(tensor_parallel_size=4, decode_context_parallel_size=3),
     r"decode_context_parallel_size must divide tensor_parallel_size \(4\).*got 3"),
    (dict(distributed_timeout_s=0), r"distributed_timeout_s must be > 0"),
    (dict(token_sharded_prefill_min_tokens=0), r"token_sharded_prefill_min_tokens must be >= 1"),
])
def test_parallel_flags_are_validated(options, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model="m", **options)
