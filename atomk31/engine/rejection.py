"""Verification of draft tokens against the target's distributions (MODEL_SPEC §5.6).

One verify pass gives the target's logits at each of a request's rows `[x_a, d_1, ..., d_k]`;
row j predicts the token after it. For request r with k drafts:

* sampled requests: the standard speculative-sampling rule. With `P_j` the target's processed
  distribution at row j (temperature, top-k, top-p, min-p: `sampler.filtered_logits`, exactly
  what the plain sampler draws from) and `Q_j` the draft's: accept `d_j` when
  `u_j < min(1, P_j(d_j) / Q_j(d_j))`; at the first rejection emit a sample of
  `normalize(max(P_j - Q_j, 0))` and stop; when all k are accepted emit a sample of `P_k` (the
  bonus token). Emitted tokens then follow the target's distribution exactly (lossless). A
  one-hot draft (`Q_j = δ(d_j)`, a greedy draft of a sampled request) is the same rule.
* greedy requests: accept while `d_j == argmax P_j` (ties -> lowest id); emit `argmax` of the
  first mismatching row, or of row k when all match.

Randomness: per request, the k uniforms, then one Exp(1) noise vector for the emitted sample
(the exponential race of `sampler.py`), drawn from the request's own generator when it is
seeded (its tokens do not depend on the batch) and otherwise from the step's generator, seeded
per step from the engine seed (the same numbers on every rank, §5.6).

`accept_probability` and `residual` are the two pieces of the rule, named so that the tests can
replace them with wrong ones and watch the distribution test fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atomk31.engine.sampler import filtered_logits
from atomk31.engine.sampling_params import SamplingParams


@dataclass
class VerifyResult:
    """Per request: drafts accepted and the tokens to emit (the accepted drafts, then the
    correction or bonus token); token i came from verify row i (its logprobs are row i's)."""

    num_accepted: list[int]
    tokens: list[list[int]]


def accept_probability(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """min(1, P(d) / Q(d)); Q(d) > 0 for every drawn draft (0 / 0 cannot occur)."""
    return (p_draft / q_draft).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(P - Q, 0), unnormalized (the race below does not need a normalized vector)."""
    return (p - q).clamp(min=0.0)


def target_probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The target's processed distributions: logits [N, R, V] -> probabilities [N, R, V];
    a greedy request's rows become one-hot at their argmax."""
    n, rows, vocab = logits.shape
    device = logits.device

    def per_row(values: list[float], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device).repeat_interleave(rows)

    greedy = torch.tensor([p.is_greedy for p in params], device=device)
    temperature = per_row([1.0 if p.is_greedy else p.temperature for p in params], torch.float32)
    top_k = per_row([p.top_k for p in params], torch.int64)
    top_p = per_row([p.top_p for p in params], torch.float32)
    min_p = per_row([p.min_p for p in params], torch.float32)
    probs = filtered_logits(logits.reshape(n * rows, vocab), temperature, top_k, top_p,
                            min_p).softmax(dim=-1).view(n, rows, vocab)
    one_hot = torch.zeros_like(probs).scatter_(2, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None, None], one_hot, probs)


def verify_drafts(logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                  is_one_hot: list[bool], num_drafts: list[int], params: list[SamplingParams],
                  generators: list[torch.Generator]) -> VerifyResult:
    """Accept or reject each request's drafts (module docstring).

    logits [N, R, V] fp32: the target's rows of each request (rows past 1 + num_drafts[r] are
    padding); drafts [N, R-1] int64; draft_probs [N, R-1, V] fp32, the draft's Q (rows of
    `is_one_hot` requests are not read; None when every request is one-hot); num_drafts [N];
    params, generators [N] (a generator for every request: its own or the step's)."""
    n, rows, vocab = logits.shape
    device = logits.device
    width = rows - 1
    p = target_probabilities(logits, params)
    one_hot = torch.tensor(is_one_hot, device=device)
    valid = torch.arange(width, device=device)[None, :] < torch.tensor(num_drafts, device=device)[:, None]
    d = drafts.clamp(min=0)
    p_draft = p[:, :width].gather(2, d[..., None])[..., 0]                        # [N, R-1]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = torch.where(one_hot[:, None], 1.0, draft_probs.gather(2, d[..., None])[..., 0])
    uniforms, noise = _draws(params, generators, width, vocab, device)
    accepted = (uniforms < accept_probability(p_draft, q_draft.clamp(min=1e-30))) & valid
    num_accepted = accepted.int().cumprod(dim=1).sum(dim=1)                      # [N]
    rows_index = torch.arange(n, device=device)
    final_p = p[rows_index, num_accepted]                                         # [N, V]
    rejected = num_accepted < torch.tensor(num_drafts, device=device)
    at = num_accepted.clamp(max=max(width - 1, 0))
    if width:
        q_rejected = torch.zeros_like(final_p).scatter_(1, d[rows_index, at][:, None], 1.0)
        if draft_probs is not None:
            q_rejected = torch.where(one_hot[:, None], q_rejected, draft_probs[rows_index, at])
        left = residual(final_p, q_rejected)
        # P == Q exactly leaves nothing: then P itself (never reached: P(d) = Q(d) accepts)
        left = torch.where(left.sum(-1, keepdim=True) > 0, left, final_p)
        final_p = torch.where(rejected[:, None], left, final_p)
    last = (final_p / noise.clamp(min=torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
    counts, tokens, finals = num_accepted.tolist(), d.tolist(), last.tolist()
    return VerifyResult(counts, [tokens[r][:counts[r]] + [finals[r]] for r in range(n)])


def _draws(params: list[SamplingParams], generators: list[torch.Generator], width: int,
           vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """uniforms [N, width] and Exp(1) noise [N, V], each sampled request's from its generator
    in that order; a greedy request draws nothing (u = 0 accepts exactly the matching drafts,
    its one-hot rows need no noise)."""
    uniforms = torch.zeros(len(params), width, device=device)
    noise = torch.ones(len(params), vocab, device=device)
    for r, (p, g) in enumerate(zip(params, generators)):
        if not p.is_greedy:
            uniforms[r] = torch.rand(width, generator=g, device=device)
            noise[r].exponential_(generator=g)
    return uniforms, noise
