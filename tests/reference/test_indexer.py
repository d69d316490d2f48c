"""Indexer scores and top-k selection semantics (MODEL_SPEC §4.6, §9 #5, §9 #6)."""

import pytest
import torch

from atomk31.reference import (
    IndexerWeights,
    indexer_projections,
    indexer_scores,
    indexer_select,
    select_topk,
    simulate_index_quantization,
)


def test_indexer_scores_follow_the_formula_and_mask_the_future() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(5, 3, 8, generator=generator)
    k = torch.randn(5, 8, generator=generator)
    head_weights = torch.randn(5, 3, generator=generator)
    positions = torch.arange(5)
    scores = indexer_scores(q, k, head_weights, positions)
    for t in range(5):
        for s in range(5):
            expected = sum(float(head_weights[t, h]) * max(float(q[t, h] @ k[s]), 0.0) for h in range(3))
            if s > t:
                assert scores[t, s] == float("-inf")
            else:
                assert abs(float(scores[t, s]) - expected) < 1e-5


def test_indexer_projections_scale_head_weights_by_heads_and_dim() -> None:
    generator = torch.Generator().manual_seed(1)
    weights = IndexerWeights(
        wq_b=torch.randn(2 * 128, 16, generator=generator),
        wk=torch.randn(128, 24, generator=generator),
        k_norm_weight=torch.ones(128),
        k_norm_bias=torch.zeros(128),
        weights_proj=torch.randn(2, 24, generator=generator),
    )
    x, q_latent = torch.randn(3, 24, generator=generator), torch.randn(3, 16, generator=generator)
    q, k, head_weights = indexer_projections(x, q_latent, weights)
    assert q.shape == (3, 2, 128) and k.shape == (3, 128)
    torch.testing.assert_close(head_weights, (x @ weights.weights_proj.T) / (2**0.5 * 128**0.5))
    torch.testing.assert_close(k.mean(-1), torch.zeros(3), atol=1e-5, rtol=0)    # LayerNorm, unit weight, no bias


def test_select_topk_keeps_min_of_topk_and_position_plus_one() -> None:
    scores = torch.randn(10, 10, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(10)
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    allowed = select_topk(scores, positions, index_topk=4)
    assert allowed.sum(-1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]
    # The kept keys are the highest-scoring ones.
    for t in range(4, 10):
        kept = scores[t][allowed[t]]
        dropped = scores[t, : t + 1][~allowed[t, : t + 1]]
        assert float(kept.min()) >= float(dropped.max())


def test_select_topk_breaks_ties_by_lower_position() -> None:
    scores = torch.tensor([[1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]])
    allowed = select_topk(scores, torch.tensor([6]), index_topk=4)
    assert allowed[0].tolist() == [True, True, False, True, False, True, False]


def test_select_topk_treats_negative_zero_as_equal_to_positive_zero() -> None:
    scores = torch.tensor([[-0.0, 0.0, -0.0, 0.0]])
    allowed = select_topk(scores, torch.tensor([3]), index_topk=2)
    assert allowed[0].tolist() == [True, True, False, False]      # ties -> lower positions, sign ignored


def test_select_topk_never_selects_a_future_key() -> None:
    """A future key with the highest dot product stays out: the indexer masks it before top-k."""
    q = torch.ones(4, 1, 8)
    k = torch.stack([torch.full((8,), float(s)) for s in range(4)])   # later keys score higher
    positions = torch.arange(4)
    allowed = select_topk(indexer_scores(q, k, torch.ones(4, 1), positions), positions, index_topk=2)
    assert not bool(allowed.triu(1).any())
    assert allowed.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, True, True, False],
        [False, False, True, True],
    ]


def test_select_topk_with_topk_at_least_the_length_is_dense_causal() -> None:
    scores = torch.randn(6, 6, generator=torch.Generator().manual_seed(3))
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    allowed = select_topk(scores, torch.arange(6), index_topk=6)
    assert torch.equal(allowed, torch.ones(6, 6, dtype=torch.bool).tril())


@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
def test_simulated_index_quantization_changes_values_slightly(key_format: str) -> None:
    keys = torch.randn(7, 256, generator=torch.Generator().manual_seed(4))
    rounded = simulate_index_quantization(keys, key_format, "e4m3fn")
    error = float((rounded - keys).abs().max() / keys.abs().max())
    assert 0.0 < error < (0.07 if key_format == "fp8" else 0.3)
    assert torch.equal(simulate_index_quantization(keys, "exact", "e4m3fn"), keys)
    with pytest.raises(ValueError, match="index_key_format must be one of"):
        simulate_index_quantization(keys, "int8", "e4m3fn")


def test_indexer_select_in_fp8_mode_mostly_agrees_with_exact_mode() -> None:
    generator = torch.Generator().manual_seed(5)
    weights = IndexerWeights(
        wq_b=torch.randn(4 * 128, 32, generator=generator) * 32**-0.5,
        wk=torch.randn(128, 48, generator=generator) * 48**-0.5,
        k_norm_weight=torch.ones(128),
        k_norm_bias=torch.zeros(128),
        weights_proj=torch.randn(4, 48, generator=generator) * 48**-0.5,
    )
    x, q_latent = torch.randn(80, 48, generator=generator), torch.randn(80, 32, generator=generator)
    exact = indexer_select(x, q_latent, weights, index_topk=16)
    fp8 = indexer_select(x, q_latent, weights, index_topk=16, key_format="fp8")
    assert torch.equal(exact.sum(-1), fp8.sum(-1))
    assert float((exact & fp8).sum() / exact.sum()) > 0.9
