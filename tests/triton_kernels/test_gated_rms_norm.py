"""Triton gated RMSNorm (KDA o_norm) vs the torch op.

The interpreter truncates fp32 -> BF16 casts, so CPU runs use fp32 activations; the GPU test
(``-m gpu``) checks BF16 at real shapes.
"""

import pytest
import torch

from atomk31.ops.norms import gated_rms_norm_torch
from atomk31.triton_kernels.gated_rms_norm import gated_rms_norm_triton
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_rows(num_tokens, num_heads, value_dim, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, num_heads, value_dim, generator=generator) * 2
    gate = torch.randn(num_tokens, num_heads, value_dim, generator=generator)
    weight = torch.randn(value_dim, generator=generator)
    return x.to(DEVICE, dtype), gate.to(DEVICE, dtype), weight.to(DEVICE)


@pytest.mark.parametrize("num_tokens,num_heads,value_dim", [(1, 1, 128), (17, 3, 128), (5, 2, 100)],
                         ids=["T1-H1-V128", "T17-H3-V128", "T5-H2-V100"])
def test_gated_rms_norm_triton_matches_torch(num_tokens, num_heads, value_dim):
    x, gate, weight = random_rows(num_tokens, num_heads, value_dim, seed=value_dim)
    expected = gated_rms_norm_torch(x, gate, weight, 1e-5)
    assert_relative_close("y", gated_rms_norm_triton(x, gate, weight, 1e-5), expected, 1e-6)


def test_gated_rms_norm_triton_rejects_mismatched_gate():
    x, gate, weight = random_rows(2, 2, 128, seed=2)
    with pytest.raises(ValueError, match=r"gate must have the shape of x \(2, 2, 128\)"):
        gated_rms_norm_triton(x, gate[:1], weight, 1e-5)


@pytest.mark.gpu
def test_gated_rms_norm_triton_real_shapes_gpu():
    x, gate, weight = random_rows(3000, 96, 128, seed=3, dtype=torch.bfloat16)
    expected = gated_rms_norm_torch(x, gate, weight, 1e-5)
    y = gated_rms_norm_triton(x, gate, weight, 1e-5)
    assert_relative_close("y", y.float(), expected.float(), 1e-2)
