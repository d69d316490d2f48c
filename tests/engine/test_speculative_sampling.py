"""Sampled requests with speculation follow the target's distribution through the whole engine
(issue 21): 1200 requests, seeds 0..1199, 4 tokens each with top_k = 2 (a restricted
vocabulary: 16 joint outcomes), verified in steps of 2 drafts. The drafts come from
`MixedDrafts`, a stand-in for the draft's picks with a known Q that overlaps the target's
distribution only partly (so acceptances, rejections with a non-trivial residual and bonus
tokens all occur); the engine's verification of them is what is tested. The expected joint
distribution comes from the float32 oracle, teacher-forced on the 15 prefixes. Threshold and
pooling: tests/chi_square.py (p >= 1e-3 passes; test_rejection.py shows broken rules fail)."""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.engine.rejection import target_probabilities
from atomk31.reference import ReferenceModel
from chi_square import P_VALUE_THRESHOLD, chi_square_p_value

NUM_REQUESTS = 1200
NUM_TOKENS = 4
PARAMS = dict(temperature=1.0, top_k=2, max_tokens=NUM_TOKENS, ignore_eos=True)
PROMPT = [11, 305, 42, 7, 600, 13]


def oracle_distributions(checkpoint) -> dict[tuple[int, ...], torch.Tensor]:
    """The target's processed distribution after every prefix of up to 3 sampled tokens."""
    oracle = ReferenceModel.from_pretrained(checkpoint, index_key_format="fp8")
    params = SamplingParams(**PARAMS)
    found, frontier = {}, [()]
    for _ in range(NUM_TOKENS):
        nxt = []
        for prefix in frontier:
            logits = oracle.forward(torch.tensor(PROMPT + list(prefix)))[-1]
            probs = target_probabilities(logits.view(1, 1, -1), [params])[0, 0]
            found[prefix] = probs
            nxt += [prefix + (t,) for t in probs.nonzero()[:, 0].tolist()]
        frontier = nxt
    return found


class MixedDrafts:
    """Q(context) = 0.5 P(context) + 0.5 uniform over {P's two tokens and one more}: drawn with
    the request's generator, the engine told Q."""

    def __init__(self, llm: LLM, distributions: dict):
        self.distributions = distributions
        proposer = llm.engine.speculative.proposer
        original = proposer.propose

        def propose(items, generators, ops, base_logits=None):
            proposal = original(items, generators, ops, base_logits)
            proposal.probs = torch.zeros(len(items), proposal.tokens.shape[1],
                                         proposal.probs.shape[-1])
            for r, item in enumerate(items):
                context = tuple(item.seq.output_token_ids)
                for j in range(item.num_draft_tokens):
                    q = self.q_of(context)
                    token = int(torch.multinomial(q, 1, generator=generators[r]))
                    proposal.tokens[r, j], proposal.probs[r, j] = token, q
                    context += (token,)
            return proposal

        proposer.propose = propose

    def q_of(self, context: tuple[int, ...]) -> torch.Tensor:
        p = self.distributions.get(context)
        if p is None:                 # past the 4 tokens measured: any valid Q
            return torch.full((1024,), 1 / 1024)
        support = p.nonzero()[:, 0].tolist() + [int((p == 0).nonzero()[0])]
        q = 0.5 * p
        q[support] += 0.5 / len(support)
        return q


@pytest.mark.slow
def test_sampled_tokens_follow_the_targets_distribution(tiny_checkpoint, tiny_draft):
    distributions = oracle_distributions(tiny_checkpoint)
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_num_seqs=64,
              kv_cache_memory=768 << 20,
              speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 2})
    MixedDrafts(llm, distributions)
    outputs = llm.generate([PROMPT] * NUM_REQUESTS,
                           [SamplingParams(seed=i, **PARAMS) for i in range(NUM_REQUESTS)])
    stats = llm.engine.speculation_stats()
    assert all(count > 0 for count in stats.num_accepted_by_count), stats
    outcomes = sorted(prefix for prefix in distributions if len(prefix) == NUM_TOKENS - 1)
    cells = {prefix + (t,): i * 2 + j for i, prefix in enumerate(outcomes)
             for j, t in enumerate(distributions[prefix].nonzero()[:, 0].tolist())}
    expected = torch.zeros(len(cells), dtype=torch.float64)
    for sequence, cell in cells.items():
        expected[cell] = torch.prod(torch.stack(
            [distributions[sequence[:i]][sequence[i]].double() for i in range(NUM_TOKENS)]))
    counts = torch.zeros(len(cells))
    for out in outputs:
        counts[cells[tuple(out.outputs[0].token_ids)]] += 1
    assert chi_square_p_value(counts, expected) >= P_VALUE_THRESHOLD
