"""KDA prefix snapshots: reserve/commit, LRU eviction, pinning, capacity, usable_prefix."""

import pytest
import torch

from atomk31.cache.block_pool import BlockPool
from atomk31.cache.snapshots import SnapshotIndex, usable_prefix
from atomk31.cache.state_pool import KDAStatePool, KDAStateSpec

SPEC = KDAStateSpec(num_kda_layers=2, num_heads=1, head_dim=4, conv_width=4, conv_channels=4)


def _pool(num_slots: int) -> KDAStatePool:
    return KDAStatePool(SPEC, num_slots=num_slots, device="cpu")


def _take(snapshots: SnapshotIndex, block_hash: int) -> int:
    slot = snapshots.reserve(block_hash)
    assert slot is not None
    snapshots.commit(block_hash)
    return slot


def test_snapshot_restores_the_exact_state() -> None:
    pool = _pool(3)
    snapshots = SnapshotIndex(pool, capacity=1)
    request = pool.allocate()
    generator = torch.Generator().manual_seed(0)
    pool.recurrent[:, request] = torch.randn(pool.recurrent[:, request].shape, generator=generator)
    pool.conv[:, request] = torch.randn(pool.conv[:, request].shape).bfloat16()
    slot = snapshots.reserve(11)
    pool.copy(request, slot)
    assert snapshots.get(11) is None  # not visible before commit
    snapshots.commit(11)
    later = pool.allocate()
    pool.copy(snapshots.get(11), later)
    assert torch.equal(pool.recurrent[:, later], pool.recurrent[:, request])
    assert torch.equal(pool.conv[:, later], pool.conv[:, request])


def test_reserve_an_existing_hash_is_a_no_op() -> None:
    snapshots = SnapshotIndex(_pool(4), capacity=2)
    slot = _take(snapshots, 5)
    assert snapshots.reserve(5) is None
    assert snapshots.get(5) == slot and snapshots.num_snapshots == 1
    assert snapshots.contains(5) and not snapshots.contains(6)


def test_lru_eviction_frees_the_least_recently_used_slot() -> None:
    pool = _pool(4)
    snapshots = SnapshotIndex(pool, capacity=2)
    slot_a = _take(snapshots, 1)
    _take(snapshots, 2)
    assert snapshots.get(1) == slot_a  # 1 is now more recent than 2
    slot_c = _take(snapshots, 3)
    assert snapshots.contains(1) and not snapshots.contains(2) and snapshots.contains(3)
    assert snapshots.num_snapshots == 2 and pool.num_free_slots == 2
    assert slot_c != slot_a


def test_pinned_and_reserved_snapshots_are_not_evicted() -> None:
    pool = _pool(4)
    snapshots = SnapshotIndex(pool, capacity=2)
    _take(snapshots, 1)
    snapshots.pin(1)
    assert snapshots.reserve(2) is not None  # reserved, not yet committed: pinned
    assert snapshots.reserve(3) is None  # both held snapshots are pinned
    assert snapshots.contains(1) and snapshots.contains(2) and not snapshots.contains(3)
    snapshots.commit(2)
    assert snapshots.reserve(3) is not None  # evicts 2, the unpinned one
    assert not snapshots.contains(2)
    snapshots.unpin(1)
    with pytest.raises(ValueError, match="unpin without a matching pin"):
        snapshots.unpin(1)


def test_capacity_zero_never_reserves() -> None:
    pool = _pool(2)
    snapshots = SnapshotIndex(pool, capacity=0)
    assert snapshots.reserve(1) is None and snapshots.num_snapshots == 0
    assert pool.num_free_slots == 2


def test_state_pool_exhaustion_evicts_a_snapshot() -> None:
    pool = _pool(2)
    snapshots = SnapshotIndex(pool, capacity=2)
    _take(snapshots, 1)
    request = pool.allocate()  # the last free slot goes to a request
    assert snapshots.reserve(2) is not None  # capacity allows 2, so it evicts 1 for a slot
    assert not snapshots.contains(1)
    snapshots.pin(2)
    assert snapshots.reserve(3) is None
    pool.free(request)


def test_discard_and_clear_free_their_slots() -> None:
    pool = _pool(3)
    snapshots = SnapshotIndex(pool, capacity=3)
    snapshots.reserve(1)  # abandoned write
    _take(snapshots, 2)
    _take(snapshots, 3)
    snapshots.pin(3)
    snapshots.discard(1)
    assert pool.num_free_slots == 1
    snapshots.clear()  # drops 2; keeps pinned 3
    assert snapshots.num_snapshots == 1 and snapshots.contains(3)
    assert pool.num_free_slots == 2
    with pytest.raises(ValueError, match="no snapshot is held for this block hash"):
        snapshots.commit(99)


def test_usable_prefix_needs_cached_blocks_and_a_snapshot() -> None:
    block_pool = BlockPool(num_blocks=8, block_size=2)
    snapshots = SnapshotIndex(_pool(4), capacity=4)
    tokens = list(range(9))
    hashes = block_pool.block_hashes(tokens)  # 4 full blocks
    blocks = block_pool.allocate(5)
    for block, block_hash in zip(blocks, hashes):
        block_pool.register_full(block, block_hash)
    assert usable_prefix(hashes, block_pool, snapshots) == 0  # blocks but no snapshot
    _take(snapshots, hashes[0])
    _take(snapshots, hashes[2])
    assert usable_prefix(hashes, block_pool, snapshots) == 3
    assert usable_prefix(hashes[:2], block_pool, snapshots) == 1
    assert usable_prefix([], block_pool, snapshots) == 0
    pending = snapshots.reserve(hashes[3])
    assert pending is not None
    assert usable_prefix(hashes, block_pool, snapshots) == 3  # an unwritten one does not count
    snapshots.commit(hashes[3])
    assert usable_prefix(hashes, block_pool, snapshots) == 4
    # Fill the pool: the 4 never-cached blocks go first, then the tail blocks 3 and 2 are
    # evicted, so the snapshot at block 2 is useless without its latents.
    block_pool.free(blocks)
    block_pool.allocate(6)
    assert block_pool.lookup(hashes) == blocks[:2]
    assert usable_prefix(hashes, block_pool, snapshots) == 1
    disabled = BlockPool(num_blocks=8, block_size=2, enable_prefix_caching=False)
    assert usable_prefix(hashes, disabled, snapshots) == 0
