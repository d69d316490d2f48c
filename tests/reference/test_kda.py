"""KDA mixer pieces: short convolution, gates, and the whole layer with state continuation."""

import pytest
import torch

from atomk31.reference import KdaWeights, kda_gates, kda_layer, short_conv_silu


def random_kda_weights(hidden: int, heads: int, head_dim: int, seed: int) -> KdaWeights:
    generator = torch.Generator().manual_seed(seed)
    channels = heads * head_dim

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=generator) * in_features**-0.5

    return KdaWeights(
        q_proj=linear(channels, hidden),
        k_proj=linear(channels, hidden),
        v_proj=linear(channels, hidden),
        g_proj=linear(channels, hidden),
        q_conv1d=torch.randn(channels, 4, generator=generator) * 0.5,
        k_conv1d=torch.randn(channels, 4, generator=generator) * 0.5,
        v_conv1d=torch.randn(channels, 4, generator=generator) * 0.5,
        f_a_proj=linear(head_dim, hidden),
        f_b_proj=linear(channels, head_dim),
        b_proj=linear(heads, hidden),
        A_log=torch.randn(heads, generator=generator) * 0.3,
        dt_bias=torch.rand(channels, generator=generator) * 2.0 - 3.0,
        o_norm=1.0 + 0.1 * torch.randn(head_dim, generator=generator),
        o_proj=linear(hidden, channels),
    )


@pytest.mark.parametrize("num_tokens", [1, 2, 9], ids=lambda t: f"T{t}")
def test_short_conv_silu_is_a_causal_depthwise_conv1d(num_tokens: int) -> None:
    generator = torch.Generator().manual_seed(num_tokens)
    z = torch.randn(num_tokens, 6, generator=generator)
    weight = torch.randn(6, 4, generator=generator)
    output, cache = short_conv_silu(z, weight)
    conv = torch.nn.functional.conv1d(z.T.unsqueeze(0), weight.unsqueeze(1), groups=6, padding=3)[0, :, :num_tokens]
    torch.testing.assert_close(output, torch.nn.functional.silu(conv.T), rtol=1e-6, atol=1e-6)
    # The cache holds the last Kc-1 inputs, zero-padded for short sequences.
    torch.testing.assert_close(cache, torch.cat([torch.zeros(3, 6), z])[-3:])


def test_short_conv_silu_continues_from_its_cache() -> None:
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(7, 5, generator=generator)
    weight = torch.randn(5, 4, generator=generator)
    whole, whole_cache = short_conv_silu(z, weight)
    pieces, cache = [], None
    for piece in (z[:1], z[1:3], z[3:]):
        output, cache = short_conv_silu(piece, weight, cache)
        pieces.append(output)
    torch.testing.assert_close(torch.cat(pieces), whole)
    torch.testing.assert_close(cache, whole_cache)


def test_kda_gates_lower_bounded_form() -> None:
    generator = torch.Generator().manual_seed(0)
    f, b = torch.randn(5, 2, 3, generator=generator) * 4, torch.randn(5, 2, generator=generator)
    A_log, dt_bias = torch.randn(2, generator=generator), torch.randn(6, generator=generator)
    g, beta = kda_gates(f, b, A_log, dt_bias, gate_lower_bound=-5.0)
    expected = -5.0 * torch.sigmoid(torch.exp(A_log)[None, :, None] * (f + dt_bias.view(2, 3)))
    torch.testing.assert_close(g, expected)
    assert bool(((g <= 0) & (g >= -5.0)).all())      # (lb, 0), closed in fp32 where sigmoid saturates
    torch.testing.assert_close(beta, torch.sigmoid(b))


def test_kda_gates_without_lower_bound_use_the_softplus_form() -> None:
    generator = torch.Generator().manual_seed(1)
    f, b = torch.randn(4, 2, 3, generator=generator), torch.randn(4, 2, generator=generator)
    A_log, dt_bias = torch.randn(2, generator=generator), torch.randn(6, generator=generator)
    g, _ = kda_gates(f, b, A_log, dt_bias, gate_lower_bound=None)
    expected = -torch.exp(A_log)[None, :, None] * torch.nn.functional.softplus(f + dt_bias.view(2, 3))
    torch.testing.assert_close(g, expected)


def test_kda_layer_prefill_then_decode_equals_one_pass() -> None:
    weights = random_kda_weights(hidden=48, heads=2, head_dim=16, seed=0)
    x = torch.randn(12, 48, generator=torch.Generator().manual_seed(1))
    whole, whole_state = kda_layer(x, weights, gate_lower_bound=-5.0, eps=1e-5)
    first, state = kda_layer(x[:9], weights, gate_lower_bound=-5.0, eps=1e-5)
    outputs = [first]
    for t in range(9, 12):
        output, state = kda_layer(x[t : t + 1], weights, gate_lower_bound=-5.0, eps=1e-5, state=state)
        outputs.append(output)
    torch.testing.assert_close(torch.cat(outputs), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.recurrent, whole_state.recurrent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.conv_v, whole_state.conv_v)


def test_kda_layer_chunked_scan_matches_sequential() -> None:
    weights = random_kda_weights(hidden=48, heads=2, head_dim=16, seed=2)
    x = torch.randn(21, 48, generator=torch.Generator().manual_seed(3))
    sequential, _ = kda_layer(x, weights, gate_lower_bound=-5.0, eps=1e-5)
    chunked, _ = kda_layer(x, weights, gate_lower_bound=-5.0, eps=1e-5, chunk_size=8)
    assert float((chunked - sequential).abs().max() / sequential.abs().max()) < 1e-3
