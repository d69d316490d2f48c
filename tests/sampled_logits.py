"""Records the logits an LLM samples from, on the first rank only (issue 18's comparisons).

Under tensor parallelism the other ranks must run the very same step, so nothing may change
what the model computes; this only copies the rows the runner samples from: every decode
position and each prompt's last position.
"""

from collections import defaultdict

import torch


class SampledLogits:
    def __init__(self, llm):
        runner = llm.engine.runner
        self.logits: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        original_run, original_forward = runner.run, runner.forward
        current: list = []

        def forward(batch, *args, **kwargs):
            logits = original_forward(batch, *args, **kwargs)
            sampling = [item for item in current if item.is_last_chunk]
            for row, item in zip(range(logits.shape[0]), sampling):
                position = item.seq.num_computed_tokens + item.num_new_tokens - 1
                self.logits[item.seq.request_id][position] = logits[row].float().cpu()
            return logits

        def run(scheduled):
            current[:] = scheduled
            return original_run(scheduled)

        runner.forward, runner.run = forward, run

    def compare(self, other: "SampledLogits") -> float:
        """The largest |difference| over every position both recorded, relative to the
        largest |logit| there; asserts they recorded the same positions."""
        return largest_difference(self.logits, other.logits)


def largest_difference(ours: dict, theirs: dict) -> float:
    """`SampledLogits.compare` over two recorded ``logits`` dicts."""
    assert ours.keys() == theirs.keys()
    worst = 0.0
    for request, rows in ours.items():
        assert rows.keys() == theirs[request].keys(), request
        for position, row in rows.items():
            scale = max(row.abs().max().item(), 1e-30)
            worst = max(worst, (row - theirs[request][position]).abs().max().item() / scale)
    return worst
