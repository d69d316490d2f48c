"""SamplingParams: how one request is decoded (vLLM-shaped, validated once at construction).

Fields follow vLLM's `SamplingParams` names and defaults. Normalisations done here so nothing
downstream has to repeat them:
- `stop` becomes a list of strings (a single string -> [it], None -> []), `stop_token_ids` a
  list of ints (None -> []).
- `top_k = -1` becomes 0: both mean "off"; 0 is the one value the sampler checks.
- A greedy request (`is_greedy`) ignores top_k / top_p / min_p / seed: it takes the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# vLLM's _SAMPLING_EPS: temperatures below it are greedy, because logits / 1e-6 overflow the
# softmax to a one-hot anyway and the division can produce inf - inf = NaN.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_SEED = 2**63 - 1   # torch.Generator.manual_seed takes a signed 64-bit integer


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    n: completions per prompt. temperature: 0 (or < 1e-5) is greedy. top_p: nucleus mass in
    (0, 1]. top_k: keep the k best tokens, 0 or -1 = off. min_p: drop tokens whose probability is
    below min_p * the best token's. seed: makes a sampled request reproducible whatever batch it
    runs in (completion i of n uses seed + i, as vLLM does). max_tokens: output tokens at most
    (None = until the context is full). min_tokens: output tokens generated before EOS, stop
    tokens or stop strings may end the request. stop / stop_token_ids: extra stop conditions.
    ignore_eos: keep going past EOS. logprobs: also return the top-n log-probabilities of each
    generated token (0 = only the chosen token's). prompt_logprobs: likewise for every prompt
    token after the first (given the tokens before it). skip_special_tokens: leave special
    tokens out of the text. include_stop_str_in_output: keep the matched stop string (or stop
    token's text).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop is not None else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids is not None else []
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"temperature must be >= 0, got {self.temperature}; use 0 for greedy decoding"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use 1 to turn it off")
        if self.top_k < 0:
            raise ValueError(f"top_k must be -1 or 0 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}; use 0 to turn it off")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(
                f"max_tokens must be >= 1 or None, got {self.max_tokens}; "
                "use None to generate until the context is full"
            )
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}"
            )
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED - (self.n - 1):
            raise ValueError(f"seed must be in [0, {MAX_SEED - (self.n - 1)}] (a 64-bit "
                             f"generator seed, plus n - 1), got {self.seed}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}] or None, got {value}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids must hold token ids >= 0, got {self.stop_token_ids!r}"
            )

    @property
    def is_greedy(self) -> bool:
        """True when decoding is argmax: temperature == 0, and (like vLLM) any temperature
        below 1e-5."""
        return self.temperature < GREEDY_TEMPERATURE_EPS
