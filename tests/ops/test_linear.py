"""Linear ops (MODEL_SPEC §6.5): the BF16 linear and the PTPC-FP8 scaled linear (torch)."""

import pytest
import torch

from atomk31.ops.linear import (
    linear_torch, ptpc_linear_quantized_torch, ptpc_linear_torch, ptpc_quantize_torch,
)
from atomk31.quant.ptpc import quantize_weight_ptpc
from assertions import assert_relative_close


def test_linear_torch_is_x_times_w_transposed():
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 5, generator=generator), torch.randn(4, 5, generator=generator)
    assert_relative_close("y", linear_torch(x, w), torch.einsum("abk,nk->abn", x, w), 1e-6)
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\] and weight \[N, K\]"):
        linear_torch(x, w.T)


@pytest.mark.parametrize("fp8_dtype,fmax", [(torch.float8_e4m3fn, 448.0),
                                            (torch.float8_e4m3fnuz, 240.0)], ids=["fn", "fnuz"])
def test_ptpc_quantize_torch_per_token_scale(fp8_dtype, fmax):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 37, generator=generator) * torch.tensor([1.0, 100.0, 1e-3, 0.0])[:, None]
    q, scale = ptpc_quantize_torch(x, fp8_dtype)
    assert torch.equal(scale, x.abs().amax(1).clamp_min(1e-12) / fmax)
    assert q.dtype == fp8_dtype and q[:3].float().abs().amax(1).eq(fmax).all()
    assert torch.equal(q[3].float(), torch.zeros(37))
    with pytest.raises(ValueError, match="fp8_dtype must be torch.float8_e4m3fn or"):
        ptpc_quantize_torch(x, torch.bfloat16)


def test_ptpc_linear_torch_matches_float64_formula():
    generator = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 64, generator=generator), torch.randn(10, 64, generator=generator)
    w_q, w_scale = quantize_weight_ptpc(w)
    x_q, x_scale = ptpc_quantize_torch(x)
    y = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    expected = (x_q.double() @ w_q.double().T) * x_scale.double()[:, None] * w_scale.double()
    assert_relative_close("y", y, expected, 1e-6)
    assert_relative_close("ptpc_linear", ptpc_linear_torch(x, w_q, w_scale), y, 1e-6)
    assert_relative_close("vs the BF16 linear", y, x @ w.T, 0.1)   # FP8 is coarse but close
    with pytest.raises(ValueError, match=r"expected x_q \[\.\.\., K\], x_scale \[\.\.\.\]"):
        ptpc_linear_quantized_torch(x_q, x_scale[:2], w_q, w_scale)
