"""Dense MLA on Hopper (gluon_kernels/hopper/dense_mla.py: the warp-specialized sparse kernel in
its dense mode) against dense_mla_torch (§4.5; the dense case of §4.6), on an H100 / H200 with
the Triton kernel's GPU bounds (relative error of out <= 1e-2, of lse <= 1e-3): decode rows,
verification rows grouped 2 and 4 to a CTA (in order and shuffled within a request), prefill
rows of mixed requests, lengths 1, 2049, 5000, 9001 and 17000, block-strided caches, host
hints and explicit splits, decode batches of 1 (one head, one key), 16 and 17 rows. Its sm_90
compile at every batch size: tests/amd_compile/test_gluon_launches.py."""

import pytest
import torch
from triton_kernels.test_dense_mla import LATENT_SCALE, MIXED_ROWS, SOFTMAX_SCALE, build_cache, make_rows

from atomk31.ops.dense_mla import dense_mla_torch
from atomk31.triton_kernels.mla_tiles import MLATileConfig


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None \
        and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not is_hopper(), reason="needs an NVIDIA Hopper GPU (sm_90)")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    finite = torch.isfinite(want)
    diff = (got.double() - want.double()).masked_fill(~finite, 0)
    return (diff.norm() / want.double().masked_fill(~finite, 0).norm().clamp_min(1e-30)).item()


def check(rows, lengths, block_size=128, num_heads=96, every_other_block=False, num_splits=None,
          **hints):
    from gluon_kernels.hopper.dense_mla import dense_mla_hopper

    block_table, cache = build_cache(lengths, block_size, torch.float8_e4m3fn, seed=6,
                                     device="cuda")
    if every_other_block:  # blocks not back to back: the slot splits into block and offset
        spread = torch.zeros(2 * cache.shape[0], *cache.shape[1:], dtype=cache.dtype,
                             device="cuda")
        spread[::2] = cache
        cache = spread[::2]
    row_request, row_position, q = make_rows(rows, num_heads, seed=7)
    args = (q.to(torch.bfloat16).cuda(), cache, LATENT_SCALE, block_table, row_request.cuda(),
            row_position.cuda(), block_size, SOFTMAX_SCALE)
    got_out, got_lse = dense_mla_hopper(*args, config=MLATileConfig(num_splits=num_splits),
                                        **hints)
    want_out, want_lse = dense_mla_torch(args[0].float(), *args[1:])
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    assert relative_error(got_out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3


LENGTHS = [1, 2049, 5000, 9001, 17000]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows_per_request", [1, 2, 4], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hinted", [True, False], ids=["hints", "no-hints"])
def test_dense_mla_gluon_decode_and_verification_rows(rows_per_request, hinted):
    rows = [(r, max(0, n - rows_per_request + j)) for r, n in enumerate(LENGTHS)
            for j in range(rows_per_request)]
    hints = dict(max_position=max(LENGTHS) - 1, rows_per_request=rows_per_request) \
        if hinted else {}
    check(rows, LENGTHS, **hints)


@pytest.mark.gpu
@needs_hopper
def test_dense_mla_gluon_shuffled_verification_rows():
    """Four rows of a request in one CTA at positions out of order: each vector's own causal
    bound, not the group's last."""
    rows = [(r, max(0, n - 1 - j)) for r, n in enumerate(LENGTHS) for j in (2, 0, 3, 1)]
    check(rows, LENGTHS, max_position=max(LENGTHS) - 1, rows_per_request=4)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_splits", [1, 3, 40], ids=lambda s: f"splits{s}")
def test_dense_mla_gluon_explicit_splits_and_strided_blocks(num_splits):
    rows = [(r, max(0, n - 4 + j)) for r, n in enumerate(LENGTHS) for j in range(4)]
    check(rows, LENGTHS, block_size=64, every_other_block=True, rows_per_request=4,
          num_splits=num_splits)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_heads", [16, 64, 96], ids=lambda h: f"H{h}")
def test_dense_mla_gluon_mixed_prefill_and_decode_rows(num_heads):
    """The engine's mixed batches: decode rows, verification rows and prefill rows around
    block edges, in any order, one row a CTA (16 heads: four rows' vectors in a head block
    when grouped, here one)."""
    check(MIXED_ROWS, [1, 37, 41], block_size=16, num_heads=num_heads)


@pytest.mark.gpu
@needs_hopper
def test_dense_mla_gluon_grouped_few_heads():
    """16 heads x 4 rows: one 64-vector head block spans four rows with four bounds."""
    lengths = [3, 130, 700]
    rows = [(r, max(0, n - 4 + j)) for r, n in enumerate(lengths) for j in range(4)]
    check(rows, lengths, block_size=64, num_heads=16, rows_per_request=4)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("num_requests, context, num_heads", [(1, 1, 1), (16, 256, 96),
                                                              (17, 33, 96)],
                         ids=["one-row-one-head-one-key", "sixteen", "odd"])
def test_dense_mla_gluon_decode_batches_of_size_one_sixteen_and_odd(num_requests, context,
                                                                    num_heads):
    """Decode steps as graphs capture them, with the engine's hints: one row per request at
    its last position; with one row of one head over one key every size argument is 1 (Triton
    passes such arguments as constants)."""
    lengths = [context] * num_requests
    rows = [(r, context - 1) for r in range(num_requests)]
    check(rows, lengths, block_size=64, num_heads=num_heads, max_position=context - 1,
          rows_per_request=1)
