"""Triton KDA decode step and speculative verify vs the torch ops and fla's naive recurrence.

CPU: Triton's interpreter at small shapes; GPU (``-m gpu``): real shapes (H=96, K=V=128).
"""

import pytest
import torch


from atomk31.ops.kda import kda_decode_torch, kda_gate_torch, kda_verify_torch, l2_normalize
from atomk31.triton_kernels.kda_decode import kda_decode_triton, kda_verify_triton
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_TOLERANCE = 1e-5      # fp32 throughout; only the summation order differs
GPU_TOLERANCE = 1e-4


def random_steps(num_requests, num_rows, num_heads, head_dim, value_dim, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    shape = (num_requests, num_rows, num_heads)
    q = torch.randn(*shape, head_dim, generator=generator)
    k = torch.randn(*shape, head_dim, generator=generator)
    v = torch.randn(*shape, value_dim, generator=generator)
    f = torch.randn(num_requests * num_rows, num_heads, head_dim, generator=generator) * 2
    g = kda_gate_torch(f, torch.randn(num_heads, generator=generator),
                       torch.randn(num_heads * head_dim, generator=generator), -5.0)
    beta = torch.rand(*shape, generator=generator)
    state = torch.randn(num_requests, num_heads, head_dim, value_dim, generator=generator)
    to = dict(device=DEVICE)
    return (q.to(dtype=dtype, **to), k.to(dtype=dtype, **to), v.to(dtype=dtype, **to),
            g.view(*shape, head_dim).to(**to), beta.to(**to), state.to(**to))


@pytest.mark.parametrize("num_requests,value_dim", [(1, 128), (3, 48)], ids=["N1-V128", "N3-V48"])
def test_kda_decode_triton_matches_torch(num_requests, value_dim):
    q, k, v, g, beta, state = random_steps(num_requests, 1, 2, 128, value_dim, seed=1)
    expected_state = state.clone()
    expected = kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], expected_state, 0.3)
    state = state.clone()
    o = kda_decode_triton(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, 0.3)
    assert_relative_close("o", o, expected, CPU_TOLERANCE)
    assert_relative_close("state", state, expected_state, CPU_TOLERANCE)


@pytest.mark.parametrize("num_requests", [1, 3], ids=["N1", "N3"])
def test_kda_decode_triton_updates_a_state_pool_through_its_slots(num_requests):
    """The engine's decode: the rows ``slots`` of a layer's pool, updated where they lie;
    every other slot untouched (issue 17: no gather and scatter per step)."""
    q, k, v, g, beta, state = random_steps(num_requests, 1, 2, 128, 64, seed=7)
    pool = torch.randn(7, 2, 128, 64, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    slots = torch.tensor([5, 0, 3][:num_requests], device=DEVICE)
    pool[slots] = state
    expected_pool = pool.clone()
    expected = kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], expected_pool,
                                0.3, state_slots=slots)
    rows = pool[slots].clone()
    unpooled = kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], rows, 0.3)
    assert torch.equal(expected, unpooled) and torch.equal(expected_pool[slots], rows)
    o = kda_decode_triton(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], pool, 0.3,
                          state_slots=slots)
    assert_relative_close("o", o, expected, CPU_TOLERANCE)
    assert_relative_close("pool", pool, expected_pool, CPU_TOLERANCE)
    others = [i for i in range(7) if i not in slots.tolist()]
    assert torch.equal(pool[others], expected_pool[others])


def test_kda_decode_triton_takes_strided_views_of_a_fused_projection():
    q, k, v, g, beta, state = random_steps(2, 1, 2, 128, 128, seed=2)
    fused = torch.stack([q[:, 0], k[:, 0], v[:, 0]], dim=1)       # [N, 3, H, K]
    expected_state = state.clone()
    expected = kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], expected_state, 0.1)
    o = kda_decode_triton(fused[:, 0], fused[:, 1], fused[:, 2], g[:, 0], beta[:, 0], state, 0.1)
    assert_relative_close("o", o, expected, CPU_TOLERANCE)
    assert_relative_close("state", state, expected_state, CPU_TOLERANCE)


def test_kda_verify_triton_states_after_each_row_and_leaves_state():
    q, k, v, g, beta, state = random_steps(2, 3, 2, 128, 64, seed=3)
    before = state.clone()
    expected_o, expected_states = kda_verify_torch(q, k, v, g, beta, state, 0.2)
    o, states = kda_verify_triton(q, k, v, g, beta, state, 0.2)
    assert torch.equal(state, before)
    assert_relative_close("o", o, expected_o, CPU_TOLERANCE)
    assert_relative_close("states_after_each", states, expected_states, CPU_TOLERANCE)


def test_kda_verify_triton_matches_fla_naive_recurrence():
    naive = pytest.importorskip("fla.ops.kda.naive")
    q, k, v, g, beta, state = random_steps(1, 5, 2, 128, 128, seed=4)
    o, states = kda_verify_triton(q, k, v, g, beta, state, 0.25)
    fla_o, fla_state = naive.naive_recurrent_kda(l2_normalize(q), l2_normalize(k), v, g, beta,
                                                 0.25, state, True)
    assert_relative_close("o vs fla", o, fla_o, CPU_TOLERANCE)
    assert_relative_close("last state vs fla", states[:, -1], fla_state, CPU_TOLERANCE)


def test_kda_decode_triton_rejects_mismatched_shapes():
    q, k, v, g, beta, state = random_steps(2, 1, 2, 128, 128, seed=5)
    with pytest.raises(ValueError, match=r"kda_decode: beta must have shape \[2, 2\]"):
        kda_decode_triton(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0, :1], state, 0.1)
    with pytest.raises(ValueError, match="state must be a contiguous fp32"):
        kda_decode_triton(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state.double(), 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("num_requests", [1, 33, 64], ids=lambda n: f"N{n}")
def test_kda_decode_triton_real_shapes_gpu(num_requests):
    q, k, v, g, beta, state = random_steps(num_requests, 1, 96, 128, 128, seed=6,
                                           dtype=torch.bfloat16)
    expected_state = state.clone()
    expected = kda_decode_torch(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], expected_state,
                                128 ** -0.5)
    o = kda_decode_triton(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, 128 ** -0.5)
    assert_relative_close("o", o.float(), expected.float(), 1e-2)    # BF16 output rounding
    assert_relative_close("state", state, expected_state, GPU_TOLERANCE)


@pytest.mark.gpu
def test_kda_verify_triton_real_shapes_gpu():
    q, k, v, g, beta, state = random_steps(8, 8, 96, 128, 128, seed=7)
    expected_o, expected_states = kda_verify_torch(q, k, v, g, beta, state, 128 ** -0.5)
    o, states = kda_verify_triton(q, k, v, g, beta, state, 128 ** -0.5)
    assert_relative_close("o", o, expected_o, GPU_TOLERANCE)
    assert_relative_close("states_after_each", states, expected_states, GPU_TOLERANCE)
