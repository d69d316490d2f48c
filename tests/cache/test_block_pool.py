"""Block pool: ref counts, free list and eviction order, chained hashes, prefix-cache hits."""

import subprocess
import sys

import pytest

from atomk31.cache.block_pool import BlockPool, NoFreeBlocksError, hash_block

BLOCK_SIZE = 4


def _tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def _fill(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Allocate a sequence's blocks and register the full ones, as the engine does."""
    num_blocks = -(-len(tokens) // pool.block_size)
    blocks = pool.allocate(num_blocks)
    for block, block_hash in zip(blocks, pool.block_hashes(tokens)):
        pool.register_full(block, block_hash)
    return blocks


def test_allocate_and_free_track_ref_counts() -> None:
    pool = BlockPool(num_blocks=5, block_size=BLOCK_SIZE)
    assert pool.num_free_blocks == 5 and pool.usage() == 0.0
    blocks = pool.allocate(3)
    assert len(set(blocks)) == 3 and all(pool.ref_count(b) == 1 for b in blocks)
    assert pool.num_free_blocks == 2 and pool.usage() == pytest.approx(0.6)
    assert pool.allocate(0) == []
    pool.free(blocks)
    assert pool.num_free_blocks == 5 and all(pool.ref_count(b) == 0 for b in blocks)


def test_allocate_more_than_free_raises() -> None:
    pool = BlockPool(num_blocks=3, block_size=BLOCK_SIZE)
    pool.allocate(2)
    assert not pool.can_allocate(2)
    with pytest.raises(NoFreeBlocksError, match="asked for 2 blocks, only 1 of 3 are free"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1  # a failed allocation takes nothing
    assert issubclass(NoFreeBlocksError, RuntimeError)


def test_double_free_and_bad_ids_raise() -> None:
    pool = BlockPool(num_blocks=2, block_size=BLOCK_SIZE)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(ValueError, match=f"block {block} is already free"):
        pool.free([block])
    with pytest.raises(ValueError, match=r"block id must be in 0..1, got 7"):
        pool.ref_count(7)
    with pytest.raises(ValueError, match="block_size must be a power of two, got 6"):
        BlockPool(num_blocks=2, block_size=6)


def test_empty_pool() -> None:
    pool = BlockPool(num_blocks=0, block_size=BLOCK_SIZE)
    assert pool.num_free_blocks == 0 and pool.usage() == 0.0 and pool.allocate(0) == []
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)


def test_hash_chaining() -> None:
    pool = BlockPool(num_blocks=1, block_size=BLOCK_SIZE)
    tokens = _tokens(14)
    hashes = pool.block_hashes(tokens)
    assert len(hashes) == 3  # 14 tokens = 3 full blocks + 2: the partial block is not hashed
    assert len(set(hashes)) == 3
    assert pool.block_hashes(tokens[:12] + [999, 998]) == hashes  # tail does not matter
    assert pool.block_hashes(tokens + [7, 7]) == hashes + pool.block_hashes(tokens + [7, 7])[3:]
    changed = pool.block_hashes([tokens[0] + 1000] + tokens[1:])
    assert all(a != b for a, b in zip(hashes, changed))  # block 0 changes every later hash
    changed_last = pool.block_hashes(tokens[:11] + [500] + tokens[12:])
    assert changed_last[:2] == hashes[:2] and changed_last[2] != hashes[2]
    # The same tokens at another depth hash differently (the chain carries the prefix).
    assert pool.block_hashes(tokens[4:8])[0] != hashes[1]
    assert hashes[2] == hash_block(hash_block(hash_block(None, tokens[:4]), tokens[4:8]),
                                   tokens[8:12])
    assert pool.block_hashes(tokens, num_full_blocks=2) == hashes[:2]
    assert pool.block_hashes(tokens[:3]) == [] and pool.block_hashes([]) == []
    with pytest.raises(ValueError, match=r"num_full_blocks must be in 0..3 for 14 tokens"):
        pool.block_hashes(tokens, num_full_blocks=4)


def test_hashes_are_deterministic_across_processes() -> None:
    code = (
        "from atomk31.cache.block_pool import BlockPool;"
        "print(BlockPool(1, 4).block_hashes(list(range(8))))"
    )
    # Python's str/bytes hash() is salted per process; ours must not depend on it.
    env = {"PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.strip() == str(BlockPool(1, 4).block_hashes(list(range(8))))


def test_shared_prefix_is_acquired_and_survives_one_owner_freeing() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK_SIZE)
    first = _tokens(10)
    first_blocks = _fill(pool, first)
    second = first[:8] + [100, 101, 102, 103, 104]
    hashes = pool.block_hashes(second)
    cached = pool.lookup(hashes)
    assert cached == first_blocks[:2]  # block 2 differs, so the hit stops at 2 blocks
    assert pool.ref_count(cached[0]) == 1  # lookup takes no reference
    pool.acquire_cached(cached)
    assert [pool.ref_count(b) for b in cached] == [2, 2]
    second_blocks = cached + pool.allocate(2)
    pool.free(first_blocks)
    assert [pool.ref_count(b) for b in cached] == [1, 1]
    assert pool.num_free_blocks == 8 - 4
    assert pool.lookup(hashes) == cached  # still cached while the second sequence holds them
    pool.free(second_blocks)
    assert pool.num_free_blocks == 8


def test_hit_after_the_first_sequence_finished() -> None:
    pool = BlockPool(num_blocks=6, block_size=BLOCK_SIZE)
    tokens = _tokens(9)
    blocks = _fill(pool, tokens)
    pool.free(blocks)
    assert pool.num_free_blocks == 6
    hashes = pool.block_hashes(tokens)
    assert pool.lookup(hashes) == blocks[:2] and pool.is_cached(hashes[1])
    pool.acquire_cached(blocks[:2])  # leaves the free list
    assert pool.num_free_blocks == 4 and pool.ref_count(blocks[0]) == 1
    fresh = pool.allocate(4)
    assert not set(fresh) & set(blocks[:2])


def test_fresh_blocks_come_before_cached_ones_and_evict_least_recently_freed() -> None:
    pool = BlockPool(num_blocks=6, block_size=BLOCK_SIZE)
    seq_a = _fill(pool, _tokens(8, start=0))  # 2 full blocks
    seq_b = _fill(pool, _tokens(8, start=100))
    pool.free(seq_a)
    pool.free(seq_b)
    hashes_a = pool.block_hashes(_tokens(8, start=0))
    hashes_b = pool.block_hashes(_tokens(8, start=100))
    fresh = pool.allocate(2)
    assert not set(fresh) & set(seq_a + seq_b)  # the 2 never-cached blocks go first
    assert pool.lookup(hashes_a) == seq_a and pool.lookup(hashes_b) == seq_b
    # Next: seq_a was freed first, and within it the tail block first.
    (evicted,) = pool.allocate(1)
    assert evicted == seq_a[1]
    assert pool.lookup(hashes_a) == seq_a[:1]  # the head of the prefix still hits
    assert not pool.is_cached(hashes_a[1])
    (evicted,) = pool.allocate(1)
    assert evicted == seq_a[0] and pool.lookup(hashes_a) == []
    assert pool.lookup(hashes_b) == seq_b
    # A cache hit refreshes nothing by itself, but re-freeing moves the block to the back.
    pool.acquire_cached(seq_b[:1])
    pool.free(seq_b[:1])
    (evicted,) = pool.allocate(1)
    assert evicted == seq_b[1]


def test_register_keeps_the_first_block_for_a_hash() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK_SIZE)
    tokens = _tokens(4)
    (block_hash,) = pool.block_hashes(tokens)
    first, second = pool.allocate(2)
    pool.register_full(first, block_hash)
    pool.register_full(second, block_hash)  # a duplicate computed concurrently
    pool.register_full(first, block_hash)  # idempotent
    assert pool.lookup([block_hash]) == [first]
    pool.free([first, second])
    with pytest.raises(ValueError, match="register_full takes a block a sequence holds"):
        pool.register_full(second, block_hash)
    # `second` holds no hash, so it (and the never-used blocks) go before the cached `first`.
    assert pool.allocate(3) == [2, 3, second]
    assert pool.lookup([block_hash]) == [first]
    assert pool.allocate(1) == [first] and pool.lookup([block_hash]) == []


def test_register_rejects_a_different_hash_for_a_full_block() -> None:
    pool = BlockPool(num_blocks=2, block_size=BLOCK_SIZE)
    (block,) = pool.allocate(1)
    pool.register_full(block, 1)
    with pytest.raises(ValueError, match="already registered under another hash"):
        pool.register_full(block, 2)


def test_acquire_of_an_uncached_free_block_raises() -> None:
    pool = BlockPool(num_blocks=2, block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match="block 1 is free and holds no cached prefix"):
        pool.acquire_cached([1])


def test_disabled_prefix_caching_never_hits() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    tokens = _tokens(8)
    blocks = _fill(pool, tokens)
    hashes = pool.block_hashes(tokens)
    assert len(hashes) == 2  # hashes are still computed (deterministic), just not used
    assert pool.lookup(hashes) == [] and not pool.is_cached(hashes[0])
    pool.free(blocks)
    assert pool.lookup(hashes) == []


def test_hit_rate_counters() -> None:
    pool = BlockPool(num_blocks=1, block_size=BLOCK_SIZE)
    assert pool.hit_rate() == 0.0
    pool.record_query(10, 8)
    pool.record_query(6, 0)
    assert (pool.num_queried_tokens, pool.num_hit_tokens) == (16, 8)
    assert pool.hit_rate() == 0.5
    with pytest.raises(ValueError, match="need 0 <= num_hit_tokens <= num_tokens"):
        pool.record_query(4, 5)


def test_share_takes_one_more_reference_per_block():
    """Issue 19: forked completions (n > 1) hold the prompt's full blocks together."""
    pool = BlockPool(4, 16)
    blocks = pool.allocate(2)
    pool.share(blocks)
    assert [pool.ref_count(b) for b in blocks] == [2, 2]
    pool.free(blocks)
    assert pool.num_free_blocks == 2
    pool.free(blocks)
    assert pool.num_free_blocks == 4
    with pytest.raises(ValueError, match="block 0 is free; share only blocks a sequence holds"):
        pool.share([0])
