"""RMSNorm, LayerNorm and L2 normalisation (MODEL_SPEC §4.2)."""

import torch

from atomk31.reference import l2_normalize, layer_norm, rms_norm


def test_rms_norm_multiplies_by_the_weight_directly() -> None:
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(3, 16, generator=generator), torch.randn(16, generator=generator)
    expected = torch.nn.functional.rms_norm(x, (16,), weight, eps=1e-5)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), expected)


def test_layer_norm_uses_the_biased_variance() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 128, generator=generator)
    weight, bias = torch.randn(128, generator=generator), torch.randn(128, generator=generator)
    expected = torch.nn.functional.layer_norm(x, (128,), weight, bias, eps=1e-6)
    torch.testing.assert_close(layer_norm(x, weight, bias, 1e-6), expected)


def test_l2_normalize_adds_eps_inside_the_square_root() -> None:
    x = torch.tensor([[3.0, 4.0], [1e-4, 0.0]])
    norm_first, norm_second = (25.0 + 1e-6) ** 0.5, (1e-8 + 1e-6) ** 0.5
    expected = torch.tensor([[3.0 / norm_first, 4.0 / norm_first], [1e-4 / norm_second, 0.0]])
    torch.testing.assert_close(l2_normalize(x, 1e-6), expected)
