"""Sampler: logits [N, V] -> one token id per row, with each row's SamplingParams.

Per row, in this order (vLLM's):
  greedy (temperature < 1e-5): argmax, ties -> lowest id.
  otherwise: logits / temperature -> top-k -> top-p -> min-p -> sample.
- top-k keeps the k best tokens; among equal logits the lower id ranks first, so top_k = 1
  is exactly greedy.
- top-p keeps the smallest best-first set whose probability (after top-k) reaches top_p.
- min-p drops tokens whose probability is below min_p * the best token's.
Each filter always keeps the best token, so a row is never left with nothing to sample.

Sampling uses the exponential race (argmax of p_i / E_i with E_i ~ Exp(1) draws P(i) = p_i,
as vLLM does): it needs no sort or cumulative sum and no host sync. The noise is drawn in
vocabulary order from the row's own generator when the request is seeded, so a seeded row's
tokens do not depend on the batch it is in; unseeded rows share the global RNG.

`filtered_logits` is public so speculative decoding can build the same processed
distribution (MODEL_SPEC §5.5 `pick`, §5.6 verification).
"""

from __future__ import annotations

import torch

from atomk31.engine.outputs import TokenLogprobs
from atomk31.engine.sampling_params import SamplingParams


def filtered_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """The processed distribution's logits: scaled by temperature, filtered tokens at -inf.

    logits [M, V] fp32; temperature [M] fp32 > 0; top_k [M] int64 (0 = off); top_p [M] fp32 in
    (0, 1] (1 = off); min_p [M] fp32 in [0, 1] (0 = off). Returns [M, V] fp32;
    `softmax(result)` is the distribution to sample from.
    """
    scaled = logits / temperature[:, None]
    vocab_size = scaled.shape[-1]
    # One stable descending sort serves all three filters: rank r is the r-th best token,
    # and equal logits keep id order (lower id ranks first).
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab_size, device=scaled.device)
    k = torch.where(top_k > 0, top_k, vocab_size)
    keep = rank[None, :] < k[:, None]
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    # top-p: keep rank r while the mass of the better ranks is still below top_p. top_p = 1
    # keeps all: a cumulative sum in fp32 can reach 1 before the tail and must not cut it.
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    # min-p compares with the best token's probability; the ratio is the same before and
    # after renormalising over the kept set.
    keep &= sorted_probs >= min_p[:, None] * sorted_probs[:, :1]
    keep[:, 0] = True
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, sorted_ids, sorted_logits)


class Sampler:
    """Picks the next token of every row of a batch; see the module docstring for the rules."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        suppressed_token_ids: list[list[int]] | None = None,
    ) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
        """Sample one token per row.

        logits [N, V] fp32 (not modified); params and generators: one per row (a generator
        only for seeded, non-greedy rows, on logits' device: `Sequence.generator`).
        suppressed_token_ids: per row, token ids that must not be picked this step (EOS and
        stop tokens while min_tokens is not reached: `StopChecker.suppressed_token_ids`).

        Returns token_ids [N] int64 on logits' device, and per row a TokenLogprobs (from the
        raw distribution log_softmax(logits), see outputs.py) when the row's params ask for
        logprobs, else None.
        """
        num_rows = self._check_inputs(logits, params, generators, suppressed_token_ids)
        if num_rows == 0:
            return torch.empty(0, dtype=torch.int64, device=logits.device), []
        processed = logits
        if suppressed_token_ids is not None and any(suppressed_token_ids):
            processed = _suppress(logits, suppressed_token_ids)

        token_ids = processed.argmax(dim=-1)  # greedy rows keep this (ties -> lowest id)
        sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if sampled_rows:
            sampled = [params[i] for i in sampled_rows]
            sampled_generators = [generators[i] for i in sampled_rows]
            rows = torch.tensor(sampled_rows, device=logits.device)
            token_ids[rows] = _sample(processed[rows], sampled, sampled_generators)
        return token_ids, _logprobs(logits, token_ids, params)

    @staticmethod
    def _check_inputs(
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        suppressed_token_ids: list[list[int]] | None,
    ) -> int:
        if logits.dim() != 2 or logits.dtype != torch.float32:
            raise ValueError(
                f"logits must be [N, V] float32, got {list(logits.shape)} {logits.dtype}; "
                "call .float() on the LM head output"
            )
        num_rows = logits.shape[0]
        lengths = {"params": len(params), "generators": len(generators)}
        if suppressed_token_ids is not None:
            lengths["suppressed_token_ids"] = len(suppressed_token_ids)
        for name, length in lengths.items():
            if length != num_rows:
                raise ValueError(
                    f"{name} must have one entry per logits row ({num_rows}), got {length}"
                )
        return num_rows


def _suppress(logits: torch.Tensor, suppressed_token_ids: list[list[int]]) -> torch.Tensor:
    """logits [N, V] with each row's suppressed ids at -inf (a copy)."""
    rows = [i for i, ids in enumerate(suppressed_token_ids) for _ in ids]
    cols = [t for ids in suppressed_token_ids for t in ids]
    out = logits.clone()
    device = logits.device
    out[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = float("-inf")
    return out


def _sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """logits [M, V] fp32 of non-greedy rows -> sampled token ids [M] int64."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    logits = logits / temperature[:, None]
    # Only rows with a filter pay for the sort (the bulk of the sampler's time at large V).
    filtered = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0]
    if filtered:
        rows = torch.tensor(filtered, device=device)
        top_k = torch.tensor([params[i].top_k for i in filtered], device=device)
        top_p = torch.tensor([params[i].top_p for i in filtered], device=device)
        min_p = torch.tensor([params[i].min_p for i in filtered], device=device)
        ones = torch.ones(len(filtered), device=device)  # temperature is already applied
        logits[rows] = filtered_logits(logits[rows], ones, top_k, top_p, min_p)
    probs = logits.softmax(dim=-1)

    noise = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    else:
        if unseeded:
            fresh = torch.empty(len(unseeded), probs.shape[-1], device=device).exponential_()
            noise[torch.tensor(unseeded, device=device)] = fresh
        for i, generator in enumerate(generators):
            if generator is not None:
                noise[i].exponential_(generator=generator)
    # Exp(1) can return 0; a tiny floor keeps p / E finite-or-inf instead of 0 / 0 = NaN.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def _logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams]
) -> list[TokenLogprobs | None]:
    """Per row: the chosen token's and the top-n logprobs of log_softmax(logits), or None."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    result: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return result
    index = torch.tensor(rows, device=logits.device)
    num_top = max(params[i].logprobs for i in rows)
    for i, entry in zip(rows, token_logprobs(logits[index], token_ids[index], num_top)):
        n = params[i].logprobs
        entry.top_token_ids, entry.top_logprobs = entry.top_token_ids[:n], entry.top_logprobs[:n]
        result[i] = entry
    return result


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                   num_top: int) -> list[TokenLogprobs]:
    """logits [M, V] fp32, token_ids [M]: per row, token_ids[row]'s logprob and the num_top
    best of log_softmax(logits) (the raw distribution, outputs.py)."""
    logprobs = logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])[:, 0].tolist()
    top_values, top_ids = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    return [TokenLogprobs(token_id=t, logprob=chosen[j], top_token_ids=top_ids[j],
                          top_logprobs=top_values[j])
            for j, t in enumerate(token_ids.tolist())]
