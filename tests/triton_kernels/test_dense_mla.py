"""dense_mla_triton against dense_mla_torch (§4.5; the dense case of §4.6): under Triton's
interpreter (fp32 products: rtol/atol 1e-5) on the CPU, and on a GPU at real sizes (H = 96,
contexts past top-k; bf16 products: relative error of the output <= 1e-2)."""

import pytest
import torch

from atomk31.ops.dense_mla import dense_mla_torch
from atomk31.ops.kv_write import kv_write_torch
from atomk31.triton_kernels.mla_tiles import MLATileConfig

KERNEL_MODULES = ("atomk31.triton_kernels.sparse_mla", "atomk31.triton_kernels.dense_mla")
SOFTMAX_SCALE = 192**-0.5  # §4.5
LATENT_SCALE = 0.02
LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def build_cache(request_lengths, block_size, latent_dtype, seed, device="cpu"):
    """Latent rows of each request written into a paged cache with shuffled blocks."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in request_lengths]
    num_blocks = sum(blocks_needed) + 2
    free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(request_lengths), max(blocks_needed) + 1), -1,
                             dtype=torch.int32)
    for request, count in enumerate(blocks_needed):
        for column in range(count):
            block_table[request, column] = free_blocks.pop()
    cache = torch.zeros(num_blocks, block_size, 576, dtype=latent_dtype)
    values = torch.zeros(num_blocks, block_size, 128, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(num_blocks, block_size)
    for request, length in enumerate(request_lengths):
        positions = torch.arange(length)
        slots = block_table[request, positions // block_size].long() * block_size
        slots += positions % block_size
        kv_write_torch(torch.randn(length, 576, generator=generator), torch.zeros(length, 128),
                       slots, cache, LATENT_SCALE, values, scales, "fp8", "e4m3fn")
    return block_table.to(device), cache.to(device)


def make_rows(rows, num_heads, seed):
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64)
    q = torch.randn(len(rows), num_heads, 576, generator=torch.Generator().manual_seed(seed))
    return row_request, row_position, q


def assert_close(name, got, want, rtol=1e-5, atol=1e-5):
    assert got.dtype == torch.float32 and got.shape == want.shape, f"{name}: {got.shape}"
    error = (got - want).abs()
    assert torch.allclose(got, want, rtol=rtol, atol=atol), (
        f"{name}: max abs error {error.max().item():.3e}")


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


# A decode row at position 0, four verification rows, prefill rows around block edges.
MIXED_ROWS = [(2, 40), (1, 33), (0, 0), (1, 34), (2, 0), (1, 35), (2, 16), (1, 36), (2, 15)]


@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("num_splits", [1, 2], ids=lambda s: f"splits{s}")
def test_dense_mla_triton_interpreter_matches_torch(interpreted, num_splits, latent_dtype):
    block_table, cache = build_cache([1, 37, 41], 16, latent_dtype, seed=3)
    row_request, row_position, q = make_rows(MIXED_ROWS, 3, seed=4)
    args = (q, cache, LATENT_SCALE, block_table, row_request, row_position, 16, SOFTMAX_SCALE)
    got_out, got_lse = interpreted.dense_mla_triton(*args,
                                                    config=MLATileConfig(num_splits=num_splits))
    want_out, want_lse = dense_mla_torch(*args)
    assert_close("out", got_out, want_out)
    assert_close("lse", got_lse, want_lse)


# Verification rows: 4 consecutive rows per request (across a block edge), a short last group.
VERIFY_ROWS = [(1, 33), (1, 34), (1, 35), (1, 36), (2, 14), (2, 15), (2, 16), (2, 17), (0, 0)]


@pytest.mark.parametrize("latent_dtype", [torch.bfloat16, torch.float8_e4m3fn],
                         ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("rows_per_request", [None, 2, 4], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
def test_dense_mla_triton_interpreter_grouped_rows_match_torch(interpreted, num_splits,
                                                               rows_per_request, latent_dtype):
    # 5 heads: with 4 rows a program holds 4 x 4 query vectors, the second head block masked.
    # rows_per_request 2 and 4: programs of 2 and 4 rows (the last run short).
    block_table, cache = build_cache([1, 37, 41], 16, latent_dtype, seed=8)
    row_request, row_position, q = make_rows(VERIFY_ROWS, 5, seed=9)
    args = (q, cache, LATENT_SCALE, block_table, row_request, row_position, 16, SOFTMAX_SCALE)
    config = MLATileConfig(num_splits=num_splits, scores_via_memory=num_splits == 3,
                           value_splits=2 if num_splits == 3 else 1)
    got_out, got_lse = interpreted.dense_mla_triton(*args, rows_per_request=rows_per_request,
                                                    config=config)
    want_out, want_lse = dense_mla_torch(*args)
    assert_close("out", got_out, want_out)
    assert_close("lse", got_lse, want_lse)


@pytest.mark.parametrize("max_position, rows_per_request", [(None, None), (36, 4), (50, 2)],
                         ids=["no-hints", "hints-exact", "hints-loose"])
def test_dense_mla_triton_interpreter_host_hints_match_torch(interpreted, max_position,
                                                             rows_per_request):
    """The host-side hints (no device read) give the same result as none: without
    max_position the block table's width (a -1 padded column past the last block) bounds the
    keys; a larger max_position than needed leaves empty splits."""
    block_table, cache = build_cache([1, 37, 41], 16, torch.bfloat16, seed=8)
    row_request, row_position, q = make_rows(VERIFY_ROWS, 5, seed=9)
    args = (q, cache, LATENT_SCALE, block_table, row_request, row_position, 16, SOFTMAX_SCALE)
    got_out, got_lse = interpreted.dense_mla_triton(*args, max_position=max_position,
                                                    rows_per_request=rows_per_request,
                                                    config=MLATileConfig(num_splits=3))
    want_out, want_lse = dense_mla_torch(*args)
    assert_close("out", got_out, want_out)
    assert_close("lse", got_lse, want_lse)


def test_dense_mla_triton_does_not_read_the_device(interpreted, monkeypatch):
    """With the host hints the launcher never turns a device tensor into a Python value."""
    block_table, cache = build_cache([1, 37, 41], 16, torch.bfloat16, seed=8)
    row_request, row_position, q = make_rows(VERIFY_ROWS, 5, seed=9)

    def forbidden(*_args, **_kwargs):
        raise AssertionError("host sync")

    for name in ("tolist", "item", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    out, lse = interpreted.dense_mla_triton(q, cache, LATENT_SCALE, block_table, row_request,
                                            row_position, 16, SOFTMAX_SCALE, max_position=36,
                                            rows_per_request=4)
    monkeypatch.undo()
    want_out, want_lse = dense_mla_torch(q, cache, LATENT_SCALE, block_table, row_request,
                                         row_position, 16, SOFTMAX_SCALE)
    assert_close("out", out, want_out)
    assert_close("lse", lse, want_lse)


@pytest.mark.parametrize("lengths, num_heads", [([1], 1), ([256] * 16, 16), ([33] * 17, 3)],
                         ids=["one-row-one-head-one-key", "sixteen", "odd"])
def test_dense_mla_triton_interpreter_size_one_and_odd_sizes(interpreted, lengths, num_heads):
    """Every size at 1 (Triton passes such arguments as constants), at multiples of 16 and
    odd: one decode row per request at its last position, the engine's host hints."""
    block_table, cache = build_cache(lengths, 16, torch.float8_e4m3fn, seed=len(lengths))
    rows = [(r, n - 1) for r, n in enumerate(lengths)]
    row_request, row_position, q = make_rows(rows, num_heads, seed=2)
    args = (q, cache, LATENT_SCALE, block_table, row_request, row_position, 16, SOFTMAX_SCALE)
    got_out, got_lse = interpreted.dense_mla_triton(*args, max_position=max(lengths) - 1,
                                                    rows_per_request=1)
    want_out, want_lse = dense_mla_torch(*args)
    assert_close("out", got_out, want_out)
    assert_close("lse", got_lse, want_lse)


def test_dense_mla_triton_interpreter_no_rows(interpreted):
    block_table, cache = build_cache([3], 16, torch.bfloat16, seed=5)
    out, lse = interpreted.dense_mla_triton(torch.zeros(0, 2, 576), cache, 1.0, block_table,
                                            torch.zeros(0, dtype=torch.int32),
                                            torch.zeros(0, dtype=torch.int64), 16,
                                            SOFTMAX_SCALE)
    assert out.shape == (0, 2, 512) and lse.shape == (0, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_request", [1, 2, 4], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("scores_via_memory", [False, True], ids=["chained", "via-memory"])
def test_dense_mla_triton_gpu_verification_rows(rows_per_request, scores_via_memory):
    from atomk31.triton_kernels.dense_mla import dense_mla_triton

    lengths = [1, 2049, 5000, 9001]
    block_table, cache = build_cache(lengths, 128, torch.float8_e4m3fn, seed=6, device="cuda")
    rows = [(r, max(0, n - 4 + j)) for r, n in enumerate(lengths) for j in range(4)]
    row_request, row_position, q = make_rows(rows, 96, seed=7)
    q = q.to(torch.bfloat16)
    got_out, got_lse = dense_mla_triton(q.cuda(), cache, LATENT_SCALE, block_table,
                                        row_request.cuda(), row_position.cuda(), 128,
                                        SOFTMAX_SCALE, rows_per_request=rows_per_request,
                                        config=MLATileConfig(
                                            scores_via_memory=scores_via_memory,
                                            value_splits=2 if scores_via_memory else 1))
    want_out, want_lse = dense_mla_torch(q.float().cuda(), cache, LATENT_SCALE, block_table,
                                         row_request.cuda(), row_position.cuda(), 128,
                                         SOFTMAX_SCALE)
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_request", [1, 2, 4], ids=lambda r: f"rows{r}")
def test_dense_mla_triton_gpu_default_tiles(rows_per_request):
    """The launcher's defaults with the engine's host-side hints (H = 96, fp8 latent)."""
    from atomk31.triton_kernels.dense_mla import dense_mla_triton

    lengths = [1, 2049, 5000, 9001, 17000]
    block_table, cache = build_cache(lengths, 128, torch.float8_e4m3fn, seed=6, device="cuda")
    rows = [(r, max(0, n - rows_per_request + j)) for r, n in enumerate(lengths)
            for j in range(rows_per_request)]
    row_request, row_position, q = make_rows(rows, 96, seed=7)
    args = (q.to(torch.bfloat16).cuda(), cache, LATENT_SCALE, block_table, row_request.cuda(),
            row_position.cuda(), 128, SOFTMAX_SCALE)
    got_out, got_lse = dense_mla_triton(*args, max_position=max(lengths) - 1,
                                        rows_per_request=rows_per_request)
    want_out, want_lse = dense_mla_torch(args[0].float(), *args[1:])
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_request", [1, 4], ids=lambda r: f"rows{r}")
def test_dense_mla_triton_gpu_float32_is_exact(rows_per_request):
    """float32 queries and latent: float32 products (the engine's float32 mode)."""
    from atomk31.triton_kernels.dense_mla import dense_mla_triton

    lengths = [5, 700, 1300]
    block_table, cache = build_cache(lengths, 64, torch.float32, seed=10, device="cuda")
    rows = [(r, max(0, n - 4 + j)) for r, n in enumerate(lengths) for j in range(4)]
    row_request, row_position, q = make_rows(rows, 96, seed=11)
    args = (q.cuda(), cache, 1.0, block_table, row_request.cuda(), row_position.cuda(), 64,
            SOFTMAX_SCALE)
    got_out, got_lse = dense_mla_triton(*args, rows_per_request=rows_per_request)
    want_out, want_lse = dense_mla_torch(*args)
    assert_close("out", got_out, want_out, rtol=1e-4, atol=1e-5)
    assert_close("lse", got_lse, want_lse, rtol=1e-5, atol=1e-5)
