"""Triton attention-residual mixing site vs the torch op (MODEL_SPEC §4.3)."""

import pytest
import torch


from atomk31.ops.attn_res import attn_res_torch
from atomk31.triton_kernels.attn_res import attn_res_triton
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_site(num_candidates, num_tokens, hidden, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    candidates = torch.randn(num_candidates, num_tokens, hidden, generator=generator)
    candidates *= torch.rand(num_candidates, num_tokens, 1, generator=generator) * 4  # varied norms
    query = torch.randn(hidden, generator=generator)
    out_weight = torch.randn(hidden, generator=generator)
    return candidates.to(DEVICE, dtype), query.to(DEVICE), out_weight.to(DEVICE)


@pytest.mark.parametrize("num_candidates,num_tokens,hidden", [(1, 3, 256), (4, 7, 300), (9, 1, 1000)],
                         ids=["B0-T3-D256", "B3-T7-D300", "B8-T1-D1000"])
def test_attn_res_triton_matches_torch(num_candidates, num_tokens, hidden):
    candidates, query, out_weight = random_site(num_candidates, num_tokens, hidden, seed=hidden)
    expected = attn_res_torch(candidates, query, out_weight, 1e-5)
    assert_relative_close("mix", attn_res_triton(candidates, query, out_weight, 1e-5), expected, 1e-5)


def test_attn_res_triton_large_scores_do_not_overflow():
    candidates, query, out_weight = random_site(3, 2, 256, seed=1)
    query *= 1e4                                      # scores ~1e4: a naive exp would overflow
    expected = attn_res_torch(candidates, query, out_weight, 1e-5)
    out = attn_res_triton(candidates, query, out_weight, 1e-5)
    assert torch.isfinite(out).all()
    assert_relative_close("mix", out, expected, 1e-5)


def test_attn_res_triton_empty_tokens_and_bad_query():
    candidates, query, out_weight = random_site(2, 0, 64, seed=2)
    assert attn_res_triton(candidates, query, out_weight, 1e-5).shape == (0, 64)
    with pytest.raises(ValueError, match=r"query must have shape \[64\]"):
        attn_res_triton(candidates, query[:10], out_weight, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_candidates", [1, 9], ids=lambda b: f"B{b - 1}")
def test_attn_res_triton_real_shapes_gpu(num_candidates):
    candidates, query, out_weight = random_site(num_candidates, 2000, 7168, seed=3,
                                                dtype=torch.bfloat16)
    expected = attn_res_torch(candidates.float(), query, out_weight, 1e-5)
    out = attn_res_triton(candidates, query, out_weight, 1e-5)
    assert_relative_close("mix", out.float(), expected, 1e-2)       # BF16 output rounding
