"""Gated MLA: absorbed form equals expanded form; causality; the FP8 latent simulation."""

import pytest
import torch

from atomk31.reference import (
    IndexerWeights,
    MlaDims,
    MlaWeights,
    gated_mla,
    mla_attention_absorbed,
    mla_attention_expanded,
    mla_projections,
)

DIMS = MlaDims(num_heads=3, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=512)
HIDDEN, Q_RANK = 64, 96


def random_mla_weights(seed: int) -> MlaWeights:
    generator = torch.Generator().manual_seed(seed)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=generator) * in_features**-0.5

    heads, nope, lane = DIMS.num_heads, DIMS.qk_nope_head_dim, DIMS.qk_rope_head_dim
    value, rank = DIMS.v_head_dim, DIMS.kv_lora_rank
    return MlaWeights(
        q_a_proj=linear(Q_RANK, HIDDEN),
        q_a_layernorm=1.0 + 0.1 * torch.randn(Q_RANK, generator=generator),
        q_b_proj=linear(heads * (nope + lane), Q_RANK),
        kv_a_proj_with_mqa=linear(rank + lane, HIDDEN),
        kv_a_layernorm=1.0 + 0.1 * torch.randn(rank, generator=generator),
        kv_b_proj=linear(heads * (nope + value), rank),
        g_proj=linear(heads * value, HIDDEN),
        o_proj=linear(HIDDEN, heads * value),
    )


def random_indexer_weights(seed: int) -> IndexerWeights:
    generator = torch.Generator().manual_seed(seed)
    return IndexerWeights(
        wq_b=torch.randn(2 * 128, Q_RANK, generator=generator) * Q_RANK**-0.5,
        wk=torch.randn(128, HIDDEN, generator=generator) * HIDDEN**-0.5,
        k_norm_weight=torch.ones(128),
        k_norm_bias=torch.zeros(128),
        weights_proj=torch.randn(2, HIDDEN, generator=generator) * HIDDEN**-0.5,
    )


@pytest.mark.parametrize("num_tokens", [1, 5, 33], ids=lambda t: f"T{t}")
def test_mla_absorbed_attention_equals_expanded_under_a_random_selection(num_tokens: int) -> None:
    weights = random_mla_weights(seed=0)
    x = torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(num_tokens))
    _, q, latent = mla_projections(x, weights, DIMS)
    allowed = torch.rand(num_tokens, num_tokens, generator=torch.Generator().manual_seed(9)) < 0.5
    allowed |= torch.eye(num_tokens, dtype=torch.bool)            # every row keeps one key
    expanded = mla_attention_expanded(q, latent, weights.kv_b_proj, allowed, DIMS)
    absorbed = mla_attention_absorbed(q, latent, weights.kv_b_proj, allowed, DIMS)
    torch.testing.assert_close(absorbed, expanded, rtol=1e-5, atol=1e-5)


def test_gated_mla_absorbed_equals_expanded_with_the_indexer() -> None:
    weights, indexer = random_mla_weights(seed=1), random_indexer_weights(seed=2)
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(3))
    expanded = gated_mla(x, weights, DIMS, indexer=indexer, index_topk=8, form="expanded")
    absorbed = gated_mla(x, weights, DIMS, indexer=indexer, index_topk=8, form="absorbed")
    torch.testing.assert_close(absorbed, expanded, rtol=1e-5, atol=1e-5)


def test_gated_mla_is_causal() -> None:
    weights = random_mla_weights(seed=4)
    x = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(5))
    changed = x.clone()
    changed[8:] += 1.0
    torch.testing.assert_close(gated_mla(changed, weights, DIMS)[:8], gated_mla(x, weights, DIMS)[:8])
    assert not torch.allclose(gated_mla(changed, weights, DIMS)[8:], gated_mla(x, weights, DIMS)[8:])


def test_mla_has_no_position_so_the_last_row_ignores_the_order_of_earlier_tokens() -> None:
    """NoPE (§4.5): without rotary, the last query's dense attention is invariant to permuting the keys before it."""
    weights = random_mla_weights(seed=6)
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(7))
    permuted = torch.cat([x[torch.tensor([3, 0, 4, 2, 1])], x[5:]])
    last_permuted, last = gated_mla(permuted, weights, DIMS)[-1], gated_mla(x, weights, DIMS)[-1]
    torch.testing.assert_close(last_permuted, last, rtol=1e-5, atol=1e-5)


def test_gated_mla_fp8_latent_changes_the_output_slightly() -> None:
    weights = random_mla_weights(seed=8)
    x = torch.randn(20, HIDDEN, generator=torch.Generator().manual_seed(9))
    exact = gated_mla(x, weights, DIMS)
    for variant in ("e4m3fn", "e4m3fnuz"):
        rounded = gated_mla(x, weights, DIMS, latent_format="fp8", fp8_variant=variant)
        error = float((rounded - exact).abs().max() / exact.abs().max())
        assert 0.0 < error < 0.1, variant


def test_gated_mla_rejects_unknown_options() -> None:
    weights = random_mla_weights(seed=0)
    x = torch.randn(2, HIDDEN)
    with pytest.raises(ValueError, match="form must be one of"):
        gated_mla(x, weights, DIMS, form="fused")
    with pytest.raises(ValueError, match="latent_format must be one of"):
        gated_mla(x, weights, DIMS, latent_format="nvfp4")
    with pytest.raises(ValueError, match="index_topk=None"):
        gated_mla(x, weights, DIMS, indexer=random_indexer_weights(seed=0))
