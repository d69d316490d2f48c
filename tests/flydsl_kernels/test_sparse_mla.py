"""FlyDSL sparse MLA against the op's torch implementation (``-m amd``: needs gfx950).

The kernel quantizes each query head to e4m3 and rounds P to bf16 (flydsl_kernels/
sparse_mla.py docstring), so the reference gets the same e4m3 queries (dequantized) and the
tolerance is bf16-level; the cache is a contiguous one and the engine's strided pool view. On
the CPU: the host-side query quantization and the latent's span view. The kernel's gfx950
compile with the engine's tensors and its ISA: tests/amd_compile/test_flydsl_compile.py.
"""

import importlib.util

import pytest
import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout
from atomk31.ops.sparse_mla import sparse_mla_torch

needs_flydsl = pytest.mark.skipif(importlib.util.find_spec("flydsl") is None,
                                  reason="needs the flydsl package")


@needs_flydsl
def test_prepare_queries_round_trips_to_e4m3_with_folded_scales():
    from flydsl_kernels.sparse_mla import prepare_queries

    q = torch.randn(3, 5, 576, generator=torch.Generator().manual_seed(0))
    words, scales = prepare_queries(q, latent_scale=2.0, softmax_scale=0.5)
    assert words.shape == (3, 5, 72) and words.dtype == torch.int64
    values = words.view(torch.uint8).view(torch.float8_e4m3fn).float().view(3, 5, 576)
    restored = values * (scales / (2.0 * 0.5))[..., None]
    assert torch.allclose(restored, q, rtol=2 ** -3, atol=1e-6)
    assert float(values.abs().amax()) == 448.0


def engine_latent(num_blocks: int, block_size: int, device: str = "cpu") -> torch.Tensor:
    """Layer 1's latent page of a 2-layer FP8 pool (a block stride of the whole row)."""
    layout = PackedLayout(CacheLayoutSpec(block_size=block_size, num_mla_layers=2))
    return layout.layer_view(layout.allocate(num_blocks, device), 1).latent


@needs_flydsl
def test_latent_span_reads_the_engine_view_in_place():
    from flydsl_kernels.sparse_mla import latent_span

    latent = engine_latent(5, 16)
    latent.view(torch.uint8)[3, 7] = torch.arange(576, dtype=torch.int64).remainder(251).to(
        torch.uint8)
    span, stride_block_words, stride_token_words = latent_span(latent)
    assert span.data_ptr() == latent.data_ptr() and span.dim() == 1
    assert stride_block_words * 8 == latent.stride(0) and stride_token_words == 72
    row = 3 * stride_block_words * 8 + 7 * stride_token_words * 8
    assert torch.equal(span[row:row + 576], latent.view(torch.uint8)[3, 7])
    assert span.view(torch.int64).numel() * 8 == span.numel()


@needs_flydsl
def test_latent_span_refuses_rows_off_8_byte_words():
    from flydsl_kernels.sparse_mla import latent_span

    unaligned = torch.zeros(2, 16, 580, dtype=torch.float8_e4m3fn)[:, :, 4:]
    with pytest.raises(ValueError, match="rows must be dense and 8-byte aligned"):
        latent_span(unaligned)


@pytest.mark.amd
@needs_flydsl
@pytest.mark.parametrize("num_heads,num_selected,engine_view",
                         [(16, 64, False), (12, 2048, False), (20, 37, False), (96, 300, True)],
                         ids=["H16-k64", "H12-k2048", "H20-k37-ragged", "H96-k300-pool-view"])
def test_sparse_mla_flydsl_matches_torch(num_heads, num_selected, engine_view):
    from flydsl_kernels.sparse_mla import prepare_queries, sparse_mla_flydsl

    generator = torch.Generator().manual_seed(num_heads + num_selected)
    device = torch.device("cuda")
    num_blocks, block_size, num_rows = 40, 64, 5
    rows = (torch.randn(num_blocks, block_size, 576, generator=generator)
            .clamp(-8, 8).to(torch.float8_e4m3fn).to(device))
    latent = rows
    if engine_view:  # the engine's pool view: rows strided by the whole packed block row
        latent = engine_latent(num_blocks, block_size, "cuda")
        latent.copy_(rows)
    q = torch.randn(num_rows, num_heads, 576, generator=generator).to(device)
    slots = torch.randint(0, num_blocks * block_size, (num_rows, num_selected),
                          generator=generator, dtype=torch.int32).to(device)
    slots[1, ::3] = -1
    slots[2] = -1  # a row with nothing selected: out 0, lse -inf
    scale, softmax_scale = 0.5, 192 ** -0.5
    out, lse = sparse_mla_flydsl(q, latent, scale, slots, softmax_scale)
    words, q_scales = prepare_queries(q, scale, softmax_scale)
    q_e4m3 = (words.view(torch.uint8).view(torch.float8_e4m3fn).float().view_as(q)
              * (q_scales / (scale * softmax_scale))[..., None])
    expected_out, expected_lse = sparse_mla_torch(q_e4m3, latent, scale, slots, softmax_scale)
    assert torch.equal(torch.isinf(lse), torch.isinf(expected_lse))
    finite = torch.isfinite(expected_lse)
    assert torch.allclose(lse[finite], expected_lse[finite], rtol=1e-3, atol=1e-3)
    assert torch.allclose(out, expected_out, rtol=2e-2, atol=2e-2 * float(expected_out.abs().max()))
