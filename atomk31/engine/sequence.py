"""Sequence: one completion being generated — its tokens, cache bookkeeping and status.

It holds a request's token ids (prompt then output), where its KV cache lives (block table)
and its KDA state slot, how many tokens have their cache/state written, its text so far and
how it finished. It knows nothing of the model or of what the blocks contain; the scheduler
and model runner move it between states. (Idea from nano-vllm's engine/sequence.py.)

A request with `n > 1` becomes n sequences sharing request_id, with `index` 0..n-1. Only the
first is scheduled at first; the others wait in its `forks` and fork from it once its prompt is
computed (they share its full prompt blocks and copy its KDA state, scheduler.py), so the prompt
is computed once.
"""

from __future__ import annotations

import time
from enum import Enum, auto

import torch

from atomk31.engine.outputs import CompletionOutput, TokenLogprobs
from atomk31.engine.sampling_params import SamplingParams

# Incremental detokenization starts with this many prompt tokens as context, so a tokenizer
# that renders a token differently at the start of a text (a leading-space marker) decodes
# the first output token as it would mid-text (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
NUM_DETOKENIZE_CONTEXT_TOKENS = 5


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    PREEMPTED = auto()
    FINISHED_STOPPED = auto()
    FINISHED_LENGTH = auto()
    FINISHED_ABORTED = auto()


FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


class Sequence:
    """One completion of a request.

    Token ids live in one list, `all_token_ids` = prompt + output. `num_computed_tokens` counts
    the leading tokens whose KV cache / KDA state is written (prefix-cache hits included);
    `num_cached_tokens` is the prefix-cache hit count at admission (for stats and tests).
    `prefix_offset` / `read_offset` index `all_token_ids` and are the incremental
    detokenization state that `StopChecker` advances; `output_text` is the text so far.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        index: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError(
                f"request {request_id!r}: prompt_token_ids must hold at least one token, got an "
                "empty prompt; pass a non-empty prompt"
            )
        self.request_id = request_id
        self.index = index
        self.sampling_params = sampling_params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        # a second list of the prompt, so that every step's RequestOutput can hold it without a
        # copy: slicing a 128K-token prompt costs ~0.2-0.5 ms, for every request every step
        self._prompt_token_ids: list[int] = list(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.stop_reason: str | int | None = None

        self.block_table: list[int] = []
        self.state_slot: int | None = None
        # speculative decoding: the other KDA state slots the sequence holds, where a verify
        # pass keeps the state after each of its rows (engine/speculative.py)
        self.extra_state_slots: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0

        self.output_logprobs: list[TokenLogprobs] = []
        # sampling_params.prompt_logprobs: entry p is token p's logprobs given tokens[:p]
        # (None for p = 0, and until the model has computed position p - 1)
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            [None] * self.num_prompt_tokens if sampling_params.prompt_logprobs is not None
            else None)
        # sequences of the same request that fork from this one after its prefill (n > 1)
        self.forks: list[Sequence] = []
        self.output_text = ""
        self.prefix_offset = max(self.num_prompt_tokens - NUM_DETOKENIZE_CONTEXT_TOKENS, 0)
        self.read_offset = self.num_prompt_tokens
        self._generator: torch.Generator | None = None

    def __repr__(self) -> str:
        return (
            f"Sequence(request_id={self.request_id!r}, index={self.index}, "
            f"status={self.status.name}, num_prompt_tokens={self.num_prompt_tokens}, "
            f"num_output_tokens={self.num_output_tokens})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output token ids (the live list: do not modify)."""
        return self.token_ids

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt (one list for the sequence's life, shared by its outputs: do not modify)."""
        return self._prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose cache/state the model still has to write."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """"stop", "length", "abort", or None while not finished."""
        return FINISH_REASONS.get(self.status)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs are asked for and not all computed yet (the prefix cache must not
        skip any prompt position then)."""
        return self.prompt_logprobs is not None and self.num_output_tokens == 0

    def fork(self, child: Sequence) -> None:
        """Make `child` (a not yet scheduled completion of this request) continue from this
        sequence's computed prompt: same computed count and detokenization offsets. Its blocks
        and state slot are the scheduler's business."""
        if child.token_ids[:self.num_prompt_tokens] != self.prompt_token_ids:
            raise ValueError(f"{child!r} cannot fork from {self!r}: their prompts differ")
        child.num_computed_tokens = self.num_prompt_tokens
        child.status = SequenceStatus.RUNNING

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the generated tokens' logprobs; None unless the request asked for logprobs."""
        if self.sampling_params.logprobs is None:
            return None
        return sum(lp.logprob for lp in self.output_logprobs)

    def append_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        """Add one generated token (and its logprobs when the request asked for them)."""
        if self.is_finished:
            raise ValueError(
                f"request {self.request_id!r} is {self.status.name}; a finished sequence takes "
                "no more tokens"
            )
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)

    def finish(self, status: SequenceStatus, stop_reason: str | int | None = None) -> None:
        """Mark the sequence finished; stop_reason is the stop string or stop token id."""
        if status not in FINISH_REASONS:
            raise ValueError(
                f"finish() needs a FINISHED_* status, got {status.name}; use FINISHED_STOPPED, "
                "FINISHED_LENGTH or FINISHED_ABORTED"
            )
        self.status = status
        self.stop_reason = stop_reason
        self.finished_time = time.monotonic()

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The request's own RNG for seeded sampling, or None (no seed, or greedy).

        Created on first use on `device` from `seed + index` (vLLM's rule for n > 1) and kept
        across steps and preemption, so a seeded request draws the same numbers whatever batch
        it runs in.
        """
        params = self.sampling_params
        if params.seed is None or params.is_greedy:
            return None
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(params.seed + self.index)
        return self._generator

    def to_completion_output(self) -> CompletionOutput:
        wants_logprobs = self.sampling_params.logprobs is not None
        return CompletionOutput(
            index=self.index,
            text=self.output_text,
            token_ids=self.output_token_ids,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=list(self.output_logprobs) if wants_logprobs else None,
            cumulative_logprob=self.cumulative_logprob,
        )
