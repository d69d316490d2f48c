"""sparse_mla (torch) against a naive per-row, per-head softmax over the selected latent rows
(§4.5 weight absorption, §4.6 "Effect on MLA")."""

import math

import pytest
import torch

from atomk31.ops.sparse_mla import sparse_mla_torch

NUM_HEADS = 4  # H, small to stay fast
SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}


def make_latent_cache(num_blocks: int, block_size: int, dtype: torch.dtype, seed: int):
    """A strided (non-contiguous) latent cache view holding random rows of `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(num_blocks, block_size, 600, generator=generator)
    if dtype in FP8_MAX:
        fmax = FP8_MAX[dtype]
        rows = (rows / LATENT_SCALE).clamp(-fmax, fmax)
    cache = rows.to(dtype)[:, :, 10:586]
    assert not cache.is_contiguous()
    return cache


def stored_row(cache: torch.Tensor, slot: int) -> torch.Tensor:
    """The dequantized fp32 row at `slot`, read the plain way (oracle of `read_latent`)."""
    block_size = cache.shape[1]
    row = cache[slot // block_size, slot % block_size].float()
    return row * LATENT_SCALE if cache.dtype in FP8_MAX else row


def naive_sparse_mla(q, cache, slots):
    """Per row and head: softmax of (q · row) * scale over the valid slots, values = row[:512]."""
    num_rows = q.shape[0]
    out = torch.zeros(num_rows, NUM_HEADS, 512, dtype=torch.float64)
    lse = torch.full((num_rows, NUM_HEADS), -math.inf, dtype=torch.float64)
    for i in range(num_rows):
        valid = [s for s in slots[i].tolist() if s >= 0]
        if not valid:
            continue
        rows = torch.stack([stored_row(cache, s) for s in valid]).double()  # [S, 576]
        for h in range(NUM_HEADS):
            scores = (rows @ q[i, h].double()) * SOFTMAX_SCALE
            lse[i, h] = torch.logsumexp(scores, dim=0)
            out[i, h] = torch.softmax(scores, dim=0) @ rows[:, :512]
    return out, lse


def assert_close(name, got, want, rtol=1e-5, atol=1e-5):
    """Compare fp32 `got` with a float64 `want`; reports the worst absolute and relative error."""
    assert got.dtype == torch.float32, f"{name}: dtype {got.dtype}, want float32"
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: inf pattern differs"
    finite = torch.isfinite(want)
    error = (got.double() - want).abs().masked_fill(~finite, 0)
    relative = (error / want.abs().clamp_min(1e-30)).max().item() if want.numel() else 0.0
    assert torch.allclose(got.double().masked_fill(~finite, 0), want.masked_fill(~finite, 0),
                          rtol=rtol, atol=atol), (
        f"{name}: max abs error {error.max().item():.3e}, max rel error {relative:.3e}")


CASES = {
    # name: (Nq, k, fraction of slots masked)
    "rows5_k1": (5, 1, 0.0),
    "rows6_k7_masked": (6, 7, 0.3),
    "rows3_k64": (3, 64, 0.1),
}
LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]


@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_sparse_mla_torch_matches_naive_softmax(block_size, case, latent_dtype):
    num_rows, k, masked_fraction = CASES[case]
    num_blocks = 5
    cache = make_latent_cache(num_blocks, block_size, latent_dtype, seed=block_size + k)
    generator = torch.Generator().manual_seed(k)
    slots = torch.stack([torch.randperm(num_blocks * block_size, generator=generator)[:k]
                         for _ in range(num_rows)]).to(torch.int32)
    slots[torch.rand(num_rows, k, generator=generator) < masked_fraction] = -1
    slots[-1] = -1  # a row with no valid slot
    if num_rows > 1:
        slots[0, 0] = slots[0, 0].clamp_min(0)  # keep a valid slot in row 0
    q = torch.randn(num_rows, NUM_HEADS, 576, generator=generator)

    out, lse = sparse_mla_torch(q, cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    want_out, want_lse = naive_sparse_mla(q, cache, slots)
    assert_close("out", out, want_out)
    assert_close("lse", lse, want_lse)
    assert bool((out[-1] == 0).all()) and bool(torch.isneginf(lse[-1]).all())


def test_sparse_mla_torch_partial_results_merge_by_lse():
    # Attending over two disjoint halves and merging by LSE equals attending over all slots.
    cache = make_latent_cache(4, 16, torch.float32, seed=1)
    generator = torch.Generator().manual_seed(2)
    slots = torch.randperm(64, generator=generator)[:40].view(2, 20).to(torch.int32)
    q = torch.randn(2, NUM_HEADS, 576, generator=generator)
    out, lse = sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    out_a, lse_a = sparse_mla_torch(q, cache, 1.0, slots[:, :13], SOFTMAX_SCALE)
    out_b, lse_b = sparse_mla_torch(q, cache, 1.0, slots[:, 13:], SOFTMAX_SCALE)
    merged_lse = torch.logaddexp(lse_a, lse_b)
    merged = (torch.exp(lse_a - merged_lse)[..., None] * out_a
              + torch.exp(lse_b - merged_lse)[..., None] * out_b)
    assert_close("merged out", merged, out.double())
    assert_close("merged lse", merged_lse, lse.double())


def test_sparse_mla_torch_slot_order_does_not_matter():
    cache = make_latent_cache(2, 16, torch.bfloat16, seed=3)
    generator = torch.Generator().manual_seed(4)
    slots = torch.tensor([[3, -1, 30, 7, 12]], dtype=torch.int32)
    q = torch.randn(1, NUM_HEADS, 576, generator=generator)
    out, lse = sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    out_r, lse_r = sparse_mla_torch(q, cache, 1.0, slots.flip(1), SOFTMAX_SCALE)
    assert_close("reversed out", out_r, out.double())
    assert_close("reversed lse", lse_r, lse.double())


def test_sparse_mla_torch_with_no_rows_returns_empty():
    cache = make_latent_cache(2, 16, torch.float32, seed=5)
    out, lse = sparse_mla_torch(torch.zeros(0, NUM_HEADS, 576), cache, 1.0,
                                torch.zeros(0, 8, dtype=torch.int32), SOFTMAX_SCALE)
    assert out.shape == (0, NUM_HEADS, 512) and lse.shape == (0, NUM_HEADS)


def test_sparse_mla_torch_rejects_unabsorbed_query():
    cache = make_latent_cache(2, 16, torch.float32, seed=6)
    expected = r"q must be \[Nq=1, H, 576\] absorbed queries, got \[1, 4, 192\]"
    with pytest.raises(ValueError, match=expected):
        sparse_mla_torch(torch.zeros(1, NUM_HEADS, 192), cache, 1.0,
                         torch.zeros(1, 4, dtype=torch.int32), SOFTMAX_SCALE)


def test_check_sparse_mla_refuses_an_unabsorbed_query():
    """The op's host check, run before every kernel (the launchers do not repeat it)."""
    from atomk31.ops.sparse_mla import check_sparse_mla

    cache = torch.zeros(2, 16, 576)
    with pytest.raises(ValueError, match=r"q must be \[Nq=1, H, 576\] absorbed queries"):
        check_sparse_mla(torch.zeros(1, 4, 192), cache, 1.0,
                         torch.zeros(1, 4, dtype=torch.int32), 0.1)
    check_sparse_mla(torch.zeros(1, 4, 576), cache, 1.0, torch.zeros(1, 4, dtype=torch.int32),
                     0.1)
