"""attn_res (torch) against a per-token loop and the oracle (§4.3)."""

import math

import pytest
import torch

from atomk31.ops.attn_res import attn_res_torch
from atomk31.ops.norms import rms_norm_torch
from atomk31.reference.attn_res import attn_res as reference_attn_res


def naive_attn_res_token(candidates: list[list[float]], query: list[float], out_weight: list[float],
                         eps: float) -> list[float]:
    """One token: softmax over depth of w_p . rms_norm(v, w_n) (query = w_n * w_p), mix, norm."""
    def inverse_rms(row):
        return 1.0 / math.sqrt(sum(x * x for x in row) / len(row) + eps)

    scores = [sum(x * q for x, q in zip(row, query)) * inverse_rms(row) for row in candidates]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    weights = [w / sum(weights) for w in weights]
    mixed = [sum(w * row[d] for w, row in zip(weights, candidates)) for d in range(len(query))]
    scale = inverse_rms(mixed)
    return [w * m * scale for w, m in zip(out_weight, mixed)]


@pytest.mark.parametrize("num_candidates,num_tokens,hidden", [(1, 3, 16), (2, 1, 7), (4, 5, 40), (9, 2, 24)],
                         ids=["B0-T3-D16", "B1-T1-D7", "B3-T5-D40", "B8-T2-D24"])
def test_attn_res_torch_matches_token_loop(num_candidates, num_tokens, hidden):
    torch.manual_seed(0)
    candidates = torch.randn(num_candidates, num_tokens, hidden) * torch.rand(num_candidates, 1, 1) * 5
    w_p, w_n, out_weight = torch.randn(hidden), torch.rand(hidden) + 0.5, torch.randn(hidden)
    out = attn_res_torch(candidates, w_n * w_p, out_weight, 1e-5)
    assert out.shape == (num_tokens, hidden) and out.dtype == torch.float32
    for t in range(num_tokens):
        expected = naive_attn_res_token(candidates[:, t].double().tolist(), (w_n * w_p).double().tolist(),
                                        out_weight.double().tolist(), 1e-5)
        torch.testing.assert_close(out[t].double(), torch.tensor(expected, dtype=torch.float64),
                                   rtol=1e-5, atol=1e-5)
    blocks = list(candidates[:-1])
    torch.testing.assert_close(out, reference_attn_res(blocks, candidates[-1], w_p, w_n, out_weight, 1e-5),
                               rtol=1e-5, atol=1e-5)


def test_attn_res_torch_without_blocks_is_rms_norm_of_prefix():
    torch.manual_seed(1)
    prefix, out_weight = torch.randn(4, 32), torch.randn(32)
    out = attn_res_torch(prefix[None], torch.randn(32), out_weight, 1e-5)
    torch.testing.assert_close(out, rms_norm_torch(prefix, out_weight, 1e-5), rtol=1e-6, atol=1e-6)


def test_attn_res_torch_bf16_and_empty():
    torch.manual_seed(2)
    candidates, query = torch.randn(3, 2, 16).bfloat16(), torch.randn(16)
    out = attn_res_torch(candidates, query, torch.ones(16), 1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, attn_res_torch(candidates.float(), query, torch.ones(16), 1e-5).bfloat16())
    assert attn_res_torch(torch.zeros(2, 0, 16), torch.ones(16), torch.ones(16), 1e-5).shape == (0, 16)


def test_attn_res_torch_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"candidates must be \[B\+1, T, D\]"):
        attn_res_torch(torch.randn(4, 16), torch.ones(16), torch.ones(16), 1e-5)
    with pytest.raises(ValueError, match=r"query must have shape \[16\]"):
        attn_res_torch(torch.randn(2, 4, 16), torch.ones(15), torch.ones(16), 1e-5)
