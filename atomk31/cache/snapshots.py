"""KDA prefix snapshots: the KDA state after a cached prefix, keyed by that prefix's block hash.

Latent blocks alone cannot serve a prefix-cache hit on K3.1: the 69 KDA layers carry a
recurrent state (MODEL_SPEC §4.4) that summarises the whole prefix. So at a block boundary the
engine copies the request's state into a snapshot slot, keyed by the chained hash of the
block that ends there (block_pool.py). A later request whose prompt starts with the same
blocks restores it with `state_pool.copy(snapshot_slot, request_slot)` and skips the prefix:
no recompute, and the state is bit-identical to the one a full prefill would have built.

Lifecycle of one snapshot:
    slot = snapshots.reserve(h)        # None: already held, capacity 0, or all pinned
    ... write the state into `slot` (state_pool.copy, or a kernel writing boundary states)
    snapshots.commit(h)                # from now on get(h) returns it
A reserved snapshot is pinned until committed (or discarded), so it is neither evicted nor
read half-written. `pin`/`unpin` hold a committed one (e.g. between scheduling a hit and the
copy that restores it).
"""

from collections import OrderedDict
from dataclasses import dataclass

from atomk31.cache.block_pool import BlockPool
from atomk31.cache.state_pool import KDAStatePool, NoFreeSlotsError


@dataclass
class _Snapshot:
    slot: int
    is_ready: bool = False  # committed: the slot holds the full state
    num_pins: int = 0

    @property
    def is_pinned(self) -> bool:
        return not self.is_ready or self.num_pins > 0


class SnapshotIndex:
    """Maps a block hash (the chained hash of the prefix ending at a block boundary) to a KDA
    state slot holding the state after that prefix.

    Slots come from the KDAStatePool; at most `capacity` are held; least-recently-used
    snapshots are evicted (their slot freed) when a new one is needed and not every held
    snapshot is pinned.
    """

    def __init__(self, pool: KDAStatePool, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"snapshot capacity must be >= 0, got {capacity}")
        self.pool = pool
        self.capacity = capacity
        self._snapshots: OrderedDict[int, _Snapshot] = OrderedDict()  # oldest use first

    @property
    def num_snapshots(self) -> int:
        """Snapshots held, committed or still being written."""
        return len(self._snapshots)

    def contains(self, block_hash: int) -> bool:
        """True if a snapshot for `block_hash` is held, committed or still being written."""
        return block_hash in self._snapshots

    def is_ready(self, block_hash: int) -> bool:
        """True if a committed snapshot for `block_hash` is held (does not touch the LRU)."""
        snapshot = self._snapshots.get(block_hash)
        return snapshot is not None and snapshot.is_ready

    def get(self, block_hash: int) -> int | None:
        """The slot of the committed snapshot for `block_hash`, or None; marks it recently used."""
        snapshot = self._snapshots.get(block_hash)
        if snapshot is None or not snapshot.is_ready:
            return None
        self._snapshots.move_to_end(block_hash)
        return snapshot.slot

    def reserve(self, block_hash: int) -> int | None:
        """A slot to write the snapshot for `block_hash` into, pinned until `commit`.

        None when there is nothing to do (the hash is already held) or no room: capacity 0,
        or every held snapshot pinned. Evicts the least recently used unpinned snapshot
        when at capacity or when the state pool has no free slot.
        """
        if self.capacity == 0 or block_hash in self._snapshots:
            return None
        if len(self._snapshots) >= self.capacity and not self._evict_one():
            return None
        while True:
            try:
                slot = self.pool.allocate()
                break
            except NoFreeSlotsError:
                if not self._evict_one():
                    return None
        self._snapshots[block_hash] = _Snapshot(slot)
        return slot

    def commit(self, block_hash: int) -> None:
        """The reserved snapshot for `block_hash` has been written: make it visible to `get`."""
        self._held(block_hash).is_ready = True
        self._snapshots.move_to_end(block_hash)

    def discard(self, block_hash: int) -> None:
        """Drop the snapshot for `block_hash` (e.g. its write was abandoned) and free its slot."""
        snapshot = self._held(block_hash)
        del self._snapshots[block_hash]
        self.pool.free(snapshot.slot)

    def pin(self, block_hash: int) -> None:
        """Keep the snapshot for `block_hash` from eviction until a matching `unpin`."""
        self._held(block_hash).num_pins += 1

    def unpin(self, block_hash: int) -> None:
        snapshot = self._held(block_hash)
        if snapshot.num_pins == 0:
            raise ValueError("unpin without a matching pin for this block hash")
        snapshot.num_pins -= 1

    def clear(self) -> None:
        """Drop every unpinned snapshot and free its slot (pinned ones stay)."""
        for block_hash in [h for h, s in self._snapshots.items() if not s.is_pinned]:
            self.discard(block_hash)

    def _evict_one(self) -> bool:
        """Evict the least recently used unpinned snapshot; False if every one is pinned."""
        for block_hash, snapshot in self._snapshots.items():
            if not snapshot.is_pinned:
                self.discard(block_hash)
                return True
        return False

    def _held(self, block_hash: int) -> _Snapshot:
        snapshot = self._snapshots.get(block_hash)
        if snapshot is None:
            raise ValueError("no snapshot is held for this block hash; reserve it first")
        return snapshot


def usable_prefix(hashes: list[int], block_pool: BlockPool, snapshots: SnapshotIndex) -> int:
    """Number of leading blocks of `hashes` a new request can reuse without any recompute.

    That is the longest prefix whose latent blocks are all cached AND whose end boundary has
    a committed KDA snapshot (the MLA pages and the KDA state must describe the same
    prefix). The caller still computes at least the prompt's last token (it needs its
    logits), so it passes the hashes of at most `(num_prompt_tokens - 1) // block_size`
    blocks.
    """
    num_cached = len(block_pool.lookup(hashes))
    for num_blocks in range(num_cached, 0, -1):
        if snapshots.is_ready(hashes[num_blocks - 1]):
            return num_blocks
    return 0
