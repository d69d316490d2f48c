"""Latent MoE: router selection and weights, expert sum, latent norm, shared experts (MODEL_SPEC §4.7)."""

import torch

from atomk31.reference import MlpWeights, MoeWeights, latent_moe, rms_norm, route, situ_glu


def random_moe_weights(hidden: int, latent: int | None, seed: int) -> MoeWeights:
    generator = torch.Generator().manual_seed(seed)
    experts, width = 6, 16
    expert_in = hidden if latent is None else latent

    def linear(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * shape[-1] ** -0.5

    return MoeWeights(
        gate=linear(experts, hidden),
        e_score_correction_bias=0.1 * torch.randn(experts, generator=generator),
        routed_expert_down_proj=None if latent is None else linear(latent, hidden),
        routed_expert_norm=None if latent is None else 1.0 + 0.1 * torch.randn(latent, generator=generator),
        routed_expert_up_proj=None if latent is None else linear(hidden, latent),
        experts_w1=linear(experts, width, expert_in),
        experts_w3=linear(experts, width, expert_in),
        experts_w2=linear(experts, expert_in, width),
        shared_experts=MlpWeights(linear(2 * width, hidden), linear(2 * width, hidden), linear(hidden, 2 * width)),
    )


def latent_moe_token_by_token(x: torch.Tensor, weights: MoeWeights, top_k: int) -> torch.Tensor:
    """The §4.7 pseudo-code written per token and per slot, with its own routing."""
    outputs = []
    for token in x:
        scores = torch.sigmoid(weights.gate @ token)
        biased = scores + weights.e_score_correction_bias
        chosen = sorted(range(len(scores)), key=lambda e: (-float(biased[e]), e))[:top_k]
        routing = scores[chosen] / (scores[chosen].sum() + 1e-20)
        z = token if weights.routed_expert_down_proj is None else weights.routed_expert_down_proj @ token
        u = torch.zeros_like(z)
        for weight, e in zip(routing, chosen):
            hidden = situ_glu(weights.experts_w1[e] @ z, weights.experts_w3[e] @ z, 4.0, 25.0)
            u = u + weight * (weights.experts_w2[e] @ hidden)
        if weights.routed_expert_norm is not None:
            u = weights.routed_expert_up_proj @ rms_norm(u, weights.routed_expert_norm, 1e-5)
        shared = weights.shared_experts
        outputs.append(u + shared.down_proj @ situ_glu(shared.gate_proj @ token, shared.up_proj @ token, 4.0, 25.0))
    return torch.stack(outputs)


def test_route_ties_go_to_the_lower_expert_id() -> None:
    gate = torch.zeros(5, 3)                                   # every score is sigmoid(0)
    expert_ids, weights = route(torch.randn(2, 3), gate, None, top_k=2, renormalize=False, routed_scaling_factor=1.0)
    assert expert_ids.tolist() == [[0, 1], [0, 1]]
    torch.testing.assert_close(weights, torch.full((2, 2), 0.5))


def test_route_bias_steers_selection_but_weights_use_unbiased_scores() -> None:
    x = torch.tensor([[1.0, 0.0]])
    gate = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 10.0])
    expert_ids, weights = route(x, gate, bias, top_k=2, renormalize=False, routed_scaling_factor=2.5)
    assert expert_ids.tolist() == [[2, 0]]
    torch.testing.assert_close(weights, 2.5 * torch.sigmoid(torch.tensor([[0.0, 2.0]])))
    _, renormalized = route(x, gate, bias, top_k=2, renormalize=True, routed_scaling_factor=2.5)
    torch.testing.assert_close(renormalized.sum(-1), torch.tensor([2.5]))   # factor applied after renormalising


def test_latent_moe_matches_a_token_by_token_evaluation() -> None:
    weights = random_moe_weights(hidden=32, latent=24, seed=0)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(1))
    output = latent_moe(
        x, weights, top_k=3, renormalize=True, routed_scaling_factor=1.0, eps=1e-5, situ_beta=4.0, situ_linear_beta=25.0
    )
    torch.testing.assert_close(output, latent_moe_token_by_token(x, weights, top_k=3), rtol=1e-5, atol=1e-5)


def test_latent_moe_without_latent_runs_experts_on_the_hidden_state() -> None:
    weights = random_moe_weights(hidden=32, latent=None, seed=2)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    output = latent_moe(
        x, weights, top_k=2, renormalize=True, routed_scaling_factor=1.0, eps=1e-5, situ_beta=4.0, situ_linear_beta=25.0
    )
    torch.testing.assert_close(output, latent_moe_token_by_token(x, weights, top_k=2), rtol=1e-5, atol=1e-5)


def test_latent_moe_of_zero_tokens_is_empty() -> None:
    weights = random_moe_weights(hidden=32, latent=24, seed=0)
    output = latent_moe(torch.zeros(0, 32), weights, top_k=3, renormalize=True, routed_scaling_factor=1.0, eps=1e-5)
    assert output.shape == (0, 32)
