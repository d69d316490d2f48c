"""dense_mla (torch): equal to a naive causal softmax over each request's latent rows and to
sparse_mla with every causal slot selected (§4.5; §4.6 "Effect on MLA")."""

import math

import pytest
import torch

from atomk31.ops.dense_mla import dense_mla_torch
from atomk31.ops.kv_write import kv_write_torch
from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.ops.topk import positions_to_slots_torch
from atomk31.reference.formats import round_to_e4m3

NUM_HEADS = 4  # H, small to stay fast
SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02
FP8_NAMES = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}
LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def stored_latent(latent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What reading the cache must give back (the format oracle), fp32."""
    if dtype in FP8_NAMES:
        return round_to_e4m3(latent / LATENT_SCALE, FP8_NAMES[dtype]) * LATENT_SCALE
    return latent.to(dtype).float()


def build_requests(request_lengths, block_size, latent_dtype, seed):
    """Write each request's latent rows into a paged cache whose blocks are handed out in a
    shuffled order (non-contiguous, out of order); returns rows per request and the cache."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in request_lengths]
    max_blocks = max(blocks_needed) + 1
    num_blocks = sum(blocks_needed) + 2
    free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(request_lengths), max_blocks), -1, dtype=torch.int32)
    for request, count in enumerate(blocks_needed):
        for column in range(count):
            block_table[request, column] = free_blocks.pop()
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=latent_dtype)
    index_values = torch.zeros(num_blocks, block_size, 128, dtype=torch.float8_e4m3fn)
    index_scales = torch.zeros(num_blocks, block_size)
    latents = []
    for request, length in enumerate(request_lengths):
        latent = torch.randn(length, 576, generator=generator)
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        kv_write_torch(latent, torch.zeros(length, 128), slots, latent_cache, LATENT_SCALE,
                       index_values, index_scales, "fp8", "e4m3fn")
        latents.append(latent)
    return latents, block_table, latent_cache


def naive_causal_mla(q, latents, latent_dtype, row_request, row_position):
    """Per row and head: softmax over the request's rows 0..p, in float64."""
    num_rows = q.shape[0]
    out = torch.zeros(num_rows, NUM_HEADS, 512, dtype=torch.float64)
    lse = torch.zeros(num_rows, NUM_HEADS, dtype=torch.float64)
    for i in range(num_rows):
        request, position = int(row_request[i]), int(row_position[i])
        rows = stored_latent(latents[request][: position + 1], latent_dtype).double()
        for h in range(NUM_HEADS):
            scores = (rows @ q[i, h].double()) * SOFTMAX_SCALE
            lse[i, h] = torch.logsumexp(scores, dim=0)
            out[i, h] = torch.softmax(scores, dim=0) @ rows[:, :512]
    return out, lse


def assert_close(name, got, want, rtol=1e-5, atol=1e-5):
    """Compare fp32 `got` with `want`; reports the worst absolute and relative error."""
    assert got.dtype == torch.float32, f"{name}: dtype {got.dtype}, want float32"
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    error = (got.double() - want.double()).abs()
    relative = (error / want.double().abs().clamp_min(1e-30)).max().item() if want.numel() else 0
    assert torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol), (
        f"{name}: max abs error {error.max().item():.3e}, max rel error {relative:.3e}")


# A decode row at position 0 (length 1), four verification rows of one request with
# consecutive positions, prefill rows around block edges; requests interleaved.
REQUEST_LENGTHS = [1, 37, 130]
ROWS = [(2, 129), (1, 33), (0, 0), (1, 34), (2, 0), (1, 35), (2, 64), (1, 36), (2, 127),
        (2, 128), (2, 16), (2, 15)]


@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_dense_mla_torch_matches_naive_causal_softmax_and_full_sparse(block_size, latent_dtype):
    latents, block_table, latent_cache = build_requests(REQUEST_LENGTHS, block_size,
                                                        latent_dtype, seed=block_size)
    row_request = torch.tensor([r for r, _ in ROWS], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in ROWS], dtype=torch.int64)
    q = torch.randn(len(ROWS), NUM_HEADS, 576, generator=torch.Generator().manual_seed(9))

    out, lse = dense_mla_torch(q, latent_cache, LATENT_SCALE, block_table, row_request,
                               row_position, block_size, SOFTMAX_SCALE)
    want_out, want_lse = naive_causal_mla(q, latents, latent_dtype, row_request, row_position)
    assert_close("dense out vs naive", out, want_out)
    assert_close("dense lse vs naive", lse, want_lse)

    length = int(row_position.max()) + 1
    positions = torch.arange(length).expand(len(ROWS), length)
    positions = torch.where(positions <= row_position[:, None], positions, -1)
    slots = positions_to_slots_torch(positions, block_table, row_request, block_size)
    sparse_out, sparse_lse = sparse_mla_torch(q, latent_cache, LATENT_SCALE, slots, SOFTMAX_SCALE)
    assert_close("dense out vs full sparse", out, sparse_out)
    assert_close("dense lse vs full sparse", lse, sparse_lse)


def test_dense_mla_torch_position_zero_returns_its_own_row():
    latents, block_table, cache = build_requests([3], 16, torch.float32, seed=1)
    q = torch.randn(1, NUM_HEADS, 576, generator=torch.Generator().manual_seed(2))
    out, lse = dense_mla_torch(q, cache, 1.0, block_table, torch.tensor([0]),
                               torch.tensor([0]), 16, SOFTMAX_SCALE)
    assert_close("out", out, latents[0][0, :512].expand(1, NUM_HEADS, 512))
    assert_close("lse", lse, (q[0] @ latents[0][0]).unsqueeze(0) * SOFTMAX_SCALE)


def test_dense_mla_torch_with_no_rows_returns_empty():
    _, block_table, cache = build_requests([3], 16, torch.float32, seed=3)
    out, lse = dense_mla_torch(torch.zeros(0, NUM_HEADS, 576), cache, 1.0, block_table,
                               torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64),
                               16, SOFTMAX_SCALE)
    assert out.shape == (0, NUM_HEADS, 512) and lse.shape == (0, NUM_HEADS)


def test_dense_mla_torch_rejects_block_size_other_than_the_caches():
    _, block_table, cache = build_requests([3], 16, torch.float32, seed=4)
    with pytest.raises(ValueError, match=r"latent cache pages hold 16 tokens but block_size is 32"):
        dense_mla_torch(torch.zeros(1, NUM_HEADS, 576), cache, 1.0, block_table,
                        torch.tensor([0]), torch.tensor([2]), 32, SOFTMAX_SCALE)


def test_dense_mla_torch_rejects_request_outside_block_table():
    _, block_table, cache = build_requests([3], 16, torch.float32, seed=5)
    with pytest.raises(ValueError, match=r"row_request must index the block table's 1 requests"):
        dense_mla_torch(torch.zeros(1, NUM_HEADS, 576), cache, 1.0, block_table,
                        torch.tensor([1]), torch.tensor([2]), 16, SOFTMAX_SCALE)


def test_check_dense_mla_refuses_another_block_size_than_the_pages():
    """The op's host check, run before every kernel (the launchers do not repeat it)."""
    from atomk31.ops.dense_mla import check_dense_mla

    cache = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    args = (torch.zeros(1, 2, 576), cache, 1.0, torch.zeros(1, 1, dtype=torch.int32),
            torch.tensor([0]), torch.tensor([2]))
    with pytest.raises(ValueError, match="pages hold 16 tokens but block_size is 32"):
        check_dense_mla(*args, 32, 0.1)
    check_dense_mla(*args, 16, 0.1, max_position=2, rows_per_request=1)
