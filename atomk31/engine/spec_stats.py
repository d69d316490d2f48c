"""Counters of speculative decoding: drafted and accepted tokens, acceptance lengths.

`LLMEngine.speculation_stats()` returns a copy of the engine's `SpeculationStats` (None without
speculation); the counts only grow, so a benchmark takes one before and one after its timed
window and reads `after.since(before)`. The server exports the same counters on /metrics.

A "verify step" is one request's verification in one engine step: k drafts checked, n of them
accepted, n + 1 tokens emitted (the accepted drafts and the correction or bonus token). Its
acceptance length is n + 1 (1..k+1); `mean_acceptance_length` is the mean of those, i.e.
tokens emitted per verify step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpeculationStats:
    """num_accepted_by_count[n]: verify steps that accepted exactly n drafts (n = 0..Tb)."""

    num_speculative_tokens: int
    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_by_count: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_by_count:
            self.num_accepted_by_count = [0] * (self.num_speculative_tokens + 1)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """One verify step of `num_drafts` drafts, `num_accepted` of them accepted."""
        if not 0 <= num_accepted <= num_drafts <= self.num_speculative_tokens:
            raise ValueError(f"a verify step accepts 0..{num_drafts} of its {num_drafts} drafts "
                             f"(at most {self.num_speculative_tokens}), got {num_accepted}")
        self.num_verify_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_accepted_by_count[num_accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step (accepted + 1); 0.0 before any."""
        if not self.num_verify_steps:
            return 0.0
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps

    def copy(self) -> SpeculationStats:
        return SpeculationStats(self.num_speculative_tokens, self.num_verify_steps,
                                self.num_draft_tokens, self.num_accepted_tokens,
                                list(self.num_accepted_by_count))

    def since(self, earlier: SpeculationStats) -> SpeculationStats:
        """The counts accumulated after `earlier` (a copy taken from the same engine)."""
        return SpeculationStats(
            self.num_speculative_tokens, self.num_verify_steps - earlier.num_verify_steps,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            [a - b for a, b in zip(self.num_accepted_by_count, earlier.num_accepted_by_count)])
