"""Triton KDA chunked prefill (and its short convolution) vs the torch ops and fla's naive
recurrence.

CPU: Triton's interpreter at small shapes (fp32: the interpreter truncates BF16 casts);
GPU (``-m gpu``): real shapes, H=96, K=V=128, fp32 and BF16 inputs (fp32 must keep IEEE
products: the default for fp32 is the exact single-kernel stage 1).
"""

from dataclasses import replace

import pytest
import torch


from atomk31.ops.kda import kda_gate_torch, l2_normalize
from atomk31.ops.kda_conv import conv_state_after_torch, short_conv_silu_torch
from atomk31.ops.kda_prefill import kda_prefill_torch
from atomk31.triton_kernels.kda_conv import (
    conv_state_after_triton, short_conv_silu_triton,
)
from atomk31.triton_kernels.kda_prefill import kda_prefill_triton, plan_chunks
from atomk31.triton_kernels.kda_prefill_plan import plan_chunks_on_device
from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_TOLERANCE = 1e-4      # fp32, IEEE products under the interpreter (as the torch op)
GPU_TOLERANCE = 2e-3      # TF32 products, fp32 intermediates (§8 #15 asks 1e-3 of the oracle)
GPU_BF16_TOLERANCE = 1e-2  # BF16 intermediates and output, as fla keeps them


def random_inputs(lengths, num_heads=2, head_dim=128, value_dim=128, seed=0, g_floor=-5.0):
    generator = torch.Generator().manual_seed(seed)
    num_tokens = sum(lengths)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator)
    k = torch.randn(num_tokens, num_heads, head_dim, generator=generator)
    v = torch.randn(num_tokens, num_heads, value_dim, generator=generator)
    f = torch.randn(num_tokens, num_heads, head_dim, generator=generator) * 3
    g = kda_gate_torch(f, torch.randn(num_heads, generator=generator),
                       torch.randn(num_heads * head_dim, generator=generator), g_floor)
    beta = torch.rand(num_tokens, num_heads, generator=generator)
    state = torch.randn(len(lengths), num_heads, head_dim, value_dim, generator=generator)
    bounds = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    return [x.to(DEVICE) for x in (q, k, v, g, beta, state, bounds)]


# Output in the chunk-parallel stage 3 (the default) or fused into the sequential stage 2;
# stage 1 in one kernel (default), with its right-hand score tiles recomputed or kept in
# registers, or in two (the wide stage 1a, kda_prefill_scores_wide.py, then stage 1b), with
# 32- or 64-channel slices.
SPLIT, FUSED = KdaPrefillTuning(), KdaPrefillTuning(split_output=False)
CACHED = KdaPrefillTuning(intra_cache_right=True)
TWO_KERNEL = KdaPrefillTuning(intra_split=True)
WIDE_SLICES = KdaPrefillTuning(intra_split=True, scores_block_k=64, gated_block=32)
# The wide stage 1a with 16-bit aqk/inverse, with BF16 score products (fp32 under the
# interpreter) and 16-channel slices.
SCORES_WIDE = KdaPrefillTuning(intra_split=True, compact_scores=True)
SCORES_WIDE_BF16 = KdaPrefillTuning(intra_split=True, compact_scores=True, scores_bf16=True,
                                    scores_block_k=16)
# The same with each slice's four blocks joined into one product.
SCORES_JOINED = KdaPrefillTuning(intra_split=True, scores_joined=True, compact_scores=True,
                                 scores_block_k=16)
# The chunk table planned on the GPU (no host sync).
SCORES_WIDE_DEVICE_PLAN = KdaPrefillTuning(intra_split=True, compact_scores=True,
                                           plan_on_device=True)
# The wide stage 1a writing the gated rows, w and u folded into stage 2 (no stage 1b).
FOLDED = KdaPrefillTuning(intra_split=True, compact_scores=True, fold_w_u=True)
FOLDED_BF16 = KdaPrefillTuning(intra_split=True, compact_scores=True, scores_tf32_solve=True,
                               plan_on_device=True, fold_w_u=True, scores_bf16=True)
# GPU (dtype, tuning) pairs; None: the launcher's default for the dtype (fp32: the exact
# single-kernel stage 1, IEEE products). FP32 inputs keep IEEE products in every variant.
GPU_CASES = pytest.mark.parametrize("dtype, tuning", [
    (torch.float32, None), (torch.float32, TWO_KERNEL), (torch.bfloat16, None),
    (torch.bfloat16, FUSED), (torch.bfloat16, SCORES_WIDE), (torch.bfloat16, SCORES_WIDE_BF16),
    (torch.bfloat16, SCORES_JOINED), (torch.bfloat16, FOLDED), (torch.bfloat16, FOLDED_BF16),
], ids=["fp32-default", "fp32-two-kernel", "bf16-default", "bf16-fused", "bf16-scores-wide",
        "bf16-scores-wide-bf16", "bf16-scores-joined", "bf16-folded", "bf16-folded-bf16-scores"])
# The interpreter is slow: the stage-1 and output designs here, the tile choices in one test.
CPU_TUNINGS = pytest.mark.parametrize("tuning", [SPLIT, FUSED, TWO_KERNEL, FOLDED],
                                      ids=["split", "fused", "two-kernel", "folded"])


@CPU_TUNINGS
@pytest.mark.parametrize("lengths", [[1], [64], [70, 0, 1, 130], [63, 65]],
                         ids=["T1", "T64", "varlen", "T63-T65"])
def test_kda_prefill_triton_matches_torch(lengths, tuning):
    q, k, v, g, beta, state, bounds = random_inputs(lengths, seed=len(lengths))
    before = state.clone()
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.1)
    o, final_state, snapshots = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1,
                                                   tuning=tuning)
    assert snapshots is None and torch.equal(state, before)
    assert_relative_close("o", o, expected[0], CPU_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], CPU_TOLERANCE)


# Snapshots are stage 2's business: the stage-1 variants add nothing here.
@pytest.mark.parametrize("tuning", [SPLIT, FUSED, TWO_KERNEL, FOLDED],
                         ids=["split", "fused", "two-kernel", "folded"])
def test_kda_prefill_triton_snapshots_cut_chunks(tuning):
    lengths = [150, 0, 5]
    q, k, v, g, beta, state, bounds = random_inputs(lengths, seed=8)
    # Inside a chunk (37, 100), on a chunk edge (64), at 0, at the end, repeated, unsorted.
    snapshot_at = torch.tensor([[0, 100], [0, 37], [0, 64], [1, 0], [2, 5], [0, 0], [0, 150],
                                [0, 37]], device=DEVICE)
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.2, snapshot_at=snapshot_at)
    o, final_state, snapshots = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.2,
                                                   snapshot_at=snapshot_at, tuning=tuning)
    assert_relative_close("o", o, expected[0], CPU_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], CPU_TOLERANCE)
    assert_relative_close("snapshots", snapshots, expected[2], CPU_TOLERANCE)
    assert torch.equal(snapshots[3], state[1]) and torch.equal(snapshots[7], snapshots[1])


@pytest.mark.parametrize("tuning", [SPLIT, CACHED, WIDE_SLICES, SCORES_WIDE, SCORES_JOINED,
                                    FOLDED],
                         ids=["split", "cached", "wide-slices", "scores-wide", "scores-joined",
                              "folded"])
def test_kda_prefill_triton_decay_at_the_floor_stays_finite(tuning):
    # g = -5 for every token: Γ reaches -320 in a chunk, where exp(-Γ) alone overflows (§4.4).
    q, k, v, g, beta, state, bounds = random_inputs([100], seed=9)
    g = torch.full_like(g, -5.0)
    g[:, :, :8] = -1e-3                                   # a few slow channels keep o non-zero
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.1)
    o, final_state, _ = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1, tuning=tuning)
    assert torch.isfinite(o).all() and torch.isfinite(final_state).all()
    assert_relative_close("o", o, expected[0], CPU_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], CPU_TOLERANCE)


@pytest.mark.parametrize("tuning", [SPLIT, TWO_KERNEL, SCORES_WIDE_BF16, FOLDED_BF16],
                         ids=["split", "two-kernel", "scores-wide-bf16", "folded-bf16"])
def test_kda_prefill_triton_odd_head_sizes(tuning):
    # K = 48, V = 40: channel slices and value blocks past the end of the head are masked.
    lengths = [33, 64]
    q, k, v, g, beta, state, bounds = random_inputs(lengths, head_dim=48, value_dim=40, seed=16)
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.3)
    o, final_state, _ = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.3, tuning=tuning)
    assert_relative_close("o", o, expected[0], CPU_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], CPU_TOLERANCE)


@pytest.mark.parametrize("tuning", [SCORES_WIDE, FOLDED], ids=["scores-wide", "folded"])
def test_kda_prefill_triton_compact_scores_under_bf16_intermediates(tuning):
    # 16-bit aqk and inverse (BF16 intermediates on fp32 inputs: the interpreter's products
    # stay fp32): within BF16 rounding of the torch op.
    q, k, v, g, beta, state, bounds = random_inputs([70], seed=17)
    compact = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1,
                                 tuning=replace(tuning, intermediate_dtype=torch.bfloat16))
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.1)
    assert_relative_close("o vs torch", compact[0], expected[0], 2e-2)
    assert_relative_close("final_state vs torch", compact[1], expected[1], 2e-2)


def test_kda_prefill_plan_on_device_matches_the_host_plan():
    # Empty requests, a 1-token one, lengths off and on the 64-token grid; slots past the
    # last chunk have length 0.
    lengths = [70, 0, 1, 130, 64, 0]
    bounds = [0] + torch.tensor(lengths).cumsum(0).tolist()
    table = plan_chunks_on_device(torch.tensor(bounds, dtype=torch.int32, device=DEVICE),
                                  bounds[-1], 64)
    host = plan_chunks(bounds, [])
    num_chunks = len(host["chunk_start"])
    assert table["chunk_start"].shape[0] == bounds[-1] // 64 + len(lengths)
    for name in ("chunk_start", "chunk_len", "chunk_snapshot"):
        assert table[name][:num_chunks].tolist() == host[name], name
    assert table["chunk_len"][num_chunks:].eq(0).all()
    assert table["request_chunks"].tolist() == host["request_chunks"]


def test_kda_prefill_triton_plan_on_device_matches_torch():
    lengths = [70, 0, 1, 40]
    q, k, v, g, beta, state, bounds = random_inputs(lengths, seed=18)
    expected = kda_prefill_torch(q, k, v, g, beta, state, bounds, 0.1)
    o, final_state, _ = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1,
                                           tuning=SCORES_WIDE_DEVICE_PLAN)
    assert_relative_close("o", o, expected[0], CPU_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], CPU_TOLERANCE)


def test_kda_prefill_triton_matches_fla_naive_recurrence():
    naive = pytest.importorskip("fla.ops.kda.naive")
    q, k, v, g, beta, state, bounds = random_inputs([90], seed=10)
    o, final_state, _ = kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.15)
    fla_o, fla_state = naive.naive_recurrent_kda(l2_normalize(q)[None], l2_normalize(k)[None],
                                                 v[None], g[None], beta[None], 0.15, state, True)
    assert_relative_close("o vs fla", o, fla_o[0], CPU_TOLERANCE)
    assert_relative_close("final_state vs fla", final_state, fla_state, CPU_TOLERANCE)


def test_kda_prefill_triton_rejects_other_chunk_sizes_and_bad_snapshots():
    q, k, v, g, beta, state, bounds = random_inputs([10], seed=11)
    with pytest.raises(ValueError, match="supports chunk_size=64 only, got 32"):
        kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1, chunk_size=32)
    with pytest.raises(ValueError, match=r"snapshot_at row \(0, 11\) is out of range"):
        kda_prefill_triton(q, k, v, g, beta, state, bounds, 0.1,
                           snapshot_at=torch.tensor([[0, 11]], device=DEVICE))


def conv_inputs(lengths, num_channels, seed):
    generator = torch.Generator().manual_seed(seed)
    num_tokens = sum(lengths)
    z = torch.randn(num_tokens, num_channels, generator=generator)
    weight = torch.randn(num_channels, 4, generator=generator)
    conv_state = torch.randn(len(lengths), 3, num_channels, generator=generator)
    has_state = torch.rand(len(lengths), generator=generator) > 0.3
    bounds = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    return [x.to(DEVICE) for x in (z, weight, conv_state, bounds, has_state)]


@pytest.mark.parametrize("lengths", [[1, 1, 1], [5, 0, 2, 40]], ids=["decode", "varlen"])
def test_short_conv_silu_triton_matches_torch(lengths):
    z, weight, conv_state, bounds, has_state = conv_inputs(lengths, 300, seed=12)
    expected_state = conv_state.clone()
    expected = short_conv_silu_torch(z, weight, expected_state, bounds, has_state)
    y = short_conv_silu_triton(z, weight, conv_state, bounds, has_state)
    assert_relative_close("y", y, expected, 1e-6)
    assert torch.equal(conv_state, expected_state)


def test_conv_state_after_triton_matches_torch():
    z, _, conv_state, bounds, has_state = conv_inputs([5, 0, 2, 40], 200, seed=13)
    snapshot_at = torch.tensor([[0, 0], [0, 2], [0, 5], [1, 0], [2, 1], [3, 39]], device=DEVICE)
    expected = conv_state_after_torch(z, conv_state, bounds, has_state, snapshot_at)
    assert torch.equal(conv_state_after_triton(z, conv_state, bounds, has_state, snapshot_at),
                       expected)


@pytest.mark.parametrize("lengths", [[1, 1, 1], [5, 0, 2, 40]], ids=["decode", "varlen"])
def test_short_conv_silu_triton_reads_and_writes_a_pool_through_its_slots(lengths):
    """The engine's call: the batch's requests are rows ``slots`` of a layer's conv pool
    (issue 17: updated where they lie); other slots untouched; the snapshot rows equal."""
    z, weight, conv_state, bounds, has_state = conv_inputs(lengths, 300, seed=15)
    slots = torch.tensor([6, 1, 4, 2][:len(lengths)], device=DEVICE)
    pool = torch.randn(8, 3, 300, generator=torch.Generator().manual_seed(16)).to(DEVICE)
    pool[slots] = conv_state
    snapshot_at = torch.tensor([[0, 1], [len(lengths) - 1, 0]], device=DEVICE)
    expected_snapshots = conv_state_after_torch(z, conv_state, bounds, has_state, snapshot_at)
    expected_state = conv_state.clone()
    expected = short_conv_silu_torch(z, weight, expected_state, bounds, has_state)
    expected_pool = pool.clone()
    expected_pool[slots] = expected_state
    assert torch.equal(conv_state_after_triton(z, pool, bounds, has_state, snapshot_at,
                                               state_slots=slots), expected_snapshots)
    torch_pool = pool.clone()
    assert torch.equal(short_conv_silu_torch(z, weight, torch_pool, bounds, has_state,
                                             state_slots=slots), expected)
    assert torch.equal(torch_pool, expected_pool)
    y = short_conv_silu_triton(z, weight, pool, bounds, has_state, state_slots=slots)
    assert_relative_close("y", y, expected, 1e-6)
    assert torch.equal(pool, expected_pool)


@pytest.mark.gpu
@GPU_CASES
def test_kda_prefill_triton_real_shapes_gpu(dtype, tuning):
    lengths = [3000, 1, 0, 1100]
    q, k, v, g, beta, state, bounds = random_inputs(lengths, num_heads=96, seed=14)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    snapshot_at = torch.tensor([[0, 2048], [0, 100], [3, 1024]], device=DEVICE)
    expected = kda_prefill_torch(q.float(), k.float(), v.float(), g, beta, state, bounds,
                                 128 ** -0.5, snapshot_at=snapshot_at)
    o, final_state, snapshots = kda_prefill_triton(q, k, v, g, beta, state, bounds, 128 ** -0.5,
                                                   snapshot_at=snapshot_at, tuning=tuning)
    tolerance = GPU_TOLERANCE if dtype == torch.float32 else GPU_BF16_TOLERANCE
    assert_relative_close("o", o.float(), expected[0], tolerance)
    assert_relative_close("final_state", final_state, expected[1], tolerance)
    assert_relative_close("snapshots", snapshots, expected[2], tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [SCORES_WIDE_DEVICE_PLAN,
                                    replace(FOLDED, scores_tf32_solve=True, plan_on_device=True),
                                    FOLDED_BF16],
                         ids=["wide", "folded", "folded-bf16-scores"])
def test_kda_prefill_triton_plan_on_device_real_shapes_gpu(tuning):
    # No snapshots: the chunk table comes from the GPU planner (kda_prefill_plan.py).
    lengths = [3000, 1, 0, 1100]
    q, k, v, g, beta, state, bounds = random_inputs(lengths, num_heads=96, seed=19)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    expected = kda_prefill_torch(q.float(), k.float(), v.float(), g, beta, state, bounds,
                                 128 ** -0.5)
    o, final_state, _ = kda_prefill_triton(q, k, v, g, beta, state, bounds, 128 ** -0.5,
                                           tuning=tuning)
    assert_relative_close("o", o.float(), expected[0], GPU_BF16_TOLERANCE)
    assert_relative_close("final_state", final_state, expected[1], GPU_BF16_TOLERANCE)


@pytest.mark.gpu
def test_short_conv_silu_triton_real_shapes_gpu():
    z, weight, conv_state, bounds, has_state = conv_inputs([4000, 1, 0, 77], 3 * 12288, seed=15)
    z, conv_state = z.bfloat16(), conv_state.bfloat16()
    expected_state = conv_state.clone()
    expected = short_conv_silu_torch(z, weight, expected_state, bounds, has_state)
    y = short_conv_silu_triton(z, weight, conv_state, bounds, has_state)
    assert_relative_close("y", y.float(), expected.float(), 1e-2)
    assert torch.equal(conv_state, expected_state)
