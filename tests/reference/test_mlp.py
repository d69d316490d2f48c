"""SiTU-GLU and the dense MLP (MODEL_SPEC §4.8, §4.9)."""

import torch

from atomk31.reference import MlpWeights, dense_mlp, situ_glu


def test_situ_glu_caps_both_branches() -> None:
    gate = torch.tensor([0.0, 1.0, 50.0, -50.0])
    up = torch.tensor([1.0, 2.0, 1000.0, 3.0])
    expected = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * 25.0 * torch.tanh(up / 25.0)
    torch.testing.assert_close(situ_glu(gate, up, 4.0, 25.0), expected)
    assert abs(float(situ_glu(torch.tensor(50.0), torch.tensor(1000.0), 4.0, 25.0)) - 100.0) < 1e-3   # beta * lin_beta


def test_situ_glu_without_linear_cap_passes_up_through() -> None:
    gate, up = torch.tensor([0.7, -2.0]), torch.tensor([1000.0, -3.0])
    torch.testing.assert_close(situ_glu(gate, up, 1.0, None), torch.tanh(gate) * torch.sigmoid(gate) * up)


def test_dense_mlp_is_down_of_situ_glu_of_gate_and_up() -> None:
    generator = torch.Generator().manual_seed(0)
    gate, up, down = (torch.randn(*shape, generator=generator) for shape in ((8, 4), (8, 4), (4, 8)))
    weights = MlpWeights(gate, up, down)
    x = torch.randn(3, 4, generator=generator)
    expected = situ_glu(x @ weights.gate_proj.T, x @ weights.up_proj.T, 4.0, 25.0) @ weights.down_proj.T
    torch.testing.assert_close(dense_mlp(x, weights, 4.0, 25.0), expected)
