"""indexer_score (torch) against a naive per-row loop over each request's own keys (§4.6
"Quantized evaluation"), with the oracle's number formats for q̂ and k̂."""

import pytest
import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.kv_write import kv_write_torch
from atomk31.reference.formats import fake_quant_fp8_groups, fake_quant_mxfp4

NUM_INDEX_HEADS = 4  # H_I, small to stay fast
KEY_FORMATS = [("fp8", "e4m3fn"), ("fp8", "e4m3fnuz"), ("mxfp4", "e4m3fn")]


def fake_quant(x: torch.Tensor, index_format: str, fp8_variant: str) -> torch.Tensor:
    if index_format == "fp8":
        return fake_quant_fp8_groups(x, fp8_variant)
    return fake_quant_mxfp4(x)


def build_requests(request_lengths, block_size, index_format, fp8_variant, seed):
    """Write each request's keys into a shared paged cache whose blocks are handed out in a
    shuffled order (non-contiguous, out of order); returns keys per request and the cache."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in request_lengths]
    max_blocks = max(blocks_needed) + 1  # one spare column of -1 padding
    num_blocks = sum(blocks_needed) + 3  # spare blocks stay unused
    free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(request_lengths), max_blocks), -1, dtype=torch.int32)
    for request, count in enumerate(blocks_needed):
        for column in range(count):
            block_table[request, column] = free_blocks.pop()
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    if index_format == "fp8":
        fp8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fp8_variant]
        index_values = torch.zeros(num_blocks, block_size, 128, dtype=fp8)
        index_scales = torch.zeros(num_blocks, block_size)
    else:
        index_values = torch.zeros(num_blocks, block_size, 64, dtype=torch.uint8)
        index_scales = torch.zeros(num_blocks, block_size, 4, dtype=torch.uint8)
    keys = []
    for request, length in enumerate(request_lengths):
        request_keys = torch.randn(length, 128, generator=generator)
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        kv_write_torch(torch.zeros(length, 576), request_keys, slots, latent_cache, 1.0,
                       index_values, index_scales, index_format, fp8_variant)
        keys.append(request_keys)
    return keys, block_table, index_values, index_scales


def naive_scores(q, head_weights, keys, row_request, row_position, index_format, fp8_variant):
    """scores[i, s] = sum_h w_h relu(q̂_h · k̂_s) for s <= p_i, else -inf; row by row."""
    length = int(row_position.max()) + 1
    out = torch.full((q.shape[0], length), -torch.inf)
    for i in range(q.shape[0]):
        request, position = int(row_request[i]), int(row_position[i])
        q_hat = fake_quant(q[i], index_format, fp8_variant)  # [H_I, 128], per head
        k_hat = fake_quant(keys[request][: position + 1], index_format, fp8_variant)
        for s in range(position + 1):
            out[i, s] = (head_weights[i] * torch.relu(q_hat @ k_hat[s])).sum()
    return out


def assert_scores_close(name, got, want):
    """Same -inf pattern; finite parts within rtol 1e-5, atol 1e-5 * the row's max |score|."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{name}: -inf mask differs"
    finite = torch.isfinite(want)
    row_scale = torch.where(finite, want.abs(), 0.0).amax(dim=1, keepdim=True).clamp_min(1e-30)
    error = torch.where(finite, (got - want).abs(), 0.0)
    bound = 1e-5 * want.abs() + 1e-5 * row_scale
    worst = (error / bound).max().item() if want.numel() else 0.0
    assert worst <= 1.0, f"{name}: max error {error.max().item():.3e} is {worst:.2f}x the bound"


# Rows: a decode row at position 0 (length 1), four verification rows of one request with
# consecutive positions, prefill rows around block edges; requests interleaved.
REQUEST_LENGTHS = [1, 37, 130]
ROWS = [(2, 129), (1, 33), (0, 0), (1, 34), (2, 0), (1, 35), (2, 64), (1, 36), (2, 127),
        (2, 128), (2, 16), (2, 15)]


@pytest.mark.parametrize("key_format", KEY_FORMATS, ids=lambda f: "keys_" + "_".join(f))
@pytest.mark.parametrize("block_size", [16, 128], ids=lambda b: f"bs{b}")
def test_indexer_score_torch_matches_naive_loop(block_size, key_format):
    index_format, fp8_variant = key_format
    keys, block_table, index_values, index_scales = build_requests(
        REQUEST_LENGTHS, block_size, index_format, fp8_variant, seed=block_size)
    generator = torch.Generator().manual_seed(7)
    row_request = torch.tensor([r for r, _ in ROWS], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in ROWS], dtype=torch.int64)
    q = torch.randn(len(ROWS), NUM_INDEX_HEADS, 128, generator=generator)
    head_weights = torch.randn(len(ROWS), NUM_INDEX_HEADS, generator=generator)
    head_weights *= NUM_INDEX_HEADS**-0.5 * 128**-0.5  # signs mixed: scores can be negative

    got = indexer_score_torch(q, head_weights, index_values, index_scales, index_format,
                              fp8_variant, block_table, row_request, row_position, block_size)
    want = naive_scores(q, head_weights, keys, row_request, row_position, index_format,
                        fp8_variant)
    assert got.dtype == torch.float32
    assert_scores_close("indexer scores", got, want)


def test_indexer_score_torch_takes_num_positions_from_the_host():
    """num_positions = max + 1 gives the same scores; a wider L adds -inf columns."""
    keys, block_table, index_values, index_scales = build_requests(
        REQUEST_LENGTHS, 16, "fp8", "e4m3fn", seed=3)
    generator = torch.Generator().manual_seed(5)
    row_request = torch.tensor([r for r, _ in ROWS], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in ROWS], dtype=torch.int64)
    q = torch.randn(len(ROWS), NUM_INDEX_HEADS, 128, generator=generator)
    head_weights = torch.randn(len(ROWS), NUM_INDEX_HEADS, generator=generator)
    args = (q, head_weights, index_values, index_scales, "fp8", "e4m3fn", block_table,
            row_request, row_position, 16)
    default = indexer_score_torch(*args)
    length = int(row_position.max()) + 1
    assert torch.equal(indexer_score_torch(*args, num_positions=length), default)
    wider = indexer_score_torch(*args, num_positions=length + 5)
    assert wider.shape == (len(ROWS), length + 5)
    assert torch.equal(wider[:, :length], default) and torch.isneginf(wider[:, length:]).all()


def test_indexer_score_torch_quantizes_the_query():
    # With a query far from the fp8 grid, skipping the query quantization changes the scores.
    keys, block_table, values, scales = build_requests([5], 16, "fp8", "e4m3fn", seed=3)
    q = torch.randn(1, NUM_INDEX_HEADS, 128, generator=torch.Generator().manual_seed(4))
    weights = torch.ones(1, NUM_INDEX_HEADS)
    got = indexer_score_torch(q, weights, values, scales, "fp8", "e4m3fn", block_table,
                              torch.tensor([0]), torch.tensor([4]), 16)
    k_hat = fake_quant_fp8_groups(keys[0], "e4m3fn")
    unquantized = torch.relu(q[0] @ k_hat.T).sum(0)
    assert not torch.allclose(got[0], unquantized, rtol=1e-6, atol=0)


def test_indexer_score_torch_with_no_rows_returns_empty():
    _, block_table, values, scales = build_requests([3], 16, "fp8", "e4m3fn", seed=5)
    no_rows = torch.zeros(0, dtype=torch.int64)
    got = indexer_score_torch(torch.zeros(0, NUM_INDEX_HEADS, 128), torch.zeros(0, NUM_INDEX_HEADS),
                              values, scales, "fp8", "e4m3fn", block_table, no_rows.int(),
                              no_rows, 16)
    assert got.shape == (0, 0)


def test_indexer_score_torch_rejects_position_without_a_block():
    _, block_table, values, scales = build_requests([20], 16, "fp8", "e4m3fn", seed=6)
    block_table[0, 1] = -1
    with pytest.raises(ValueError, match=r"request 0 has no block for position 16"):
        indexer_score_torch(torch.zeros(1, NUM_INDEX_HEADS, 128), torch.zeros(1, NUM_INDEX_HEADS),
                            values, scales, "fp8", "e4m3fn", block_table,
                            torch.tensor([0]), torch.tensor([19]), 16)


def test_indexer_score_torch_rejects_query_of_wrong_head_dim():
    _, block_table, values, scales = build_requests([3], 16, "fp8", "e4m3fn", seed=8)
    with pytest.raises(ValueError, match=r"q must be \[Nq=1, H_I, 128\], got \[1, 4, 64\]"):
        indexer_score_torch(torch.zeros(1, NUM_INDEX_HEADS, 64), torch.zeros(1, NUM_INDEX_HEADS),
                            values, scales, "fp8", "e4m3fn", block_table,
                            torch.tensor([0]), torch.tensor([2]), 16)


def test_check_indexer_score_refuses_wrong_head_weights_and_pages():
    """The op's host check, run before every kernel (the launchers do not repeat it)."""
    from atomk31.ops.indexer_score import check_indexer_score

    values = torch.zeros(2, 16, 128, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(2, 16)
    args = (values, scales, "fp8", "e4m3fn", torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([0], dtype=torch.int32), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"head_weights must be \[Nq=1, H_I=4\], got \[1, 3\]"):
        check_indexer_score(torch.zeros(1, 4, 128), torch.zeros(1, 3), *args, 16)
    with pytest.raises(ValueError, match=r"pages hold 16 tokens but block_size is 32"):
        check_indexer_score(torch.zeros(1, 4, 128), torch.zeros(1, 4), *args, 32)
    check_indexer_score(torch.zeros(1, 4, 128), torch.zeros(1, 4), *args, 16)
