"""Block bookkeeping: free list, reference counts and content-hash prefix caching.

Technique after nano-vllm's BlockManager (GeeeekExplorer/nano-vllm
`nanovllm/engine/block_manager.py`): a block of `block_size` tokens is identified, once full,
by a chained hash `h_i = H(h_{i-1}, tokens of block i)`, so one hash names a whole prefix. A
block whose reference count drops to 0 keeps its hash and stays a prefix-cache hit until a
fresh allocation evicts it (least recently freed first).

How the engine uses it for a new request (KDA snapshots: see snapshots.py):

    hashes = pool.block_hashes(prompt)                  # full blocks only
    n = usable_prefix(hashes, pool, snapshots)          # cached latents AND a KDA snapshot
    cached = pool.lookup(hashes[:n]); pool.acquire_cached(cached)
    fresh = pool.allocate(num_blocks_needed - n)
    pool.record_query(len(prompt), n * block_size)      # once, when the request is admitted
    ... as each block fills: pool.register_full(block, hash_block(parent_hash, its_tokens))
    ... when the request ends: pool.free(block_table)

Hashes are 128-bit BLAKE2b digests of little-endian int64 token ids: deterministic across
processes (unlike Python's `hash()`), and wide enough that a collision, which would silently
serve another prefix's cache, is not a practical concern.
"""

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence

_HASH_BYTES = 16  # 128-bit block hashes
_ROOT_HASH = 0  # parent of block 0


class NoFreeBlocksError(RuntimeError):
    """Raised when more blocks are asked for than are free (the scheduler should preempt)."""


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: H(parent_hash, token_ids); parent None for block 0.

    Exposed so the engine can hash each block once, as it fills, instead of rehashing the
    whole sequence.
    """
    parent = _ROOT_HASH if parent_hash is None else parent_hash
    digest = hashlib.blake2b(digest_size=_HASH_BYTES)
    digest.update(parent.to_bytes(_HASH_BYTES, "little"))
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(digest.digest(), "little")


class BlockPool:
    """Reference-counted blocks `0..num_blocks-1` with a prefix cache keyed by block hash."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(
                f"block_size must be a power of two, got {block_size}; "
                "pass --block-size 64 or 128"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        # Free blocks in two queues: never-cached ones are handed out first; cached ones are
        # kept in the order they were freed, so eviction takes the least recently freed.
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # -- allocation ---------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks with reference count 0, whether or not they still hold a cached prefix."""
        return len(self._free_uncached) + len(self._free_cached)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free_blocks

    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks, each with reference count 1 and no hash.

        Takes never-cached free blocks first, then evicts the least recently freed cached
        ones. Raises NoFreeBlocksError if fewer than `n` blocks are free.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks, got {n}")
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"asked for {n} blocks, only {self.num_free_blocks} of {self.num_blocks} are "
                "free; free or preempt a sequence first, or plan a larger cache"
            )
        blocks = []
        for _ in range(n):
            if self._free_uncached:
                block = self._free_uncached.popleft()
            else:
                block, _ = self._free_cached.popitem(last=False)
                self._evict(block)
            self._ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each block; a block reaching 0 becomes free.

        A freed block keeps its hash (still a prefix-cache hit until evicted). Blocks are
        released last to first, so a sequence's tail is evicted before its head: a later
        request can only use a head-first prefix.
        """
        for block in reversed(blocks):
            self._check_block(block)
            if self._ref_counts[block] == 0:
                raise ValueError(
                    f"block {block} is already free; each block must be freed once per "
                    "reference (allocate or acquire_cached)"
                )
            self._ref_counts[block] -= 1
            if self._ref_counts[block] > 0:
                continue
            if self._block_hash[block] is None:
                self._free_uncached.append(block)
            else:
                self._free_cached[block] = None  # newest end of the eviction order

    def share(self, blocks: list[int]) -> None:
        """Take one more reference on each in-use block: a forked sequence (n > 1) reads the
        full prompt blocks of the sequence it forked from. Each reference is freed once."""
        for block in blocks:
            self._check_block(block)
            if self._ref_counts[block] == 0:
                raise ValueError(f"block {block} is free; share only blocks a sequence holds")
        for block in blocks:
            self._ref_counts[block] += 1

    def ref_count(self, block: int) -> int:
        self._check_block(block)
        return self._ref_counts[block]

    def usage(self) -> float:
        """Fraction of blocks in use (reference count > 0); 0.0 for an empty pool."""
        if self.num_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_blocks

    # -- prefix cache -------------------------------------------------------------------

    def block_hashes(
        self, token_ids: Sequence[int], num_full_blocks: int | None = None
    ) -> list[int]:
        """Chained hashes of the first `num_full_blocks` full blocks (default: all full ones).

        A partial last block is never hashed: its content can still change.
        """
        num_available = len(token_ids) // self.block_size
        if num_full_blocks is None:
            num_full_blocks = num_available
        if not 0 <= num_full_blocks <= num_available:
            raise ValueError(
                f"num_full_blocks must be in 0..{num_available} for {len(token_ids)} tokens "
                f"at block_size {self.block_size}, got {num_full_blocks}"
            )
        hashes: list[int] = []
        parent: int | None = None
        for i in range(num_full_blocks):
            tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = hash_block(parent, tokens)
            hashes.append(parent)
        return hashes

    def lookup(self, hashes: list[int]) -> list[int]:
        """Blocks of the longest prefix of `hashes` that is cached; takes no reference.

        Pure: it changes neither reference counts, eviction order nor statistics, so the
        scheduler may ask again before it commits (then `acquire_cached`, `record_query`).
        """
        if not self.enable_prefix_caching:
            return []
        blocks = []
        for block_hash in hashes:
            block = self._hash_to_block.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def acquire_cached(self, blocks: list[int]) -> None:
        """Take one reference on each cached block (a free one leaves the free list)."""
        for block in blocks:
            self._check_block(block)
            if self._ref_counts[block] == 0:
                if block not in self._free_cached:
                    raise ValueError(
                        f"block {block} is free and holds no cached prefix; acquire only "
                        "blocks that lookup() returned, in the same scheduling step"
                    )
                del self._free_cached[block]
            self._ref_counts[block] += 1

    def register_full(self, block: int, block_hash: int) -> None:
        """Remember that in-use `block` is full and holds the prefix named by `block_hash`.

        If another block already holds this hash, the first one stays the cached copy and
        `block` remains unhashed (it is freed as a plain block).
        """
        if not self.enable_prefix_caching:
            return
        self._check_block(block)
        if self._ref_counts[block] == 0:
            raise ValueError(
                f"block {block} is free; register_full takes a block a sequence holds"
            )
        current = self._block_hash[block]
        if current is not None:
            if current != block_hash:
                raise ValueError(
                    f"block {block} is already registered under another hash; a full "
                    "block's tokens cannot change"
                )
            return
        if block_hash in self._hash_to_block:
            return
        self._hash_to_block[block_hash] = block
        self._block_hash[block] = block_hash

    def is_cached(self, block_hash: int) -> bool:
        return self.enable_prefix_caching and block_hash in self._hash_to_block

    # -- statistics ---------------------------------------------------------------------

    def record_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request: its prompt length and how many tokens were reused."""
        if not 0 <= num_hit_tokens <= num_tokens:
            raise ValueError(
                f"need 0 <= num_hit_tokens <= num_tokens, got {num_hit_tokens} and {num_tokens}"
            )
        self.num_queried_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    def hit_rate(self) -> float:
        """Prefix-cache hit rate over recorded queries (hit tokens / queried tokens)."""
        if self.num_queried_tokens == 0:
            return 0.0
        return self.num_hit_tokens / self.num_queried_tokens

    # -- internals ----------------------------------------------------------------------

    def _evict(self, block: int) -> None:
        block_hash = self._block_hash[block]
        assert block_hash is not None, f"evicting block {block}, which holds no hash"
        del self._hash_to_block[block_hash]
        self._block_hash[block] = None

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id must be in 0..{self.num_blocks - 1}, got {block}")
