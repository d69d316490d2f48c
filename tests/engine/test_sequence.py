"""Sequence: token bookkeeping, status and finish reasons, the seeded generator, outputs."""

import pytest
import torch

from atomk31.engine.outputs import TokenLogprobs
from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.sequence import Sequence, SequenceStatus


def test_counts_follow_appended_tokens() -> None:
    seq = Sequence("r0", [5, 6, 7], SamplingParams())
    assert seq.status is SequenceStatus.WAITING
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_output_tokens) == (3, 3, 0)
    seq.num_computed_tokens = 3
    seq.append_token(11)
    seq.append_token(12)
    assert seq.all_token_ids == [5, 6, 7, 11, 12]
    assert seq.prompt_token_ids == [5, 6, 7] and seq.output_token_ids == [11, 12]
    assert (seq.num_tokens, seq.num_output_tokens, seq.last_token_id) == (5, 2, 12)
    assert seq.num_uncomputed_tokens == 2
    assert seq.first_token_time is not None


def test_prompt_is_copied_and_output_ids_are_a_snapshot() -> None:
    prompt = [1, 2]
    seq = Sequence("r0", prompt, SamplingParams())
    prompt.append(3)
    assert seq.prompt_token_ids == [1, 2]
    outputs = seq.output_token_ids
    seq.append_token(9)
    assert outputs == [] and seq.output_token_ids == [9]


def test_prompt_ids_are_one_list_that_appending_leaves_alone() -> None:
    """Every step's RequestOutput takes `prompt_token_ids`: one list, no per-step copy of a
    long prompt, and appended tokens never reach it."""
    seq = Sequence("r0", [1, 2, 3], SamplingParams())
    first = seq.prompt_token_ids
    seq.num_computed_tokens = 3
    seq.append_token(9)
    assert seq.prompt_token_ids is first and first == [1, 2, 3]
    assert seq.all_token_ids == [1, 2, 3, 9]


def test_empty_prompt_is_rejected() -> None:
    with pytest.raises(ValueError, match="prompt_token_ids must hold at least one token"):
        Sequence("r0", [], SamplingParams())


@pytest.mark.parametrize(
    "status, reason",
    [
        (SequenceStatus.FINISHED_STOPPED, "stop"),
        (SequenceStatus.FINISHED_LENGTH, "length"),
        (SequenceStatus.FINISHED_ABORTED, "abort"),
    ],
)
def test_finish_sets_reason(status: SequenceStatus, reason: str) -> None:
    seq = Sequence("r0", [1], SamplingParams())
    assert not seq.is_finished and seq.finish_reason is None
    seq.finish(status, stop_reason="###")
    assert seq.is_finished and seq.finish_reason == reason and seq.stop_reason == "###"
    assert seq.finished_time is not None


@pytest.mark.parametrize("status", [SequenceStatus.RUNNING, SequenceStatus.PREEMPTED])
def test_finish_rejects_unfinished_status(status: SequenceStatus) -> None:
    message = f"finish\\(\\) needs a FINISHED_\\* status, got {status.name}"
    with pytest.raises(ValueError, match=message):
        Sequence("r0", [1], SamplingParams()).finish(status)


def test_finished_sequence_takes_no_tokens() -> None:
    seq = Sequence("r0", [1], SamplingParams())
    seq.finish(SequenceStatus.FINISHED_ABORTED)
    with pytest.raises(ValueError, match="is FINISHED_ABORTED; a finished sequence takes no more"):
        seq.append_token(2)


def test_detokenize_offsets_start_at_prompt_end_with_context() -> None:
    short = Sequence("r0", [1, 2, 3], SamplingParams())
    assert (short.prefix_offset, short.read_offset) == (0, 3)
    long = Sequence("r1", list(range(10)), SamplingParams())
    assert (long.prefix_offset, long.read_offset) == (5, 10)


def test_generator_none_without_seed_or_when_greedy() -> None:
    assert Sequence("r0", [1], SamplingParams()).generator("cpu") is None
    assert Sequence("r0", [1], SamplingParams(temperature=0.0, seed=3)).generator("cpu") is None


def test_generator_is_seeded_by_seed_plus_index_and_kept() -> None:
    params = SamplingParams(seed=1234)
    first = Sequence("r0", [1], params).generator("cpu")
    again = Sequence("r1", [1], params).generator("cpu")
    other_index = Sequence("r0", [1], params, index=1).generator("cpu")
    draws = [torch.rand(4, generator=g) for g in (first, again, other_index)]
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])
    expected = torch.rand(4, generator=torch.Generator().manual_seed(1235))
    assert torch.equal(draws[2], expected)
    seq = Sequence("r2", [1], params)
    assert seq.generator("cpu") is seq.generator("cpu")


def test_completion_output_without_logprobs() -> None:
    seq = Sequence("r0", [1, 2], SamplingParams(), index=2)
    seq.append_token(7)
    seq.output_text = "hi"
    seq.finish(SequenceStatus.FINISHED_STOPPED, stop_reason=7)
    out = seq.to_completion_output()
    assert (out.index, out.text, out.token_ids) == (2, "hi", [7])
    assert (out.finish_reason, out.stop_reason, out.finished) == ("stop", 7, True)
    assert out.logprobs is None and out.cumulative_logprob is None


def test_completion_output_with_logprobs_sums_them() -> None:
    seq = Sequence("r0", [1], SamplingParams(logprobs=1))
    assert seq.cumulative_logprob == 0.0
    seq.append_token(4, TokenLogprobs(4, -0.5, [4], [-0.5]))
    seq.append_token(6, TokenLogprobs(6, -1.25, [3], [-0.25]))
    out = seq.to_completion_output()
    assert out.cumulative_logprob == pytest.approx(-1.75)
    assert [lp.token_id for lp in out.logprobs] == [4, 6]
    assert out.finish_reason is None and not out.finished


def test_fork_continues_from_the_parents_computed_prompt() -> None:
    """Issue 19: n > 1 completions fork from one prefill."""
    params = SamplingParams(n=2, prompt_logprobs=1)
    parent, child = Sequence("r", [1, 2, 3], params), Sequence("r", [1, 2, 3], params, index=1)
    parent.num_computed_tokens = 3
    parent.fork(child)
    assert (child.num_computed_tokens, child.status) == (3, SequenceStatus.RUNNING)
    assert parent.needs_prompt_logprobs and parent.prompt_logprobs == [None] * 3
    with pytest.raises(ValueError, match="cannot fork from .*: their prompts differ"):
        parent.fork(Sequence("r", [1, 2, 4], params, index=1))
