"""KDA state slots: sizes (MODEL_SPEC §7.3), zeroed allocation, copy, free."""

import pytest
import torch

from atomk31.cache.state_pool import KDAStatePool, KDAStateSpec, NoFreeSlotsError

SMALL = KDAStateSpec(num_kda_layers=3, num_heads=2, head_dim=4, conv_width=4, conv_channels=8)


def _fill_random(pool: KDAStatePool, slot: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    conv = torch.randn(pool.conv[:, slot].shape, generator=generator)
    pool.conv[:, slot] = conv.to(pool.conv.dtype)
    pool.recurrent[:, slot] = torch.randn(pool.recurrent[:, slot].shape, generator=generator)


def test_full_model_bytes_per_slot_matches_spec_7_3() -> None:
    full = KDAStateSpec(num_kda_layers=69, num_heads=96, head_dim=128, conv_width=4,
                        conv_channels=12288)
    assert full.bytes_per_slot() == 449_372_160
    tp8 = KDAStateSpec(num_kda_layers=69, num_heads=12, head_dim=128, conv_width=4,
                       conv_channels=1536)
    assert tp8.bytes_per_slot() == 56_171_520
    assert KDAStateSpec(1, 96, 128, 4, 12288).bytes_per_slot() == 6_512_640


def test_spec_rejects_wrong_conv_channels() -> None:
    with pytest.raises(ValueError, match=r"conv_channels must be num_heads \* head_dim = 8"):
        KDAStateSpec(num_kda_layers=1, num_heads=2, head_dim=4, conv_width=4, conv_channels=6)


def test_pool_shapes_and_dtypes() -> None:
    pool = KDAStatePool(SMALL, num_slots=5, device="cpu")
    assert tuple(pool.conv.shape) == (3, 5, 3, 24) and pool.conv.dtype == torch.bfloat16
    assert tuple(pool.recurrent.shape) == (3, 5, 2, 4, 4)
    assert pool.recurrent.dtype == torch.float32
    allocated = pool.conv.numel() * 2 + pool.recurrent.numel() * 4
    assert allocated == 5 * SMALL.bytes_per_slot()


def test_allocate_zeroes_a_reused_slot() -> None:
    pool = KDAStatePool(SMALL, num_slots=1, device="cpu")
    slot = pool.allocate()
    _fill_random(pool, slot, seed=0)
    pool.free(slot)
    again = pool.allocate()
    assert again == slot
    assert not pool.conv[:, again].any() and not pool.recurrent[:, again].any()


def test_allocate_until_empty_then_free() -> None:
    pool = KDAStatePool(SMALL, num_slots=3, device="cpu")
    slots = [pool.allocate() for _ in range(3)]
    assert sorted(slots) == [0, 1, 2] and pool.num_free_slots == 0 and pool.usage() == 1.0
    with pytest.raises(NoFreeSlotsError, match="all 3 KDA state slots are in use"):
        pool.allocate()
    pool.free(slots[1])
    assert pool.num_free_slots == 1 and pool.usage() == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=f"KDA state slot {slots[1]} is free"):
        pool.free(slots[1])
    with pytest.raises(ValueError, match=r"slot must be in 0..2, got 3"):
        pool.free(3)


def test_copy_all_layers_and_nothing_else() -> None:
    pool = KDAStatePool(SMALL, num_slots=4, device="cpu")
    src, dst, bystander = pool.allocate(), pool.allocate(), pool.allocate()
    _fill_random(pool, src, seed=1)
    _fill_random(pool, bystander, seed=2)
    bystander_before = (pool.conv[:, bystander].clone(), pool.recurrent[:, bystander].clone())
    pool.copy(src, dst)
    assert torch.equal(pool.conv[:, dst], pool.conv[:, src])
    assert torch.equal(pool.recurrent[:, dst], pool.recurrent[:, src])
    assert pool.recurrent[:, dst].any()
    assert torch.equal(pool.conv[:, bystander], bystander_before[0])
    assert torch.equal(pool.recurrent[:, bystander], bystander_before[1])
    # The copy is a copy, not an alias: later writes to src leave dst alone.
    pool.recurrent[:, src] += 1.0
    assert not torch.equal(pool.recurrent[:, dst], pool.recurrent[:, src])
    pool.copy(dst, dst)  # no-op
    with pytest.raises(ValueError, match="slot 3 is free; allocate it first"):
        pool.copy(src, 3)


def test_empty_pool() -> None:
    pool = KDAStatePool(SMALL, num_slots=0, device="cpu")
    assert pool.num_free_slots == 0 and pool.usage() == 0.0
    with pytest.raises(NoFreeSlotsError):
        pool.allocate()


@pytest.mark.gpu
def test_state_pool_on_gpu() -> None:
    pool = KDAStatePool(SMALL, num_slots=2, device="cuda")
    src, dst = pool.allocate(), pool.allocate()
    pool.recurrent[:, src] = 2.0
    pool.copy(src, dst)
    assert pool.recurrent.is_cuda and bool((pool.recurrent[:, dst] == 2.0).all())


def test_copy_reaches_scratch_slots_and_refuses_free_ones():
    """The graph replay check backs a request's state up into a scratch slot and restores it
    (engine/graph_check.py): copy() takes scratch slots either way, and still refuses a free
    request slot."""
    pool = KDAStatePool(KDAStateSpec(1, 2, 4, 4, 8), 2, "cpu", num_scratch_slots=2)
    slot = pool.allocate()
    pool.recurrent[:, slot] = 3.0
    backup = pool.scratch_slot(1)
    pool.copy(slot, backup)
    pool.recurrent[:, slot] = 0.0
    pool.copy(backup, slot)
    assert torch.equal(pool.recurrent[:, slot], torch.full_like(pool.recurrent[:, slot], 3.0))
    with pytest.raises(ValueError, match="free"):
        pool.copy(slot, 1 - slot)
