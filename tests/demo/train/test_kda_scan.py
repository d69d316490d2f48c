"""The trainer's batched chunked KDA scan equals the reference's sequential definition."""

import pytest
import torch

from atomk31.demo.train.kda_scan import kda_chunked_batched
from atomk31.reference.kda_scan import kda_recurrent


def _inputs(batch: int, tokens: int, heads: int, dim: int, floor: float, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, tokens, heads, dim, generator=generator) for _ in range(3))
    g = floor * torch.rand(batch, tokens, heads, dim, generator=generator)
    beta = torch.rand(batch, tokens, heads, generator=generator)
    return q, k, v, g, beta


@pytest.mark.parametrize("tokens", [1, 63, 64, 150])
@pytest.mark.parametrize("floor", [-5.0, -0.05])
def test_chunked_batched_equals_the_recurrence(tokens, floor):
    q, k, v, g, beta = _inputs(2, tokens, 2, 32, floor)
    output = kda_chunked_batched(q, k, v, g, beta)
    for b in range(2):
        reference, _ = kda_recurrent(q[b], k[b], v[b], g[b], beta[b])
        torch.testing.assert_close(output[b], reference, rtol=1e-4, atol=1e-5)


def test_gates_at_the_floor_stay_finite_with_gradients():
    q, k, v, g, beta = _inputs(1, 200, 1, 16, -5.0)
    g = torch.full_like(g, -4.999)             # 64 steps of -5: exp(+320) would overflow
    q.requires_grad_()
    output = kda_chunked_batched(q, k, v, g, beta)
    output.square().sum().backward()
    assert torch.isfinite(output).all() and torch.isfinite(q.grad).all()
    reference, _ = kda_recurrent(q[0].detach(), k[0], v[0], g[0], beta[0])
    torch.testing.assert_close(output[0].detach(), reference, rtol=1e-4, atol=1e-5)
