"""SamplingParams: defaults, normalisation, every validation message, the greedy rule."""

import pytest

from atomk31.engine.sampling_params import SamplingParams


def test_defaults_match_vllm() -> None:
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k, params.min_p) == (
        1, 1.0, 1.0, 0, 0.0,
    )
    assert params.max_tokens == 16 and params.min_tokens == 0 and params.seed is None
    assert params.stop == [] and params.stop_token_ids == []
    assert params.logprobs is None and params.skip_special_tokens
    assert not params.ignore_eos and not params.include_stop_str_in_output


def test_stop_string_becomes_list_and_inputs_are_copied() -> None:
    stop_token_ids = [7]
    params = SamplingParams(stop="###", stop_token_ids=stop_token_ids)
    assert params.stop == ["###"]
    stop_token_ids.append(8)
    assert params.stop_token_ids == [7]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_top_k_minus_one_means_off() -> None:
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(top_k=5).top_k == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, r"temperature must be >= 0, got -1.0"),
        ({"temperature": float("nan")}, r"temperature must be >= 0, got nan"),
        ({"top_p": 0}, r"top_p must be in \(0, 1\], got 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -2}, r"top_k must be -1 or 0 \(off\) or >= 1, got -2"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\], got -0.1"),
        ({"min_p": 1.01}, r"min_p must be in \[0, 1\], got 1.01"),
        ({"max_tokens": 0}, r"max_tokens must be >= 1 or None, got 0"),
        ({"n": 0}, r"n must be >= 1, got 0"),
        ({"min_tokens": -1}, r"min_tokens must be >= 0, got -1"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be <= max_tokens, got min_tokens=5"),
        ({"logprobs": -1}, r"logprobs must be in \[0, 20\] or None, got -1"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\] or None, got 21"),
        ({"stop": ["ok", ""]}, r"stop must hold non-empty strings, got \['ok', ''\]"),
        ({"stop_token_ids": [3, -1]}, r"stop_token_ids must hold token ids >= 0, got \[3, -1\]"),
    ],
)
def test_invalid_values_are_rejected_with_message(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_boundary_values_are_accepted() -> None:
    SamplingParams(temperature=0.0, top_p=1.0, top_k=1, min_p=1.0, max_tokens=1, logprobs=20)
    SamplingParams(min_p=0.0, logprobs=0, max_tokens=None, min_tokens=1000)


@pytest.mark.parametrize(
    "temperature, is_greedy", [(0.0, True), (1e-6, True), (1e-5, False), (0.5, False), (2.0, False)]
)
def test_is_greedy_below_1e_5(temperature: float, is_greedy: bool) -> None:
    assert SamplingParams(temperature=temperature).is_greedy is is_greedy


def test_seed_must_fit_a_64_bit_generator():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 9223372036854775806\]"):
        SamplingParams(seed=2**63 - 1, n=2)
    SamplingParams(seed=2**63 - 2, n=2)
