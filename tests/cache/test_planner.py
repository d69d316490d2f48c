"""Memory planner: request states first, then snapshots, then blocks (MODEL_SPEC §7.2, §7.3)."""

import pytest

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.cache.planner import CachePlan, plan_cache
from atomk31.cache.state_pool import KDAStateSpec

GIB = 1024**3
K31_LAYOUT = PackedLayout(CacheLayoutSpec(block_size=128, num_mla_layers=24))
K31_STATE = KDAStateSpec(num_kda_layers=69, num_heads=96, head_dim=128, conv_width=4,
                         conv_channels=12288)
TINY_LAYOUT = PackedLayout(CacheLayoutSpec(block_size=16, num_mla_layers=2))
TINY_STATE = KDAStateSpec(num_kda_layers=3, num_heads=2, head_dim=128, conv_width=4,
                          conv_channels=256)


def test_full_model_plan() -> None:
    # §7.2: 16,992 B/token -> a 128-token row of 2,174,976 B; §7.3: 449,372,160 B per state.
    assert K31_LAYOUT.row_bytes == 128 * 16_992 == 2_174_976
    plan = plan_cache(100 * GIB, K31_LAYOUT, K31_STATE, max_num_seqs=4, max_model_len=131_072)
    # Snapshots: floor(0.1 * 100 GiB / 449,372,160 B) = floor(23.9) = 23.
    assert plan.num_snapshot_slots == 23
    assert plan.num_state_slots == 4 + 23
    assert plan.bytes_states == 27 * 449_372_160 == 12_133_048_320
    # Blocks: floor((107,374,182,400 - 12,133,048,320) / 2,174,976) = 43,789.
    assert plan.num_blocks == 43_789
    assert plan.bytes_blocks == 43_789 * 2_174_976


def test_full_model_plan_with_draft_rows_and_no_snapshots() -> None:
    layout = PackedLayout(CacheLayoutSpec(block_size=128, num_mla_layers=24, num_draft_layers=5))
    assert layout.row_bytes == 128 * (16_992 + 2_880)
    plan = plan_cache(100 * GIB, layout, K31_STATE, max_num_seqs=4, max_model_len=131_072,
                      snapshot_fraction=0.0)
    assert plan == CachePlan(num_blocks=41_506, num_state_slots=4, num_snapshot_slots=0,
                             bytes_blocks=41_506 * 2_543_616, bytes_states=4 * 449_372_160)


def test_budget_too_small_names_both_numbers_and_the_fix() -> None:
    message = (
        r"the cache budget of 8\.00 GiB holds less than 16 KDA states \(6\.70 GiB\) plus the "
        r"8192 blocks of one 1048576-token request \(16\.59 GiB\); lower --max-num-seqs / "
        r"--max-model-len or raise --gpu-memory-utilization"
    )
    with pytest.raises(ValueError, match=message):
        plan_cache(8 * GIB, K31_LAYOUT, K31_STATE, max_num_seqs=16, max_model_len=1_048_576)


def test_exact_minimum_budget_fits_with_no_snapshots() -> None:
    slot, row = TINY_STATE.bytes_per_slot(), TINY_LAYOUT.row_bytes
    minimum = 3 * slot + 2 * row  # 3 requests + ceil(17 / 16) = 2 blocks
    plan = plan_cache(minimum, TINY_LAYOUT, TINY_STATE, max_num_seqs=3, max_model_len=17)
    assert plan == CachePlan(num_blocks=2, num_state_slots=3, num_snapshot_slots=0,
                             bytes_blocks=2 * row, bytes_states=3 * slot)
    with pytest.raises(ValueError, match="holds less than 3 KDA states"):
        plan_cache(minimum - 1, TINY_LAYOUT, TINY_STATE, max_num_seqs=3, max_model_len=17)


def test_snapshots_never_take_the_blocks_of_one_full_request() -> None:
    slot, row = TINY_STATE.bytes_per_slot(), TINY_LAYOUT.row_bytes
    budget = 1 * slot + 4 * row + slot // 2  # half a slot spare: no room for a snapshot
    plan = plan_cache(budget, TINY_LAYOUT, TINY_STATE, max_num_seqs=1, max_model_len=64,
                      snapshot_fraction=0.9)
    assert plan.num_snapshot_slots == 0 and plan.num_blocks >= 4
    budget = 1 * slot + 4 * row + 2 * slot  # two slots spare, fraction asks for more
    plan = plan_cache(budget, TINY_LAYOUT, TINY_STATE, max_num_seqs=1, max_model_len=64,
                      snapshot_fraction=0.9)
    assert plan.num_snapshot_slots == 2 and plan.num_blocks == 4


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3, 0.6])
def test_plan_fits_the_budget(fraction: float) -> None:
    budget = 50 * TINY_STATE.bytes_per_slot() + 1_000 * TINY_LAYOUT.row_bytes + 12_345
    plan = plan_cache(budget, TINY_LAYOUT, TINY_STATE, max_num_seqs=5, max_model_len=100,
                      snapshot_fraction=fraction)
    assert plan.bytes_blocks + plan.bytes_states <= budget
    assert budget - plan.bytes_blocks - plan.bytes_states < TINY_LAYOUT.row_bytes  # no waste
    assert plan.num_state_slots == 5 + plan.num_snapshot_slots
    assert plan.num_snapshot_slots * TINY_STATE.bytes_per_slot() <= fraction * budget
    assert plan.num_blocks >= 7  # ceil(100 / 16)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"snapshot_fraction must be in \[0, 1\), got 1.0"):
        plan_cache(GIB, TINY_LAYOUT, TINY_STATE, 1, 16, snapshot_fraction=1.0)
    with pytest.raises(ValueError, match="max_num_seqs and max_model_len must be >= 1"):
        plan_cache(GIB, TINY_LAYOUT, TINY_STATE, 0, 16)


def test_model_without_kda_layers_plans_no_snapshots() -> None:
    no_kda = KDAStateSpec(num_kda_layers=0, num_heads=1, head_dim=4, conv_width=4,
                          conv_channels=4)
    plan = plan_cache(100 * TINY_LAYOUT.row_bytes, TINY_LAYOUT, no_kda, 2, 16)
    assert plan.num_snapshot_slots == 0 and plan.num_state_slots == 2
    assert plan.num_blocks == 100 and plan.bytes_states == 0
