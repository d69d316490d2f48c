"""What `LLM.generate` returns (vLLM-shaped dataclasses), and the per-token logprobs record.

These are plain data: nothing here knows the model, the scheduler or the tokenizer, so the
sampler, the sequence and the server can all share them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenLogprobs:
    """Log-probabilities around one generated token, from the raw model distribution
    `log_softmax(logits)` (before temperature, top-k/top-p/min-p; vLLM's default).

    token_id: the generated token; logprob: its log-probability.
    top_token_ids / top_logprobs: the n most likely tokens, best first (n = the request's
    `logprobs`; empty lists when it is 0).
    """

    token_id: int
    logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class CompletionOutput:
    """One completion of a request.

    finish_reason: "stop" (EOS, a stop token or a stop string), "length" (max_tokens or the
    context length), "abort", or None while running. stop_reason: the stop string or stop token
    id that ended it (None for EOS and for the other reasons). logprobs and cumulative_logprob
    are None unless the request asked for logprobs.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprobs] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timestamps of one request, in `time.monotonic()` seconds (None until it happens)."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """A request's result: its prompt and its `n` completions.

    num_cached_tokens: prompt tokens served from the prefix cache at admission.
    prompt_logprobs: with SamplingParams.prompt_logprobs, one entry per prompt token (None for
    the first, which has no context), else None.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
