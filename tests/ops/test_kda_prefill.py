"""kda_prefill (torch): chunked KDA vs the §4.4 per-token loop, the oracle and fla's naive scan."""

import pytest
import torch

from atomk31.ops.kda import kda_gate_torch
from atomk31.ops.kda_prefill import kda_prefill_torch
from atomk31.reference.kda_scan import kda_recurrent
from assertions import assert_relative_close

# Chunked vs sequential fp32: max-abs error over max-abs value (§8 #15 allows 1e-3; we hold 1e-4).
TOLERANCE = 1e-4


def naive_kda_request(q, k, v, g, beta, state, scale):
    """§4.4's sequential recurrence for one request, token by token (fp64): returns (o, state)."""
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    outputs = []
    for t in range(q.shape[0]):
        q_hat = q[t] / torch.sqrt((q[t] ** 2).sum(-1, keepdim=True) + 1e-6) * scale   # [H, K]
        k_hat = k[t] / torch.sqrt((k[t] ** 2).sum(-1, keepdim=True) + 1e-6)
        state = state * g[t].exp()[:, :, None]                                         # 1. decay
        error = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k_hat, state))   # 2. error
        state = state + k_hat[:, :, None] * error[:, None, :]                          # 3. write
        outputs.append(torch.einsum("hk,hkv->hv", q_hat, state))                       # 4. read
    o = torch.stack(outputs) if outputs else v.new_zeros(0, *v.shape[1:])
    return o, state


def random_inputs(lengths, num_heads=2, head_dim=32, value_dim=24, seed=0, lower_bound=-5.0):
    torch.manual_seed(seed)
    num_tokens = sum(lengths)
    q = torch.randn(num_tokens, num_heads, head_dim)
    k = torch.randn(num_tokens, num_heads, head_dim)
    v = torch.randn(num_tokens, num_heads, value_dim)
    g = kda_gate_torch(torch.randn(num_tokens, num_heads, head_dim), torch.randn(num_heads),
                       torch.randn(num_heads * head_dim), lower_bound)
    beta = torch.rand(num_tokens, num_heads)
    initial_state = torch.randn(len(lengths), num_heads, head_dim, value_dim)
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k, v, g, beta, initial_state, cu_seqlens


def run_naive(q, k, v, g, beta, initial_state, cu_seqlens, scale):
    bounds = cu_seqlens.tolist()
    outputs, states = [], []
    for r in range(len(bounds) - 1):
        piece = slice(bounds[r], bounds[r + 1])
        o, state = naive_kda_request(q[piece], k[piece], v[piece], g[piece], beta[piece], initial_state[r], scale)
        outputs.append(o)
        states.append(state)
    return torch.cat(outputs), torch.stack(states)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 200], ids=lambda n: f"T{n}")
def test_kda_prefill_torch_matches_token_loop(length):
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs([length], seed=length)
    scale = q.shape[-1] ** -0.5
    o, final_state, snapshots = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    expected_o, expected_state = run_naive(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    assert snapshots is None and o.dtype == torch.float32
    assert_relative_close("o", o, expected_o, TOLERANCE)
    assert_relative_close("final_state", final_state, expected_state, TOLERANCE)
    oracle_o, oracle_state = kda_recurrent(q, k, v, g, beta, initial_state[0])
    assert_relative_close("o vs oracle", o, oracle_o, TOLERANCE)
    assert_relative_close("final_state vs oracle", final_state[0], oracle_state, TOLERANCE)


@pytest.mark.parametrize("length", [1, 65, 200], ids=lambda n: f"T{n}")
def test_kda_prefill_torch_matches_fla_naive_recurrent(length):
    naive = pytest.importorskip("fla.ops.kda.naive")
    from atomk31.ops.kda import l2_normalize
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs([length], num_heads=3, head_dim=128,
                                                                value_dim=128, seed=7)
    scale = 0.1                                  # not K**-0.5: the scale must reach the kernel
    o, final_state, _ = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    fla_o, fla_state = naive.naive_recurrent_kda(l2_normalize(q)[None], l2_normalize(k)[None], v[None], g[None],
                                                 beta[None], scale, initial_state, True)
    assert_relative_close("o vs fla", o, fla_o[0], TOLERANCE)
    assert_relative_close("final_state vs fla", final_state, fla_state, TOLERANCE)


@pytest.mark.parametrize("chunk_size", [1, 16, 64], ids=lambda c: f"C{c}")
def test_kda_prefill_torch_varlen_with_empty_request(chunk_size):
    lengths = [70, 0, 1, 33]
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs(lengths, seed=11)
    scale = q.shape[-1] ** -0.5
    o, final_state, _ = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale, chunk_size)
    expected_o, expected_state = run_naive(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    assert_relative_close("o", o, expected_o, TOLERANCE)
    assert_relative_close("final_state", final_state, expected_state, TOLERANCE)
    assert torch.equal(final_state[1], initial_state[1])   # the empty request keeps its state


def test_kda_prefill_torch_null_gate_form():
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs([90], seed=12, lower_bound=None)
    scale = q.shape[-1] ** -0.5
    o, final_state, _ = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    expected_o, expected_state = run_naive(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    assert_relative_close("o", o, expected_o, TOLERANCE)
    assert_relative_close("final_state", final_state, expected_state, TOLERANCE)


def test_kda_prefill_torch_strong_decay_does_not_overflow():
    # g at the -5 floor for 64 tokens: Γ reaches -320, where exp(-Γ) alone overflows fp32 (§4.4).
    q, k, v, _, beta, initial_state, cu_seqlens = random_inputs([130], seed=13)
    g = torch.full(q.shape, -5.0)
    o, final_state, _ = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, q.shape[-1] ** -0.5)
    assert torch.isfinite(o).all() and torch.isfinite(final_state).all()
    expected_o, _ = run_naive(q, k, v, g, beta, initial_state, cu_seqlens, q.shape[-1] ** -0.5)
    assert_relative_close("o", o, expected_o, TOLERANCE)


def test_kda_prefill_torch_snapshots_equal_running_the_prefix_alone():
    lengths = [150, 0, 5]
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs(lengths, seed=14)
    scale = q.shape[-1] ** -0.5
    # Cuts inside a chunk (37, 100), on a chunk edge (64), at 0, at the end, repeated, unsorted.
    snapshot_at = torch.tensor([[0, 100], [0, 37], [0, 64], [1, 0], [2, 5], [0, 0], [0, 150], [0, 37]])
    o, final_state, snapshots = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale,
                                                  snapshot_at=snapshot_at)
    full_o, _, _ = kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, scale)
    assert_relative_close("o with cuts", o, full_o, TOLERANCE)
    bounds = cu_seqlens.tolist()
    for i, (r, m) in enumerate(snapshot_at.tolist()):
        start = bounds[r]
        _, alone, _ = kda_prefill_torch(q[start:start + m], k[start:start + m], v[start:start + m],
                                        g[start:start + m], beta[start:start + m], initial_state[r:r + 1],
                                        torch.tensor([0, m], dtype=torch.int32), scale)
        assert_relative_close(f"snapshot {i} ({r}, {m})", snapshots[i], alone[0], TOLERANCE)
    assert torch.equal(snapshots[3], initial_state[1])
    assert torch.equal(snapshots[6], final_state[0])


def test_kda_prefill_torch_does_not_modify_initial_state_and_keeps_v_dtype():
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs([10], seed=15)
    before = initial_state.clone()
    o, _, _ = kda_prefill_torch(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, initial_state, cu_seqlens, 0.2)
    assert torch.equal(initial_state, before)
    assert o.dtype == torch.bfloat16


def test_kda_prefill_torch_empty_batch():
    q, k, v, g, beta, initial_state, _ = random_inputs([0, 0], seed=16)
    o, final_state, snapshots = kda_prefill_torch(q, k, v, g, beta, initial_state,
                                                  torch.zeros(3, dtype=torch.int32), 0.2,
                                                  snapshot_at=torch.tensor([[1, 0]]))
    assert o.shape == (0, 2, 24)
    assert torch.equal(final_state, initial_state) and torch.equal(snapshots[0], initial_state[1])


def test_kda_prefill_torch_rejects_bad_inputs():
    q, k, v, g, beta, initial_state, cu_seqlens = random_inputs([4, 3], seed=17)
    with pytest.raises(ValueError, match=r"kda_prefill: v must have shape \[7, 2, 24\]"):
        kda_prefill_torch(q, k, v[:, :, :5], g, beta, initial_state, cu_seqlens, 0.2)
    with pytest.raises(ValueError, match="initial_state must be fp32"):
        kda_prefill_torch(q, k, v, g, beta, initial_state.bfloat16(), cu_seqlens, 0.2)
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to T=7 without decreasing, got \[0, 5, 4\]"):
        kda_prefill_torch(q, k, v, g, beta, initial_state, torch.tensor([0, 5, 4], dtype=torch.int32), 0.2)
    with pytest.raises(ValueError, match=r"snapshot_at row \(1, 4\) is out of range"):
        kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, 0.2, snapshot_at=torch.tensor([[1, 4]]))
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        kda_prefill_torch(q, k, v, g, beta, initial_state, cu_seqlens, 0.2, chunk_size=0)
