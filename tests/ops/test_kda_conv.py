"""short_conv_silu / conv_state_after (torch) vs a per-request loop of §4.4 and the oracle."""

import pytest
import torch

from atomk31.ops.kda_conv import conv_state_after_torch, short_conv_silu_torch
from atomk31.reference.kda import short_conv_silu as reference_short_conv_silu


def naive_conv_request(z, weight, cache):
    """§4.4 pseudo-code for one request: zz = cat(cache, z); y_t = sum_j w[:, j] zz[t + j]."""
    width = weight.shape[1]
    zz = torch.cat([cache.double(), z.double()])
    y = torch.zeros(z.shape, dtype=torch.float64)
    for t in range(z.shape[0]):
        y[t] = sum(weight[:, j].double() * zz[t + j] for j in range(width))
    return torch.nn.functional.silu(y), zz[-(width - 1):]


def random_batch(lengths, channels=12, width=4, seed=0):
    torch.manual_seed(seed)
    z = torch.randn(sum(lengths), channels)
    weight = torch.randn(channels, width)
    conv_state = torch.randn(len(lengths), width - 1, channels)
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    return z, weight, conv_state, cu_seqlens


CASES = {
    "one-request-T9": ([9], [True]),
    "varlen-empty-short": ([5, 0, 1, 2, 8], [True, True, False, True, False]),
    "all-new-T1": ([1], [False]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_short_conv_silu_torch_matches_request_loop(case):
    lengths, has_initial = case
    z, weight, conv_state, cu_seqlens = random_batch(lengths, seed=len(lengths))
    has_initial_state = torch.tensor(has_initial)
    conv_state[~has_initial_state] = float("nan")        # an unused slot may hold garbage
    before = conv_state.clone()
    y = short_conv_silu_torch(z, weight, conv_state, cu_seqlens, has_initial_state)
    bounds = cu_seqlens.tolist()
    for r in range(len(lengths)):
        cache = before[r] if has_initial[r] else torch.zeros_like(before[r])
        piece = slice(bounds[r], bounds[r + 1])
        expected_y, expected_state = naive_conv_request(z[piece], weight, cache)
        torch.testing.assert_close(y[piece].double(), expected_y, rtol=1e-6, atol=1e-6)
        assert torch.equal(conv_state[r].double(), expected_state), f"conv_state of request {r}"
        oracle_y, oracle_state = reference_short_conv_silu(z[piece], weight, cache)
        torch.testing.assert_close(y[piece], oracle_y, rtol=1e-6, atol=1e-6)
        assert torch.equal(conv_state[r], oracle_state)


def test_short_conv_silu_torch_bf16_state_and_output():
    z, weight, conv_state, cu_seqlens = random_batch([6, 2], seed=3)
    z, conv_state = z.bfloat16(), conv_state.bfloat16()
    expected_state = torch.stack([z[3:6], torch.cat([conv_state[1, 2:], z[6:8]])])
    y = short_conv_silu_torch(z, weight, conv_state, cu_seqlens, torch.tensor([True, True]))
    assert y.dtype == torch.bfloat16 and conv_state.dtype == torch.bfloat16
    assert torch.equal(conv_state, expected_state)


def test_short_conv_silu_torch_chunked_calls_equal_one_call():
    z, weight, conv_state, _ = random_batch([11], seed=4)
    state_once, state_twice = conv_state.clone(), conv_state.clone()
    has_initial_state = torch.tensor([True])

    def one_request(n: int) -> torch.Tensor:
        return torch.tensor([0, n], dtype=torch.int32)

    y_once = short_conv_silu_torch(z, weight, state_once, one_request(11), has_initial_state)
    y_a = short_conv_silu_torch(z[:2], weight, state_twice, one_request(2), has_initial_state)
    y_b = short_conv_silu_torch(z[2:], weight, state_twice, one_request(9), has_initial_state)
    torch.testing.assert_close(torch.cat([y_a, y_b]), y_once, rtol=1e-6, atol=1e-6)
    assert torch.equal(state_once, state_twice)


def test_conv_state_after_torch_equals_running_the_prefix():
    lengths = [7, 0, 2]
    z, weight, conv_state, cu_seqlens = random_batch(lengths, seed=5)
    has_initial_state = torch.tensor([True, False, True])
    snapshot_at = torch.tensor([[0, 0], [0, 1], [0, 3], [0, 7], [1, 0], [2, 1], [2, 2]])
    snapshots = conv_state_after_torch(z, conv_state, cu_seqlens, has_initial_state, snapshot_at)
    bounds = cu_seqlens.tolist()
    for i, (r, m) in enumerate(snapshot_at.tolist()):
        state = conv_state[r:r + 1].clone()
        short_conv_silu_torch(z[bounds[r]:bounds[r] + m], weight, state,
                              torch.tensor([0, m], dtype=torch.int32), has_initial_state[r:r + 1])
        assert torch.equal(snapshots[i], state[0]), f"snapshot {i} = ({r}, {m})"


def test_short_conv_torch_rejects_bad_inputs():
    z, weight, conv_state, cu_seqlens = random_batch([3, 2], seed=6)
    has_initial_state = torch.tensor([True, True])
    with pytest.raises(ValueError, match=r"weight must be \[C, Kc\] = \[12, 4\]"):
        short_conv_silu_torch(z, weight[:, None, :], conv_state, cu_seqlens, has_initial_state)
    with pytest.raises(ValueError, match=r"has_initial_state must be bool \[N\] = \[2\]"):
        short_conv_silu_torch(z, weight, conv_state, cu_seqlens, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"cu_seqlens must be int32 \[N\+1\] = \[3\]"):
        short_conv_silu_torch(z, weight, conv_state, cu_seqlens[:2], has_initial_state)
    with pytest.raises(ValueError, match=r"snapshot_at row \(1, 3\) is out of range"):
        conv_state_after_torch(z, conv_state, cu_seqlens, has_initial_state, torch.tensor([[1, 3]]))
