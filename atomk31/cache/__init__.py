"""The engine's cache: packed MLA block rows, block pool with prefix caching, KDA state slots,
KDA prefix snapshots and the memory planner that sizes them (DESIGN.md §4, MODEL_SPEC §7)."""

from atomk31.cache.block_pool import BlockPool, NoFreeBlocksError, hash_block
from atomk31.cache.layout import CacheLayoutSpec, MLACacheView, PackedLayout
from atomk31.cache.planner import CachePlan, plan_cache
from atomk31.cache.snapshots import SnapshotIndex, usable_prefix
from atomk31.cache.state_pool import KDAStatePool, KDAStateSpec, NoFreeSlotsError

__all__ = [
    "BlockPool",
    "CacheLayoutSpec",
    "CachePlan",
    "KDAStatePool",
    "KDAStateSpec",
    "MLACacheView",
    "NoFreeBlocksError",
    "NoFreeSlotsError",
    "PackedLayout",
    "SnapshotIndex",
    "hash_block",
    "plan_cache",
    "usable_prefix",
]
