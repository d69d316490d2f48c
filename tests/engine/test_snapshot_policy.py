"""Which block boundaries get a KDA prefix snapshot (engine/scheduler.py, issue 17): the end
of the prompt's last full block and every `kda_snapshot_interval` tokens, not every block."""

import pytest

from atomk31 import LLM, SamplingParams
from atomk31.config import ConfigError, EngineConfig


def snapshot_positions(tiny_checkpoint, prompt_length, max_tokens, interval):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch",
              max_num_batched_tokens=64, kda_snapshot_interval=interval)
    taken = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        scheduled = schedule()
        for item in scheduled:
            start = item.seq.num_computed_tokens
            taken.extend(start + m for m, _, _ in item.snapshots)
        return scheduled
    llm.engine.scheduler.schedule = recording
    llm.generate([list(range(3, 3 + prompt_length))],
                 SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return taken


def test_snapshots_at_the_prompt_end_and_every_interval(tiny_checkpoint):
    # 150 prompt tokens in chunks of 64, then 45 decoded: blocks of 16, interval 64
    assert snapshot_positions(tiny_checkpoint, 150, 45, 64) == [64, 128, 144, 192]


def test_interval_zero_snapshots_prompt_ends_only(tiny_checkpoint):
    assert snapshot_positions(tiny_checkpoint, 150, 45, 0) == [144]


def test_a_prefix_hit_resumes_from_an_interval_snapshot(tiny_checkpoint, pools_free):
    """The second prompt shares 140 tokens: the longest snapshotted prefix is 128 (interval
    64), not 144 (the first prompt's end lies past the shared part)."""
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", kda_snapshot_interval=64)
    shared = list(range(3, 143))
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm.generate([shared + [7] * 10], greedy)
    second = llm.generate([shared + [9] * 5], greedy)[0]
    assert second.num_cached_tokens == 128
    cold = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch",
               enable_prefix_caching=False)
    assert cold.generate([shared + [9] * 5], greedy)[0].outputs[0].token_ids == \
        second.outputs[0].token_ids
    pools_free(llm)


def test_interval_must_be_a_multiple_of_the_block_size():
    with pytest.raises(ConfigError, match=r"kda_snapshot_interval must be 0 or a positive "
                                          r"multiple of block_size \(128\), got 100"):
        EngineConfig(model="x", kda_snapshot_interval=100)
