"""Sampler: greedy, each filter, never-empty sets, seeded reproducibility across batches,
the sampled distribution (temperature), logprobs, suppressed tokens, input checks."""

import pytest
import torch

from atomk31.engine.sampler import Sampler, filtered_logits
from atomk31.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def random_logits(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * 3


def filter_rows(
    logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    num_rows = logits.shape[0]
    return filtered_logits(
        logits,
        temperature=torch.ones(num_rows),
        top_k=torch.full((num_rows,), top_k, dtype=torch.int64),
        top_p=torch.full((num_rows,), top_p),
        min_p=torch.full((num_rows,), min_p),
    )


def kept_ids(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row))[:, 0].tolist())


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("num_rows, vocab_size", [(1, 1), (3, 37), (5, 1000)])
def test_greedy_is_argmax(num_rows: int, vocab_size: int) -> None:
    logits = random_logits(num_rows, vocab_size, seed=0)
    token_ids, logprobs = Sampler()(logits, [GREEDY] * num_rows, [None] * num_rows)
    assert token_ids.dtype == torch.int64
    assert torch.equal(token_ids, logits.argmax(dim=-1))
    assert logprobs == [None] * num_rows


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0, 5.0], [7.0, 7.0, 7.0, 7.0, 7.0]])
    token_ids, _ = Sampler()(logits, [GREEDY] * 2, [None] * 2)
    assert token_ids.tolist() == [2, 0]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1.0, top_k=50, top_p=1e-6, min_p=0.3),
    ],
    ids=["top_k1", "top_p_tiny", "all_filters"],
)
def test_filters_that_keep_one_token_equal_greedy(params: SamplingParams) -> None:
    torch.manual_seed(0)
    logits = random_logits(7, 301, seed=1)
    logits[3, [10, 20]] = logits[3].max() + 1  # a tie: lowest id, like greedy
    token_ids, _ = Sampler()(logits, [params] * 7, [None] * 7)
    greedy_ids, _ = Sampler()(logits, [GREEDY] * 7, [None] * 7)
    assert torch.equal(token_ids, greedy_ids)
    assert token_ids[3].item() == 10


def test_top_k_keeps_the_k_best() -> None:
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 2.5, 0.0]])
    assert kept_ids(filter_rows(logits, top_k=3)[0]) == {1, 3, 4}
    assert kept_ids(filter_rows(logits, top_k=100)[0]) == set(range(6))


def test_top_p_keeps_smallest_set_reaching_top_p() -> None:
    logits = torch.tensor([[0.50, 0.30, 0.15, 0.05]]).log()
    assert kept_ids(filter_rows(logits, top_p=0.79)[0]) == {0, 1}
    assert kept_ids(filter_rows(logits, top_p=0.81)[0]) == {0, 1, 2}
    assert kept_ids(filter_rows(logits, top_p=0.5)[0]) == {0}
    assert kept_ids(filter_rows(logits, top_p=1.0)[0]) == {0, 1, 2, 3}


def test_top_p_is_applied_after_top_k_renormalises() -> None:
    # after top_k=2 the mass is [4/7, 3/7]: top_p=0.5 is reached by the best token alone
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    assert kept_ids(filter_rows(logits, top_k=2, top_p=0.5)[0]) == {0}
    assert kept_ids(filter_rows(logits, top_p=0.5)[0]) == {0, 1}


def test_min_p_drops_tokens_below_fraction_of_best() -> None:
    logits = torch.tensor([[0.50, 0.30, 0.15, 0.05]]).log()
    assert kept_ids(filter_rows(logits, min_p=0.5)[0]) == {0, 1}
    assert kept_ids(filter_rows(logits, min_p=0.0)[0]) == {0, 1, 2, 3}


def test_min_p_one_keeps_only_ties_of_the_max() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[1.0, 0.0, 4.0, 3.9, -2.0, 4.0, 1.0]]).repeat(400, 1)
    params = SamplingParams(min_p=1.0)
    token_ids, _ = Sampler()(logits, [params] * 400, [None] * 400)
    assert set(token_ids.tolist()) == {2, 5}


def test_filters_never_leave_an_empty_set() -> None:
    logits = torch.cat([random_logits(6, 97, seed=2), torch.zeros(1, 97)])
    for top_k, top_p, min_p in [(1, 1e-9, 1.0), (0, 1e-9, 0.0), (0, 1.0, 1.0), (2, 0.01, 0.99)]:
        out = filter_rows(logits, top_k=top_k, top_p=top_p, min_p=min_p)
        assert bool((torch.isfinite(out).sum(dim=-1) >= 1).all())
        assert torch.equal(out.argmax(dim=-1), logits.argmax(dim=-1))


def test_filters_apply_only_to_their_own_rows() -> None:
    torch.manual_seed(4)
    logits = torch.zeros(200, 50)
    params = [SamplingParams(top_k=1), SamplingParams()] * 100
    token_ids, _ = Sampler()(logits, params, [None] * 200)
    assert set(token_ids[0::2].tolist()) == {0}  # all tied: top_k=1 keeps the lowest id
    assert len(set(token_ids[1::2].tolist())) > 25


def test_seeded_rows_repeat_whatever_the_batch() -> None:
    """The same seeded request alone, then at row 3 of a mixed batch, gives the same tokens."""
    vocab_size, num_steps = 500, 12
    params = SamplingParams(temperature=1.3, top_k=40, top_p=0.9, seed=77)
    others = [
        SamplingParams(temperature=0.7),
        GREEDY,
        SamplingParams(temperature=1.0, seed=5),
        SamplingParams(temperature=2.0, min_p=0.1),
    ]
    sampler = Sampler()
    alone_generator = torch.Generator().manual_seed(77)
    batched_generator = torch.Generator().manual_seed(77)
    other_generators = [None, None, torch.Generator().manual_seed(5), None]
    alone, batched = [], []
    for step in range(num_steps):
        logits = random_logits(5, vocab_size, seed=100 + step) / 3  # flatter: real sampling
        row = logits[3:4]
        alone.append(sampler(row, [params], [alone_generator])[0].item())
        generators = other_generators[:3] + [batched_generator] + other_generators[3:]
        batch_params = others[:3] + [params] + others[3:]
        batched.append(sampler(logits, batch_params, generators)[0][3].item())
    assert alone == batched
    assert len(set(alone)) > 1  # it really sampled


def test_unseeded_rows_use_the_global_rng() -> None:
    logits = torch.zeros(64, 1000)
    params = [SamplingParams()] * 64
    torch.manual_seed(3)
    first, _ = Sampler()(logits, params, [None] * 64)
    torch.manual_seed(3)
    second, _ = Sampler()(logits, params, [None] * 64)
    assert torch.equal(first, second)
    assert len(set(first.tolist())) > 32


def test_sampled_distribution_follows_softmax_of_logits_over_temperature() -> None:
    """Chi-square over 8 tokens (7 dof): the 1e-6 critical value is ~41. The true temperature
    passes; the same draws tested against temperature 1.0 (a sampler ignoring it) fail."""
    torch.manual_seed(1)
    num_draws, temperature = 20000, 0.7
    base = torch.tensor([1.0, 0.5, 0.0, -0.5, 1.5, -1.0, 0.2, 0.8])
    logits = base.repeat(num_draws, 1)
    params = SamplingParams(temperature=temperature)
    token_ids, _ = Sampler()(logits, [params] * num_draws, [None] * num_draws)
    counts = torch.bincount(token_ids, minlength=8)
    assert chi_square(counts, (base / temperature).softmax(-1)) < 41
    assert chi_square(counts, base.softmax(-1)) > 200


def test_seeded_sampling_distribution_after_filters() -> None:
    """A seeded row sampled many times follows the renormalised filtered distribution."""
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.9, seed=11)
    generator = torch.Generator().manual_seed(11)
    sampler = Sampler()
    draws = [sampler(base[None], [params], [generator])[0].item() for _ in range(2000)]
    counts = torch.bincount(torch.tensor(draws), minlength=6)
    probs = filter_rows(base[None], top_k=4, top_p=0.9)[0].softmax(-1)
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    assert chi_square(counts[kept], probs[kept]) < 35  # <= 3 dof, 1e-6 level ~ 30.7


def test_logprobs_are_from_raw_log_softmax() -> None:
    logits = random_logits(3, 50, seed=4)
    params = [
        SamplingParams(temperature=0.5, logprobs=3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=0),
    ]
    token_ids, logprobs = Sampler()(logits, params, [None] * 3)
    raw = logits.log_softmax(dim=-1)
    first = logprobs[0]
    assert first.token_id == token_ids[0].item()
    assert first.logprob == pytest.approx(raw[0, first.token_id].item(), abs=1e-6)
    top_values, top_ids = raw[0].topk(3)
    assert first.top_token_ids == top_ids.tolist()
    assert first.top_logprobs == pytest.approx(top_values.tolist(), abs=1e-6)
    assert logprobs[1] is None
    assert logprobs[2].top_token_ids == [] and logprobs[2].top_logprobs == []
    assert logprobs[2].logprob == pytest.approx(raw[2].max().item(), abs=1e-6)


def test_logprobs_asking_more_than_vocab() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    _, logprobs = Sampler()(logits, [SamplingParams(temperature=0.0, logprobs=20)], [None])
    assert logprobs[0].top_token_ids == [2, 1, 0]


def test_suppressed_tokens_are_never_picked() -> None:
    torch.manual_seed(2)
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]]).repeat(200, 1)
    params = [GREEDY] + [SamplingParams(temperature=2.0)] * 199
    suppressed = [[1]] + [[1, 2]] * 199
    token_ids, _ = Sampler()(logits, params, [None] * 200, suppressed)
    assert token_ids[0].item() == 2
    assert set(token_ids[1:].tolist()) == {0, 3}
    assert logits[0, 1].item() == 5.0  # input untouched


def test_empty_batch() -> None:
    token_ids, logprobs = Sampler()(torch.empty(0, 10), [], [])
    assert token_ids.shape == (0,) and token_ids.dtype == torch.int64 and logprobs == []


def test_rejects_non_fp32_logits() -> None:
    message = r"logits must be \[N, V\] float32, got \[2, 4\] torch.bfloat16"
    with pytest.raises(ValueError, match=message):
        Sampler()(torch.zeros(2, 4, dtype=torch.bfloat16), [GREEDY] * 2, [None] * 2)


def test_rejects_params_count_mismatch() -> None:
    with pytest.raises(ValueError, match=r"params must have one entry per logits row \(2\), got 1"):
        Sampler()(torch.zeros(2, 4), [GREEDY], [None] * 2)
