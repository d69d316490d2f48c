"""Verification of drafts (atomk31/engine/rejection.py, MODEL_SPEC §5.6): exact match for
greedy requests; for sampled ones the emitted tokens follow the target's processed
distribution, shown by a chi-square test over many seeds, and the same test fails when the
acceptance rule is broken on purpose (issue 21).

The chi-square test (tests/chi_square.py: p >= 1e-3 passes): a joint distribution over a
restricted vocabulary (6 tokens, top_k = 4 at temperature 0.8: 4 live tokens a row), 3 emitted
tokens (2 drafts and the bonus), 64 cells, 30000 samples. With fixed seeds the run is
deterministic; the correct rule gives p = 0.17 here (0.38 with another seed), each broken rule
p = 0 to double precision.
"""

import pytest
import torch

from atomk31 import SamplingParams
from atomk31.engine import rejection
from atomk31.engine.rejection import target_probabilities, verify_drafts
from chi_square import P_VALUE_THRESHOLD, chi_square_p_value

VOCAB = 6
NUM_SAMPLES = 30000
PARAMS = SamplingParams(temperature=0.8, top_k=4)


def synthetic_target(seed: int = 0):
    """Target logits for every context of up to 2 tokens: L0 [V], L1 [V, V], L2 [V, V, V]."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCAB, generator=g) * 1.5, torch.randn(VOCAB, VOCAB, generator=g) * 1.5,
            torch.randn(VOCAB, VOCAB, VOCAB, generator=g) * 1.5)


def draft_distributions(seed: int = 1):
    """The draft's Q over all 6 tokens (it also proposes tokens the target's top-k drops)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCAB, generator=g).softmax(-1),
            torch.randn(VOCAB, VOCAB, generator=g).softmax(-1))


def processed(logits: torch.Tensor) -> torch.Tensor:
    return target_probabilities(logits.reshape(1, -1, VOCAB), [PARAMS])[0]


def sample_emitted(num: int, seed: int) -> torch.Tensor:
    """[num, 3] tokens: each request drafts d1 ~ Q0, d2 ~ Q1(d1), verifies, and continues
    from the target where the verification stopped early (as the next step would)."""
    l0, l1, l2 = synthetic_target()
    q0, q1 = draft_distributions()
    g = torch.Generator().manual_seed(seed)
    d1 = torch.multinomial(q0.expand(num, -1), 1, generator=g)[:, 0]
    d2 = torch.multinomial(q1[d1], 1, generator=g)[:, 0]
    logits = torch.stack([l0.expand(num, -1), l1[d1], l2[d1, d2]], dim=1)       # [N, 3, V]
    draft_probs = torch.stack([q0.expand(num, -1), q1[d1]], dim=1)
    result = verify_drafts(logits, torch.stack([d1, d2], 1), draft_probs, [False] * num,
                           [2] * num, [PARAMS] * num, [g] * num)
    out = torch.empty(num, 3, dtype=torch.int64)
    p1_all, p2_all = processed(l1), processed(l2.reshape(-1, VOCAB)).view(VOCAB, VOCAB, VOCAB)
    for r, tokens in enumerate(result.tokens):
        t = list(tokens)
        if len(t) < 2:
            t.append(int(torch.multinomial(p1_all[t[0]], 1, generator=g)))
        if len(t) < 3:
            t.append(int(torch.multinomial(p2_all[t[0], t[1]], 1, generator=g)))
        out[r] = torch.tensor(t)
    return out


def joint_target_probabilities() -> torch.Tensor:
    l0, l1, l2 = synthetic_target()
    p0 = processed(l0[None])[0]
    p1 = processed(l1)
    p2 = processed(l2.reshape(-1, VOCAB)).view(VOCAB, VOCAB, VOCAB)
    return (p0[:, None, None] * p1[:, :, None] * p2).flatten()


def emitted_p_value(seed: int = 7) -> float:
    tokens = sample_emitted(NUM_SAMPLES, seed)
    cells = tokens[:, 0] * VOCAB * VOCAB + tokens[:, 1] * VOCAB + tokens[:, 2]
    counts = torch.bincount(cells, minlength=VOCAB ** 3)
    return chi_square_p_value(counts, joint_target_probabilities())


def test_sampled_tokens_follow_the_targets_distribution():
    assert emitted_p_value() >= P_VALUE_THRESHOLD


@pytest.mark.parametrize("broken", ["accept_always", "residual_is_the_target"])
def test_a_broken_acceptance_rule_fails_the_distribution_test(broken, monkeypatch):
    if broken == "accept_always":
        monkeypatch.setattr(rejection, "accept_probability",
                            lambda p, q: torch.ones_like(p))
    else:
        monkeypatch.setattr(rejection, "residual", lambda p, q: p)
    assert emitted_p_value() < P_VALUE_THRESHOLD


def test_greedy_requests_accept_exactly_the_matching_prefix():
    logits = torch.tensor([[[0.0, 3.0, 1.0], [5.0, 0.0, 1.0], [0.0, 1.0, 2.0]],
                           [[0.0, 3.0, 1.0], [5.0, 0.0, 1.0], [0.0, 1.0, 2.0]],
                           [[0.0, 3.0, 1.0], [5.0, 0.0, 1.0], [0.0, 1.0, 2.0]]])
    drafts = torch.tensor([[1, 0], [1, 2], [2, 0]])       # all match, one, none
    greedy = SamplingParams(temperature=0.0)
    g = torch.Generator().manual_seed(0)
    result = verify_drafts(logits, drafts, None, [True] * 3, [2, 2, 2], [greedy] * 3, [g] * 3)
    assert result.num_accepted == [2, 1, 0]
    assert result.tokens == [[1, 0, 2], [1, 0], [1]]


def test_a_one_hot_draft_of_a_sampled_request_is_verified_by_the_same_rule():
    """Q = δ(d): d accepted with probability P(d); on rejection d is never emitted."""
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]])).expand(4000, -1, -1)
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(3)
    result = verify_drafts(logits.contiguous(), torch.zeros(4000, 1, dtype=torch.int64), None,
                           [True] * 4000, [1] * 4000, [params] * 4000, [g] * 4000)
    firsts = torch.tensor([t[0] for t in result.tokens])
    rate = sum(result.num_accepted) / 4000
    assert abs(rate - 0.5) < 0.03
    rejected = firsts[torch.tensor(result.num_accepted) == 0]
    assert (rejected != 0).all()
    assert abs(float((rejected == 1).float().mean()) - 0.6) < 0.04     # 0.3 / (0.3 + 0.2)
