"""The Hopper Gluon sparse MLA kernel (gluon_kernels/hopper/sparse_mla*.py, warp-specialized)
against sparse_mla_torch (§4.5, §4.6): on an H100 / H200 at the model's 96 heads (and 16 / 64),
1, 7, 16 and 64 rows, selections of 1, 65, 100, 130, 2047 and 2048 slots with -1 padding (a
row keeping only its first half) and a row with no valid key, decode batches of one row of one
head over one key (every size argument 1), 16 and 17 rows over the engine's pool view, with
the Triton kernel's GPU bounds (relative error of out <= 1e-2, of lse <= 1e-3). On the CPU:
the launcher's refusals. The sm_90 compile at every batch size:
tests/amd_compile/test_gluon_launches.py. Gluon does not run under Triton's interpreter: no
CPU numerics here."""

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.triton_kernels.mla_tiles import MLATileConfig

SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None \
        and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not is_hopper(), reason="needs an NVIDIA Hopper GPU (sm_90)")


def make_cache(num_blocks: int, block_size: int, seed: int, every_other_block: bool = False):
    """An FP8 latent cache on the GPU, rows contiguous (16-byte aligned); every_other_block:
    a view of every other block of a twice larger buffer (block stride 2 x block_size x 576)."""
    generator = torch.Generator().manual_seed(seed)
    total = num_blocks * (2 if every_other_block else 1)
    rows = torch.randn(total, block_size, 576, generator=generator) / LATENT_SCALE
    rows = rows.clamp(-448, 448)
    cache = rows.to(torch.float8_e4m3fn).cuda()
    return cache[::2] if every_other_block else cache


def make_slots(num_rows: int, k: int, num_slots: int, seed: int) -> torch.Tensor:
    """k distinct slots a row, ~10% masked (-1), the last row all masked; row 1 of several
    keeps only its first half (a short selection padded with -1)."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.stack([torch.randperm(num_slots, generator=generator)[:k]
                         for _ in range(num_rows)]).to(torch.int32)
    slots[torch.rand(num_rows, k, generator=generator) < 0.1] = -1
    if num_rows > 2:
        slots[1, max(1, k // 2):] = -1
    slots[0, 0] = slots[0, 0].clamp_min(0)
    if num_rows > 1:
        slots[-1] = -1  # no valid key: out 0, lse -inf
    return slots.cuda()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    finite = torch.isfinite(want)
    diff = (got.double() - want.double()).masked_fill(~finite, 0)
    return (diff.norm() / want.double().masked_fill(~finite, 0).norm().clamp_min(1e-30)).item()


def check_against_torch(q, cache, slots, num_splits=None) -> None:
    from gluon_kernels.hopper.sparse_mla import sparse_mla_hopper

    got_out, got_lse = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE,
                                         MLATileConfig(num_splits=num_splits))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert got_out.shape == want_out.shape and got_lse.shape == want_lse.shape
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse)), "lse -inf pattern differs"
    assert bool(torch.isfinite(got_out).all()), "non-finite output"
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3
    no_keys = (slots < 0).all(dim=1)
    assert bool((got_out[no_keys] == 0).all())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_heads, num_rows, k, num_splits", [
    (96, 64, 2048, None), (96, 16, 2048, None), (96, 64, 2047, None), (96, 16, 100, None),
    (96, 16, 1, None), (96, 7, 65, None), (96, 16, 2048, 3), (96, 16, 130, 2),
    (16, 7, 2048, None), (64, 64, 100, None), (64, 1, 1, None)],
    ids=lambda v: str(v))
def test_sparse_mla_gluon_hopper_ws_matches_torch(num_heads, num_rows, k, num_splits):
    """64 and 16 rows, lengths 1, 65, 100, 130 (a split of one key tile and a short one), 2047
    and 2048, -1 padding, a row with no valid key."""
    cache = make_cache(160, 128, seed=17)
    slots = make_slots(num_rows, k, 160 * 128, seed=18)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(19))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots, num_splits=num_splits)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_splits", [None, 3], ids=lambda s: f"splits{s}")
def test_sparse_mla_gluon_hopper_ws_block_strided_cache(num_splits):
    """Blocks not back to back (slots split into block and offset), and explicit key splits."""
    cache = make_cache(80, 64, seed=8, every_other_block=True)
    assert cache.stride(0) != cache.shape[1] * cache.stride(1)
    slots = make_slots(7, 2048, 80 * 64, seed=9)
    q = torch.randn(7, 96, 576, generator=torch.Generator().manual_seed(10))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots, num_splits=num_splits)


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_ws_growing_maxima_match_torch():
    """Queries x 8: the softmax maxima grow by more than 2^8 between tiles (every tile's
    rescale of O matters)."""
    cache = make_cache(160, 128, seed=14)
    slots = make_slots(16, 2048, 160 * 128, seed=15)
    q = torch.randn(16, 96, 576, generator=torch.Generator().manual_seed(16))
    check_against_torch((q * 8.0).to(torch.bfloat16).cuda(), cache, slots)


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_ws_repeats_exactly():
    """The same inputs twice give the same bits (a missing hand-off between the roles would
    show as a result that moves between runs)."""
    from gluon_kernels.hopper.sparse_mla import sparse_mla_hopper

    cache = make_cache(160, 128, seed=20)
    slots = make_slots(64, 2048, 160 * 128, seed=21)
    q = torch.randn(64, 96, 576, generator=torch.Generator().manual_seed(22))
    q = q.to(torch.bfloat16).cuda()
    first = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    for _ in range(3):
        again = sparse_mla_hopper(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_rows, num_heads, k", [(1, 1, 1), (16, 96, 256), (17, 96, 33)],
                         ids=["one-row-one-head-one-slot", "sixteen", "odd"])
def test_sparse_mla_gluon_hopper_engine_view_at_size_one_sixteen_and_odd(num_rows, num_heads,
                                                                         k):
    """Over the engine's pool view (layer 1's latent page, a block stride of the whole row),
    with every size argument 1 (Triton passes such arguments as constants), 16 or odd."""
    layout = PackedLayout(CacheLayoutSpec(block_size=64, num_mla_layers=2))
    cache = layout.layer_view(layout.allocate(40, "cuda"), 1).latent
    cache.copy_(make_cache(40, 64, seed=k))
    slots = make_slots(num_rows, k, 40 * 64, seed=k + 1)
    q = torch.randn(num_rows, num_heads, 576, generator=torch.Generator().manual_seed(k + 2))
    check_against_torch(q.to(torch.bfloat16).cuda(), cache, slots)


@pytest.mark.gpu
@needs_hopper
def test_sparse_mla_gluon_hopper_rejects_misaligned_rows():
    from gluon_kernels.hopper.sparse_mla import sparse_mla_hopper

    rows = torch.zeros(4, 16, 600, dtype=torch.float8_e4m3fn, device="cuda")[:, :, 8:584]
    q = torch.zeros(1, 96, 576, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(1, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="16-byte boundaries"):
        sparse_mla_hopper(q, rows, 1.0, slots, SOFTMAX_SCALE)


def test_sparse_mla_hopper_takes_num_splits_only():
    from gluon_kernels.hopper.sparse_mla import plan_splits

    with pytest.raises(ValueError, match=r"takes num_splits only .* got \['block_h'\]"):
        plan_splits(4, 2048, MLATileConfig(block_h=64), torch.device("cpu"))
    assert plan_splits(4, 2048, MLATileConfig(num_splits=3), torch.device("cpu")) == (3, 704)
    assert plan_splits(4, 1, None, torch.device("cpu")) == (1, 64)
