"""Packed block rows: byte budget (MODEL_SPEC §7.2), view shapes, isolation between layers."""

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.kv_write import kv_write_torch, read_index_keys, read_latent

FP8 = torch.float8_e4m3fn


def _random_pool(layout: PackedLayout, num_blocks: int, seed: int = 0) -> torch.Tensor:
    pool = layout.allocate(num_blocks, "cpu")
    generator = torch.Generator().manual_seed(seed)
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, generator=generator))
    return pool


def _layer_tensors(layout: PackedLayout, pool: torch.Tensor, layer: int) -> list[torch.Tensor]:
    view = layout.layer_view(pool, layer)
    return [t for t in (view.latent, view.index_values, view.index_scales) if t is not None]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)  # reinterpret, so fp8 compares bit for bit


@pytest.mark.parametrize(
    "latent_dtype, index_format, num_draft_layers, per_layer, per_token",
    [
        (FP8, "fp8", 0, 708, 16_992),
        (FP8, "mxfp4", 0, 644, 15_456),
        (torch.bfloat16, "fp8", 0, 1_284, 30_816),
        (FP8, None, 0, 576, 13_824),
        (FP8, "fp8", 5, 708, 16_992 + 2_880),
    ],
    ids=["fp8-fp8", "fp8-mxfp4", "bf16-fp8", "fp8-nokeys", "fp8-fp8-draft5"],
)
@pytest.mark.parametrize("block_size", [64, 128])
def test_bytes_per_token_matches_spec_7_2(
    block_size: int,
    latent_dtype: torch.dtype,
    index_format: str | None,
    num_draft_layers: int,
    per_layer: int,
    per_token: int,
) -> None:
    spec = CacheLayoutSpec(
        block_size, 24, num_draft_layers, latent_dtype=latent_dtype, index_format=index_format
    )
    layout = PackedLayout(spec)
    assert layout.bytes_per_token() == per_token
    one_layer = CacheLayoutSpec(block_size, 1, latent_dtype=latent_dtype, index_format=index_format)
    assert PackedLayout(one_layer).bytes_per_token() == per_layer
    # At block_size >= 64 every page is already a multiple of 256 B: no padding.
    assert layout.row_bytes == block_size * per_token
    assert layout.row_bytes % 256 == 0


def test_small_block_pads_pages_to_256_bytes() -> None:
    layout = PackedLayout(CacheLayoutSpec(block_size=1, num_mla_layers=2, num_draft_layers=1))
    assert layout.bytes_per_token() == 2 * 708 + 576
    # latent 576 -> 768, index page 132 -> 256; draft latent 576 -> 768.
    assert layout.row_bytes == 2 * (768 + 256) + 768
    assert layout.row_bytes >= layout.bytes_per_token() * layout.block_size


@pytest.mark.parametrize("block_size", [96, 0, -4, 3])
def test_block_size_must_be_power_of_two(block_size: int) -> None:
    with pytest.raises(ValueError, match=rf"block_size must be a power of two, got {block_size}; "
                       r"pass --block-size 64 or 128"):
        CacheLayoutSpec(block_size=block_size, num_mla_layers=24)


def test_spec_rejects_mixed_fp8_variants_and_bad_fields() -> None:
    with pytest.raises(ValueError, match="disagree; use the device's one FP8 variant"):
        CacheLayoutSpec(128, 24, latent_dtype=torch.float8_e4m3fnuz, fp8_variant="e4m3fn")
    with pytest.raises(ValueError, match="index_format must be 'fp8', 'mxfp4' or None"):
        CacheLayoutSpec(128, 24, index_format="fp4")
    with pytest.raises(ValueError, match="latent_dtype must be one of"):
        CacheLayoutSpec(128, 24, latent_dtype=torch.float16)
    with pytest.raises(ValueError, match="index_head_dim must be 128"):
        CacheLayoutSpec(128, 24, index_head_dim=256)
    with pytest.raises(ValueError, match="at least one MLA or draft layer"):
        CacheLayoutSpec(128, 0)


@pytest.mark.parametrize(
    "latent_dtype, index_format, fp8_variant, values_shape, values_dtype, scales_shape, "
    "scales_dtype",
    [
        (FP8, "fp8", "e4m3fn", (3, 16, 128), FP8, (3, 16), torch.float32),
        (torch.float8_e4m3fnuz, "fp8", "e4m3fnuz", (3, 16, 128), torch.float8_e4m3fnuz, (3, 16),
         torch.float32),
        (torch.bfloat16, "mxfp4", "e4m3fn", (3, 16, 64), torch.uint8, (3, 16, 4), torch.uint8),
        (torch.float32, "fp8", "e4m3fn", (3, 16, 128), FP8, (3, 16), torch.float32),
    ],
    ids=["fp8-fp8", "fnuz-fnuz", "bf16-mxfp4", "fp32-fp8"],
)
def test_layer_view_shapes_dtypes_and_strides(
    latent_dtype: torch.dtype,
    index_format: str,
    fp8_variant: str,
    values_shape: tuple[int, ...],
    values_dtype: torch.dtype,
    scales_shape: tuple[int, ...],
    scales_dtype: torch.dtype,
) -> None:
    spec = CacheLayoutSpec(16, 2, 1, latent_dtype=latent_dtype, index_format=index_format,
                           fp8_variant=fp8_variant)
    layout = PackedLayout(spec)
    pool = layout.allocate(3, "cpu")
    assert pool.dtype == torch.uint8 and tuple(pool.shape) == (3, layout.row_bytes)
    assert not pool.any()
    view = layout.layer_view(pool, 1)
    assert view.latent_scale == 1.0
    assert tuple(view.latent.shape) == (3, 16, 576) and view.latent.dtype == latent_dtype
    assert tuple(view.index_values.shape) == values_shape
    assert view.index_values.dtype == values_dtype
    assert tuple(view.index_scales.shape) == scales_shape
    assert view.index_scales.dtype == scales_dtype
    for t in (view.latent, view.index_values, view.index_scales):
        assert t.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()  # a view
        assert t.stride(0) * t.element_size() == layout.row_bytes  # block stride = one row
    draft = layout.layer_view(pool, 2)
    assert draft.index_values is None and draft.index_scales is None
    assert tuple(draft.latent.shape) == (3, 16, 576)


def test_layout_without_index_keys_has_no_index_views() -> None:
    layout = PackedLayout(CacheLayoutSpec(8, 3, index_format=None))
    view = layout.layer_view(layout.allocate(2, "cpu"), 2)
    assert view.index_values is None and view.index_scales is None
    assert layout.row_bytes == 3 * 8 * 576


def test_empty_pool_gives_empty_views() -> None:
    layout = PackedLayout(CacheLayoutSpec(128, 2))
    view = layout.layer_view(layout.allocate(0, "cpu"), 1)
    assert tuple(view.latent.shape) == (0, 128, 576)
    assert tuple(view.index_scales.shape) == (0, 128)


@pytest.mark.parametrize("index_format", ["fp8", "mxfp4"])
def test_write_through_one_layer_leaves_other_layers_alone(index_format: str) -> None:
    layout = PackedLayout(CacheLayoutSpec(4, 3, 2, index_format=index_format))
    pool = layout.allocate(5, "cpu")
    before = pool.clone()
    written_layer = 1
    for t in _layer_tensors(layout, pool, written_layer):
        _as_bytes(t).fill_(0x11)  # 0x11 is a finite value in every dtype used here
    for layer in range(layout.spec.num_layers):
        now = _layer_tensors(layout, pool, layer)
        old = _layer_tensors(layout, before, layer)
        for t_now, t_old in zip(now, old):
            if layer == written_layer:
                assert bool((_as_bytes(t_now) == 0x11).all())
            else:
                assert torch.equal(_as_bytes(t_now), _as_bytes(t_old)), f"layer {layer} changed"
    # Exactly the layer's logical bytes changed: nothing in padding, nothing elsewhere.
    expected = 5 * 4 * (576 + (132 if index_format == "fp8" else 68))
    assert int((pool != before).sum()) == expected


def test_layers_do_not_overlap_and_cover_the_logical_bytes() -> None:
    layout = PackedLayout(CacheLayoutSpec(2, 3, 2, index_format="fp8"))
    pool = layout.allocate(4, "cpu")
    for layer in range(layout.spec.num_layers):
        for t in _layer_tensors(layout, pool, layer):
            _as_bytes(t).fill_(layer + 1)
    for layer in range(layout.spec.num_layers):
        for t in _layer_tensors(layout, pool, layer):
            assert bool((_as_bytes(t) == layer + 1).all()), f"layer {layer} was overwritten"
    assert int((pool != 0).sum()) == 4 * 2 * layout.bytes_per_token()


def test_one_block_is_one_contiguous_row() -> None:
    layout = PackedLayout(CacheLayoutSpec(8, 2, 1, index_format="mxfp4"))
    pool = _random_pool(layout, num_blocks=4, seed=1)
    before = pool.clone()
    block = 2
    for layer in range(layout.spec.num_layers):
        for t in _layer_tensors(layout, pool, layer):
            _as_bytes(t)[block].fill_(0xAA)
    assert pool[block].is_contiguous() and pool[block].numel() == layout.row_bytes
    other = [b for b in range(4) if b != block]
    assert torch.equal(pool[other], before[other])
    # The whole block moves with one row copy.
    pool[0].copy_(pool[block])
    for layer in range(layout.spec.num_layers):
        for t in _layer_tensors(layout, pool, layer):
            assert bool((_as_bytes(t)[0] == 0xAA).all())


def test_fp8_cache_round_trip_through_kv_write() -> None:
    """The ops' writer and readers work on the strided views of a float8 pool."""
    layout = PackedLayout(CacheLayoutSpec(4, 2, index_format="fp8"))
    pool = layout.allocate(3, "cpu")
    view = layout.layer_view(pool, 1)
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(5, 576, generator=generator)
    key = torch.randn(5, 128, generator=generator)
    slots = torch.tensor([0, 5, 6, -1, 11])
    kv_write_torch(latent, key, slots, view.latent, view.latent_scale, view.index_values,
                   view.index_scales, "fp8", "e4m3fn")
    written = slots >= 0
    got_latent = read_latent(view.latent, view.latent_scale, slots[written])
    expected = latent[written].to(FP8).float()
    assert torch.equal(got_latent, expected)
    got_key = read_index_keys(view.index_values, view.index_scales, "fp8", slots[written])
    torch.testing.assert_close(got_key, key[written], rtol=0.07, atol=0.02)
    other = layout.layer_view(pool, 0)
    assert not _as_bytes(other.latent).any() and not _as_bytes(other.index_values).any()


def test_layer_view_rejects_wrong_pool_and_layer() -> None:
    layout = PackedLayout(CacheLayoutSpec(4, 2, 1))
    pool = layout.allocate(2, "cpu")
    with pytest.raises(ValueError, match=r"layer must be in 0..2 \(target MLA layers, then draft"):
        layout.layer_view(pool, 3)
    with pytest.raises(ValueError, match=rf"pool must be uint8 \[num_blocks, {layout.row_bytes}\]"):
        layout.layer_view(pool[:, :-256], 0)
    with pytest.raises(ValueError, match="pool must be uint8"):
        layout.layer_view(pool.float(), 0)


@pytest.mark.gpu
def test_views_on_gpu() -> None:
    layout = PackedLayout(CacheLayoutSpec(128, 3, 1, index_format="fp8"))
    pool = layout.allocate(5, "cuda")
    view = layout.layer_view(pool, 1)
    view.latent[2, 7] = torch.full((576,), 1.5, device="cuda").to(FP8)
    view.index_scales[2, 7] = 0.25
    assert view.latent.is_cuda and float(view.latent[2, 7].float().sum()) == 1.5 * 576
    assert float(view.index_scales[2, 7]) == 0.25
    assert int((pool != 0).sum(dim=1).count_nonzero()) == 1  # only block 2's row changed
