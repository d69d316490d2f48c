"""kda_gate / kda_decode / kda_verify (torch) vs §4.4's formulas, the oracle and the chunked prefill."""

import pytest
import torch
import torch.nn.functional as F

from atomk31.ops.kda import kda_decode_torch, kda_gate_torch, kda_verify_torch
from atomk31.ops.kda_prefill import kda_prefill_torch
from atomk31.reference.kda import kda_gates as reference_kda_gates
from assertions import assert_relative_close

TOLERANCE = 1e-4   # max-abs error over max-abs value, fp32 recurrent vs chunked


@pytest.mark.parametrize("lower_bound", [-5.0, -2.5, None], ids=["lb-5", "lb-2.5", "null"])
def test_kda_gate_torch_matches_formula_and_oracle(lower_bound):
    torch.manual_seed(0)
    f, A_log, dt_bias = torch.randn(5, 3, 8) * 3, torch.randn(3), torch.randn(24)
    g = kda_gate_torch(f.bfloat16(), A_log, dt_bias, lower_bound)
    assert g.dtype == torch.float32 and g.shape == (5, 3, 8)
    f = f.bfloat16().float()
    for h in range(3):
        pre = f[:, h] + dt_bias[h * 8:(h + 1) * 8]
        if lower_bound is None:
            expected = -A_log[h].exp() * F.softplus(pre)
        else:
            expected = lower_bound * torch.sigmoid(A_log[h].exp() * pre)
        torch.testing.assert_close(g[:, h], expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g, reference_kda_gates(f, torch.zeros(5, 3), A_log, dt_bias, lower_bound)[0])
    # (lower_bound, 0) in exact arithmetic; fp32 sigmoid saturates onto the ends.
    assert (g <= 0).all() and (lower_bound is None or (g >= lower_bound).all())


def test_kda_gate_torch_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"expected A_log \[H\] = \[3\] and dt_bias \[H\*K\] = \[24\]"):
        kda_gate_torch(torch.randn(5, 3, 8), torch.randn(128), torch.randn(24), -5.0)
    with pytest.raises(ValueError, match="lower_bound must be negative or None, got 5.0"):
        kda_gate_torch(torch.randn(5, 3, 8), torch.randn(3), torch.randn(24), 5.0)


def random_steps(num_requests, num_steps, num_heads=2, head_dim=32, value_dim=16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(num_requests, num_steps, num_heads, head_dim)
    k = torch.randn(num_requests, num_steps, num_heads, head_dim)
    v = torch.randn(num_requests, num_steps, num_heads, value_dim)
    g = kda_gate_torch(torch.randn(num_requests * num_steps, num_heads, head_dim), torch.randn(num_heads),
                       torch.randn(num_heads * head_dim), -5.0).view(q.shape)
    beta = torch.rand(num_requests, num_steps, num_heads)
    state = torch.randn(num_requests, num_heads, head_dim, value_dim)
    return q, k, v, g, beta, state


def test_kda_decode_torch_steps_equal_prefill():
    num_requests, num_steps = 3, 70
    q, k, v, g, beta, state = random_steps(num_requests, num_steps, seed=1)
    scale = 0.2
    prefill_o, prefill_state, _ = kda_prefill_torch(
        *(x.reshape(num_requests * num_steps, *x.shape[2:]) for x in (q, k, v, g, beta)), state,
        torch.arange(0, num_requests * num_steps + 1, num_steps, dtype=torch.int32), scale)
    decode_state = state.clone()
    decode_o = torch.stack([kda_decode_torch(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], decode_state, scale)
                            for t in range(num_steps)], dim=1)
    assert_relative_close("o", decode_o.reshape(prefill_o.shape), prefill_o, TOLERANCE)
    assert_relative_close("state", decode_state, prefill_state, TOLERANCE)


def test_kda_decode_torch_single_step_by_hand():
    # One head, K = V = 1: S' = S e^g + k̂ beta (v - k̂ S e^g), o = q̂ scale S' with q̂ = k̂ = 1.
    state = torch.tensor([[[[2.0]]]])
    o = kda_decode_torch(torch.full((1, 1, 1), 3.0), torch.full((1, 1, 1), 0.5), torch.full((1, 1, 1), 1.0),
                         torch.full((1, 1, 1), -0.5), torch.full((1, 1), 0.25), state, 2.0)
    decayed = 2.0 * torch.tensor(-0.5).exp()
    unit = 0.5 / (0.25 + 1e-6) ** 0.5              # l2-normalised with eps 1e-6
    expected_state = decayed + unit * 0.25 * (1.0 - unit * decayed)
    torch.testing.assert_close(state.reshape(()), expected_state)
    torch.testing.assert_close(o.reshape(()), 3.0 / (9.0 + 1e-6) ** 0.5 * 2.0 * expected_state)


def test_kda_verify_torch_states_equal_stepping_one_by_one():
    q, k, v, g, beta, state = random_steps(2, 5, seed=2)
    before = state.clone()
    o, states_after_each = kda_verify_torch(q, k, v, g, beta, state, 0.3)
    assert torch.equal(state, before), "kda_verify must leave the state untouched"
    stepped = state.clone()
    for t in range(5):
        step_o = kda_decode_torch(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], stepped, 0.3)
        assert torch.equal(o[:, t], step_o), f"o of row {t}"
        assert torch.equal(states_after_each[:, t], stepped), f"state after row {t}"


def test_kda_verify_torch_rollback_resumes_exactly():
    # Accept the first 2 of 4 rows, resume from that state: equals a verify of those 2 rows.
    q, k, v, g, beta, state = random_steps(1, 4, seed=3)
    _, states_after_each = kda_verify_torch(q, k, v, g, beta, state, 0.3)
    _, accepted = kda_verify_torch(q[:, :2], k[:, :2], v[:, :2], g[:, :2], beta[:, :2], state, 0.3)
    assert torch.equal(states_after_each[:, 1], accepted[:, -1])


def test_kda_decode_and_verify_torch_reject_bad_shapes():
    q, k, v, g, beta, state = random_steps(2, 3, seed=4)
    with pytest.raises(ValueError, match=r"kda_decode: beta must have shape \[2, 2\]"):
        kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0, :1], state, 0.3)
    with pytest.raises(ValueError, match="kda_decode: state must be fp32"):
        kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state.bfloat16(), 0.3)
    with pytest.raises(ValueError, match="kda_verify: state has N=1 requests, inputs have 2"):
        kda_verify_torch(q, k, v, g, beta, state[:1], 0.3)
    with pytest.raises(ValueError, match=r"kda_verify: q must be \[N, Tq, H, K\]"):
        kda_verify_torch(q[:, 0], k, v, g, beta, state, 0.3)
