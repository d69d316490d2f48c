"""kv_write / read_latent / read_index_keys (torch): round trips through paged caches that are
strided views of a uint8 pool row, checked against the oracle's number formats."""

import pytest
import torch

from atomk31.ops.kv_write import kv_write_torch, read_index_keys, read_latent
from atomk31.reference.formats import (
    fake_quant_fp8_groups,
    fake_quant_mxfp4,
    quantize_mxfp4 as reference_quantize_mxfp4,
    round_to_e4m3,
)

LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]
KEY_FORMATS = [("fp8", "e4m3fn"), ("fp8", "e4m3fnuz"), ("mxfp4", "e4m3fn")]
FP8_NAMES = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}
LATENT_SCALE = 0.05


def build_pool_caches(
    pool: torch.Tensor, block_size: int, latent_dtype: torch.dtype, index_format: str,
    fp8_variant: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(latent_cache, index_values, index_scales) as strided views of one uint8 pool row per
    block, the way the cache package lays out pages: [pad | latent | pad | values | scales]."""
    num_blocks = pool.shape[0]
    latent_bytes = block_size * 576 * latent_dtype.itemsize
    start = 16
    latent = pool[:, start:start + latent_bytes].view(latent_dtype)
    latent = latent.view(num_blocks, block_size, 576)
    start += latent_bytes + 32
    if index_format == "fp8":
        fp8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fp8_variant]
        values = pool[:, start:start + block_size * 128].view(fp8).view(num_blocks, block_size, 128)
        start += block_size * 128
        scales = pool[:, start:start + block_size * 4].view(torch.float32)
    else:
        values = pool[:, start:start + block_size * 64].view(num_blocks, block_size, 64)
        start += block_size * 64
        scales = pool[:, start:start + block_size * 4].view(num_blocks, block_size, 4)
    return latent, values, scales


def pool_row_bytes(block_size: int) -> int:
    # Enough for the widest layout (fp32 latent, fp8 keys) plus padding; a multiple of 16.
    return 16 + block_size * 576 * 4 + 32 + block_size * 132 + 48


def expected_latent(latent: torch.Tensor, latent_dtype: torch.dtype) -> torch.Tensor:
    if latent_dtype in FP8_NAMES:
        return round_to_e4m3(latent / LATENT_SCALE, FP8_NAMES[latent_dtype]) * LATENT_SCALE
    return latent.to(latent_dtype).float()


def expected_keys(keys: torch.Tensor, index_format: str, fp8_variant: str) -> torch.Tensor:
    if index_format == "fp8":
        return fake_quant_fp8_groups(keys, fp8_variant)
    return fake_quant_mxfp4(keys)


def make_tokens(num_tokens: int, num_slots: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random latents (a few far beyond the fp8 range, to saturate), keys (one all-zero) and
    distinct slots with every fourth token skipped (-1)."""
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_tokens, 576, generator=generator)
    latent[0, :3] = torch.tensor([1e4, -1e4, 0.0])
    keys = torch.randn(num_tokens, 128, generator=generator) * 3.0
    keys[1] = 0.0
    slots = torch.randperm(num_slots, generator=generator)[:num_tokens]
    slots[3::4] = -1
    return latent, keys, slots


@pytest.mark.parametrize("key_format", KEY_FORMATS, ids=lambda f: "keys_" + "_".join(f))
@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: "latent_" + str(d)[6:])
@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_kv_write_torch_round_trip_through_pool_views(block_size, latent_dtype, key_format):
    index_format, fp8_variant = key_format
    num_blocks, num_tokens = 3, 2 * block_size + 5  # spans blocks, not a multiple of a block
    pool = torch.randint(0, 256, (num_blocks, pool_row_bytes(block_size)), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))
    pool_before = pool.clone()
    caches = build_pool_caches(pool, block_size, latent_dtype, index_format, fp8_variant)
    latent_cache, index_values, index_scales = caches
    assert not latent_cache.is_contiguous(), "the test must write through a strided view"
    latent, keys, slots = make_tokens(num_tokens, num_blocks * block_size, seed=block_size)

    kv_write_torch(latent, keys, slots, latent_cache, LATENT_SCALE, index_values, index_scales,
                   index_format, fp8_variant)

    written = slots >= 0
    got_latent = read_latent(latent_cache, LATENT_SCALE, slots[written])
    want_latent = expected_latent(latent[written], latent_dtype)
    assert torch.equal(got_latent, want_latent), "latent rows differ from the format oracle"
    got_keys = read_index_keys(index_values, index_scales, index_format, slots[written])
    want_keys = expected_keys(keys[written], index_format, fp8_variant)
    assert torch.equal(got_keys, want_keys), "index keys differ from the format oracle"
    if latent_dtype in FP8_NAMES:
        fmax = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}[FP8_NAMES[latent_dtype]]
        saturated = torch.tensor([fmax, -fmax]) * LATENT_SCALE  # fp32, like the reader
        assert torch.equal(got_latent[0, :2], saturated), "fp8 latent must saturate at ±fmax"

    # Only the written slots changed: copy them into the old pool and compare every byte.
    untouched = pool_before.clone()
    for old, new in zip(build_pool_caches(untouched, block_size, latent_dtype, index_format,
                                          fp8_variant), caches):
        good = slots[written]
        old[good // block_size, good % block_size] = new[good // block_size, good % block_size]
    assert torch.equal(untouched, pool), "bytes outside the written slots changed"


def test_kv_write_torch_mxfp4_bytes_are_low_nibble_first():
    block_size = 16
    latent_cache = torch.zeros(2, block_size, 576)
    index_values = torch.zeros(2, block_size, 64, dtype=torch.uint8)
    index_scales = torch.zeros(2, block_size, 4, dtype=torch.uint8)
    keys = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([17, 0, 31])
    kv_write_torch(torch.zeros(3, 576), keys, slots, latent_cache, 1.0, index_values,
                   index_scales, "mxfp4", "e4m3fn")
    want_packed, want_scales = reference_quantize_mxfp4(keys)
    assert torch.equal(index_values[slots // block_size, slots % block_size], want_packed)
    assert torch.equal(index_scales[slots // block_size, slots % block_size], want_scales)


def test_kv_write_torch_with_no_tokens_changes_nothing():
    latent_cache = torch.full((2, 16, 576), 7.0)
    index_values = torch.zeros(2, 16, 128, dtype=torch.float8_e4m3fn)
    index_scales = torch.full((2, 16), 3.0)
    kv_write_torch(torch.zeros(0, 576), torch.zeros(0, 128), torch.zeros(0, dtype=torch.int64),
                   latent_cache, 1.0, index_values, index_scales, "fp8", "e4m3fn")
    assert bool((latent_cache == 7.0).all()) and bool((index_scales == 3.0).all())


def test_read_latent_and_keys_of_slot_minus_one_are_zero():
    latent_cache = torch.randn(2, 16, 576)
    index_values = torch.randn(2, 16, 128).to(torch.float8_e4m3fn)
    index_scales = torch.ones(2, 16)
    slots = torch.tensor([[-1, 5], [20, -1]])
    rows = read_latent(latent_cache, 1.0, slots)
    assert rows.shape == (2, 2, 576)
    assert bool((rows[0, 0] == 0).all()) and bool((rows[1, 1] == 0).all())
    assert torch.equal(rows[1, 0], latent_cache[1, 4])
    keys = read_index_keys(index_values, index_scales, "fp8", slots)
    assert keys.shape == (2, 2, 128) and bool((keys[0, 0] == 0).all())


def _fp8_caches(block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.zeros(2, block_size, 576), torch.zeros(2, block_size, 128,
            dtype=torch.float8_e4m3fn), torch.zeros(2, block_size))


def test_kv_write_torch_rejects_unknown_index_format():
    latent_cache, values, scales = _fp8_caches()
    expected = r"index_format must be one of \('fp8', 'mxfp4'\), got 'int8'"
    with pytest.raises(ValueError, match=expected):
        kv_write_torch(torch.zeros(1, 576), torch.zeros(1, 128), torch.tensor([0]),
                       latent_cache, 1.0, values, scales, "int8", "e4m3fn")


def test_kv_write_torch_rejects_key_cache_of_the_other_fp8_variant():
    latent_cache, values, scales = _fp8_caches()
    expected = r"index_values for format 'fp8' must be .*float8_e4m3fnuz"
    with pytest.raises(ValueError, match=expected):
        kv_write_torch(torch.zeros(1, 576), torch.zeros(1, 128), torch.tensor([0]),
                       latent_cache, 1.0, values, scales, "fp8", "e4m3fnuz")


def test_kv_write_torch_rejects_wrong_latent_width():
    latent_cache, values, scales = _fp8_caches()
    with pytest.raises(ValueError, match=r"latent must be \[Nt=1, 576\], got \[1, 512\]"):
        kv_write_torch(torch.zeros(1, 512), torch.zeros(1, 128), torch.tensor([0]),
                       latent_cache, 1.0, values, scales, "fp8", "e4m3fn")


def test_kv_write_torch_rejects_latent_cache_of_int_dtype():
    _, values, scales = _fp8_caches()
    with pytest.raises(ValueError, match=r"latent_cache dtype must be one of .*got torch.int8"):
        kv_write_torch(torch.zeros(1, 576), torch.zeros(1, 128), torch.tensor([0]),
                       torch.zeros(2, 16, 576, dtype=torch.int8), 1.0, values, scales,
                       "fp8", "e4m3fn")


def test_kv_write_torch_rejects_non_positive_latent_scale():
    latent_cache, values, scales = _fp8_caches()
    with pytest.raises(ValueError, match=r"latent_scale must be a positive float, got 0.0"):
        kv_write_torch(torch.zeros(1, 576), torch.zeros(1, 128), torch.tensor([0]),
                       latent_cache, 0.0, values, scales, "fp8", "e4m3fn")
