"""The KDA scan: sequential form vs flash-linear-attention's naive recurrence, chunked vs sequential."""

import pytest
import torch
from fla.ops.kda.naive import naive_recurrent_kda

from atomk31.reference import kda_chunked, kda_recurrent, l2_normalize


def random_scan_inputs(num_tokens: int, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """q, k [T, H, K], v [T, H, V], g [T, H, K] in (-5, 0), beta [T, H], state [H, K, V]; K != V on purpose."""
    generator = torch.Generator().manual_seed(seed)
    heads, key_dim, value_dim = 3, 32, 24

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64)

    inputs = {
        "q": normal(num_tokens, heads, key_dim),
        "k": normal(num_tokens, heads, key_dim),
        "v": normal(num_tokens, heads, value_dim),
        "g": -5.0 * torch.sigmoid(normal(num_tokens, heads, key_dim) - 1.0),
        "beta": torch.sigmoid(normal(num_tokens, heads)),
        "initial_state": 0.5 * normal(heads, key_dim, value_dim),
    }
    return {name: tensor.to(dtype) for name, tensor in inputs.items()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("with_initial_state", [False, True], ids=["zero_state", "given_state"])
def test_kda_recurrent_matches_fla_naive_recurrence(with_initial_state: bool) -> None:
    inputs = random_scan_inputs(37, seed=0)
    state = inputs["initial_state"] if with_initial_state else None
    output, final_state = kda_recurrent(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], state)
    # fla scales q itself (default 1/sqrt(K)) but does not L2-normalise: feed it normalised q, k.
    fla_output, fla_state = naive_recurrent_kda(
        l2_normalize(inputs["q"]).unsqueeze(0),
        l2_normalize(inputs["k"]).unsqueeze(0),
        inputs["v"].unsqueeze(0),
        inputs["g"].unsqueeze(0),
        inputs["beta"].unsqueeze(0),
        initial_state=None if state is None else state.unsqueeze(0),
        output_final_state=True,
    )
    torch.testing.assert_close(output, fla_output[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_state, fla_state[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 63, 64, 65, 200], ids=lambda t: f"T{t}")
def test_kda_chunked_matches_recurrent_float64(num_tokens: int) -> None:
    inputs = random_scan_inputs(num_tokens, seed=num_tokens, dtype=torch.float64)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["initial_state"])
    expected_output, expected_state = kda_recurrent(*args)
    output, state = kda_chunked(*args, chunk_size=64)
    assert relative_error(output, expected_output) < 1e-12
    assert relative_error(state, expected_state) < 1e-12


@pytest.mark.parametrize("num_tokens", [65, 200], ids=lambda t: f"T{t}")
def test_kda_chunked_matches_recurrent_float32_within_spec_tolerance(num_tokens: int) -> None:
    inputs = random_scan_inputs(num_tokens, seed=7)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["initial_state"])
    expected_output, expected_state = kda_recurrent(*args)
    output, state = kda_chunked(*args, chunk_size=64)
    assert relative_error(output, expected_output) < 1e-3          # MODEL_SPEC §8 #15
    assert relative_error(state, expected_state) < 1e-3


def test_kda_chunked_small_chunks_match_recurrent() -> None:
    inputs = random_scan_inputs(20, seed=3, dtype=torch.float64)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["initial_state"])
    expected_output, _ = kda_recurrent(*args)
    for chunk_size in (1, 3, 16):
        assert relative_error(kda_chunked(*args, chunk_size=chunk_size)[0], expected_output) < 1e-12


def test_kda_scan_of_zero_tokens_returns_the_initial_state() -> None:
    inputs = random_scan_inputs(0, seed=0)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["initial_state"])
    for scan in (kda_recurrent, kda_chunked):
        output, state = scan(*args)
        assert output.shape == (0, 3, 24)
        assert torch.equal(state, inputs["initial_state"])


def test_kda_scan_splits_at_any_token_given_the_state() -> None:
    inputs = random_scan_inputs(30, seed=5)
    names = ("q", "k", "v", "g", "beta")
    whole, whole_state = kda_recurrent(*(inputs[n] for n in names), inputs["initial_state"])
    first, middle_state = kda_recurrent(*(inputs[n][:11] for n in names), inputs["initial_state"])
    second, final_state = kda_chunked(*(inputs[n][11:] for n in names), middle_state, chunk_size=8)
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_state, whole_state, rtol=1e-5, atol=1e-5)


def test_kda_scan_rejects_a_wrong_initial_state_shape() -> None:
    inputs = random_scan_inputs(4, seed=0)
    with pytest.raises(ValueError, match=r"initial_state must be \[H, K, V\] = \[3, 32, 24\], got \[3, 24, 32\]"):
        kda_recurrent(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], torch.zeros(3, 24, 32))
