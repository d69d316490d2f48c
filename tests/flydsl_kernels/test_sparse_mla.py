"""FlyDSL sparse MLA against the op's torch implementation (``-m amd``: needs gfx950).

The kernel quantizes each query head to e4m3 and rounds P to bf16 (flydsl_kernels/
sparse_mla.py docstring), so the reference gets the same e4m3 queries (dequantized) and the
tolerance is bf16-level. On the CPU: the host-side query quantization. The kernel's gfx950
ISA is checked in tests/amd_compile/test_flydsl_compile.py.
"""

import importlib.util

import pytest
import torch

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


@pytest.mark.amd
@needs_flydsl
@pytest.mark.parametrize("num_heads,num_selected", [(16, 64), (12, 2048), (20, 37)],
                         ids=["H16-k64", "H12-k2048", "H20-k37-ragged"])
def test_sparse_mla_flydsl_matches_torch(num_heads, num_selected):
    from flydsl_kernels.sparse_mla import prepare_queries, sparse_mla_flydsl

    generator = torch.Generator().manual_seed(num_heads + num_selected)
    device = torch.device("cuda")
    num_blocks, block_size, num_rows = 40, 64, 5
    latent = (torch.randn(num_blocks, block_size, 576, generator=generator)
              .clamp(-8, 8).to(torch.float8_e4m3fn).to(device))
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
