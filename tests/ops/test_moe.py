"""moe_route / moe_experts_{mxfp4,dense} (torch) against per-token loops and the oracle (§4.7, §3.3)."""

import pytest
import torch

from atomk31.ops.activation import situ_glu_torch
from atomk31.ops.moe import moe_experts_dense_torch, moe_experts_mxfp4_torch, moe_route_torch
from atomk31.quant import quantize_mxfp4
from atomk31.reference.formats import dequantize_mxfp4 as reference_dequantize_mxfp4
from atomk31.reference.moe import route as reference_route
from assertions import assert_relative_close


def naive_route(x, router_weight, bias, top_k, renormalize, scaling):
    """Per token: sort experts by (higher biased score, lower id), weights from unbiased scores."""
    ids, weights = [], []
    for row in x:
        scores = torch.sigmoid(router_weight.double() @ row.double()).tolist()
        biased = [s + b for s, b in zip(scores, bias.double().tolist())]
        chosen = sorted(range(len(scores)), key=lambda e: (-biased[e], e))[:top_k]
        w = [scores[e] for e in chosen]
        total = sum(w) + 1e-20
        ids.append(chosen)
        weights.append([(wi / total if renormalize else wi) * scaling for wi in w])
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids, dtype=torch.int32)


ROUTE_CASES = {"T5-E16-k4-renorm": (5, 16, 4, True, 1.0), "T1-E8-k1-norenorm-s2.5": (1, 8, 1, False, 2.5),
               "T7-E33-k33-renorm-s0.5": (7, 33, 33, True, 0.5)}


@pytest.mark.parametrize("case", ROUTE_CASES.values(), ids=ROUTE_CASES.keys())
def test_moe_route_torch_matches_token_loop(case):
    num_tokens, num_experts, top_k, renormalize, scaling = case
    torch.manual_seed(0)
    x, router_weight = torch.randn(num_tokens, 24), torch.randn(num_experts, 24) * 0.3
    bias = torch.randn(num_experts) * 0.2
    weights, ids = moe_route_torch(x, router_weight, bias, top_k, renormalize, scaling)
    expected_weights, expected_ids = naive_route(x, router_weight, bias, top_k, renormalize, scaling)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids)
    assert_relative_close("topk_weights", weights, expected_weights, 1e-6)
    reference_ids, reference_weights = reference_route(x, router_weight, bias, top_k, renormalize, scaling)
    assert torch.equal(ids.long(), reference_ids)
    assert_relative_close("topk_weights vs oracle", weights, reference_weights, 1e-6)


def test_moe_route_torch_ties_go_to_lower_expert_id():
    router_weight = torch.randn(1, 8).repeat(6, 1)       # six experts with identical scores
    weights, ids = moe_route_torch(torch.randn(3, 8), router_weight, torch.zeros(6), 4, True, 1.0)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    torch.testing.assert_close(weights, torch.full((3, 4), 0.25))


def test_moe_route_torch_bias_selects_but_does_not_weigh():
    torch.manual_seed(1)
    x, router_weight = torch.randn(2, 8), torch.randn(4, 8)
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])           # expert 3 always chosen first
    weights, ids = moe_route_torch(x, router_weight, bias, 1, False, 1.0)
    assert ids.tolist() == [[3], [3]]
    torch.testing.assert_close(weights[:, 0], torch.sigmoid(x @ router_weight[3]))


def test_moe_route_torch_empty_batch_and_bad_top_k():
    weights, ids = moe_route_torch(torch.zeros(0, 8), torch.randn(4, 8), torch.zeros(4), 2, True, 1.0)
    assert weights.shape == (0, 2) and ids.shape == (0, 2)
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.4 \(E\), got 5"):
        moe_route_torch(torch.zeros(1, 8), torch.randn(4, 8), torch.zeros(4), 5, True, 1.0)
    with pytest.raises(ValueError, match=r"correction_bias must be \[E\] = \[4\]"):
        moe_route_torch(torch.zeros(1, 8), torch.randn(4, 8), torch.zeros(5), 2, True, 1.0)


def random_mxfp4_experts(num_experts, intermediate, latent, seed):
    torch.manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * intermediate, latent) * 0.2
    w2 = torch.randn(num_experts, latent, intermediate) * 0.2
    w13_packed, w13_scales = quantize_mxfp4(w13)
    w2_packed, w2_scales = quantize_mxfp4(w2)
    return w13_packed, w13_scales, w2_packed, w2_scales


def dequantized(packed, scales):
    """Independent decoding with the oracle's MXFP4 reader (one expert at a time)."""
    return torch.stack([reference_dequantize_mxfp4(p, s) for p, s in zip(packed, scales)])


def naive_experts(z, topk_weights, topk_ids, w13, w2, beta, linear_beta):
    """u[t] = sum_j w[t, j] * W2_e situ_glu(W1_e z_t, W3_e z_t), one token and one slot at a
    time."""
    intermediate = w2.shape[-1]
    out = torch.zeros(z.shape, dtype=torch.float64)
    for t in range(z.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate = w13[e, :intermediate].double() @ z[t].double()
            up = w13[e, intermediate:].double() @ z[t].double()
            hidden = situ_glu_torch(gate, up, beta, linear_beta)
            out[t] += float(topk_weights[t, j]) * (w2[e].double() @ hidden)
    return out


EXPERT_CASES = {"T6-E5-k2-F64-Dl96": (6, 5, 2, 64, 96), "T1-E3-k1-F32-Dl32": (1, 3, 1, 32, 32),
                "T9-E8-k4-F32-Dl64": (9, 8, 4, 32, 64)}


@pytest.mark.parametrize("case", EXPERT_CASES.values(), ids=EXPERT_CASES.keys())
def test_moe_experts_mxfp4_torch_matches_token_loop(case):
    num_tokens, num_experts, top_k, intermediate, latent = case
    packed = random_mxfp4_experts(num_experts, intermediate, latent, seed=2)
    torch.manual_seed(3)
    z = torch.randn(num_tokens, latent)
    topk_weights, topk_ids = moe_route_torch(torch.randn(num_tokens, 16), torch.randn(num_experts, 16),
                                             torch.zeros(num_experts), top_k, True, 1.0)
    out = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *packed, 4.0, 25.0)
    w13, w2 = dequantized(*packed[:2]), dequantized(*packed[2:])
    assert out.dtype == torch.float32
    assert_relative_close("u", out, naive_experts(z, topk_weights, topk_ids, w13, w2, 4.0, 25.0), 1e-5)
    dense = moe_experts_dense_torch(z, topk_weights, topk_ids, w13, w2, 4.0, 25.0)
    assert_relative_close("u dense vs mxfp4", dense, out, 1e-6)


def test_moe_experts_dense_torch_matches_token_loop_without_up_cap():
    torch.manual_seed(4)
    num_experts, intermediate, latent = 4, 24, 20      # dense weights need no multiple of 32
    w13, w2 = torch.randn(num_experts, 2 * intermediate, latent), torch.randn(num_experts, latent, intermediate)
    z = torch.randn(5, latent)
    topk_ids = torch.tensor([[0, 3], [3, 0], [1, 1], [2, 0], [3, 2]], dtype=torch.int32)
    topk_weights = torch.rand(5, 2)
    out = moe_experts_dense_torch(z, topk_weights, topk_ids, w13.bfloat16(), w2.bfloat16(), 1.0, None)
    expected = naive_experts(z, topk_weights, topk_ids, w13.bfloat16(), w2.bfloat16(), 1.0, None)
    assert_relative_close("u", out, expected, 1e-5)


def test_moe_experts_torch_empty_batch():
    packed = random_mxfp4_experts(2, 32, 32, seed=5)
    out = moe_experts_mxfp4_torch(torch.zeros(0, 32), torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int32),
                                  *packed, 4.0, 25.0)
    assert out.shape == (0, 32) and out.dtype == torch.float32


def test_moe_experts_torch_rejects_bad_inputs():
    w13_packed, w13_scales, w2_packed, w2_scales = random_mxfp4_experts(2, 32, 32, seed=6)
    z, weights, ids = torch.zeros(1, 32), torch.ones(1, 1), torch.tensor([[2]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_ids must be in 0\.\.1, got 2\.\.2"):
        moe_experts_mxfp4_torch(z, weights, ids, w13_packed, w13_scales, w2_packed, w2_scales, 4.0, 25.0)
    with pytest.raises(ValueError, match=r"w2_scales must be uint8 \[2, 32, 1\]"):
        moe_experts_mxfp4_torch(z, weights, ids * 0, w13_packed, w13_scales, w2_packed, w2_scales[:, :, :0],
                                4.0, 25.0)
    with pytest.raises(ValueError, match=r"z must be \[T, Dl\] = \[T, 32\]"):
        moe_experts_mxfp4_torch(torch.zeros(1, 16), weights, ids * 0, w13_packed, w13_scales, w2_packed,
                                w2_scales, 4.0, 25.0)
    with pytest.raises(ValueError, match=r"expected w13 \[E, 2F, Dl\] and w2 \[E, Dl, F\]"):
        moe_experts_dense_torch(z, weights, ids * 0, torch.zeros(2, 64, 32), torch.zeros(2, 32, 31), 4.0, 25.0)


@pytest.mark.parametrize("num_tokens, top_k, num_experts, expected", [
    (1, 16, 64, "few_tokens"), (64, 16, 64, "few_tokens"),
    (65, 16, 64, "small_groups"), (128, 16, 64, "small_groups"),    # 32 pairs per expert
    (129, 16, 64, "large_groups"), (4096, 16, 64, "large_groups"),
    (100, 1, 2, "large_groups"),                                     # 50 pairs per expert
])
def test_moe_experts_shape_classes_by_tokens_and_pairs_per_expert(num_tokens, top_k,
                                                                  num_experts, expected):
    from atomk31.ops.moe import moe_experts_shape

    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device="meta")
    w13 = torch.empty(num_experts, 8, 8, dtype=torch.uint8, device="meta")
    assert moe_experts_shape(None, None, ids, w13) == expected


def test_moe_experts_tables_per_target():
    """NVIDIA: the word-decode GEMV for decode and the word-decode grouped GEMMs for large
    groups (BF16 only), the byte decode for small groups; gfx950: FlyDSL in every class and
    step (its grid is sized on the host, so graphs may capture it); gfx942: the portable
    kernels."""
    import atomk31.ops  # noqa: F401
    from atomk31.ops import KernelContext, Target, select_kernels

    def kernels_of(target, compute=None):
        context = KernelContext.default_for(Target.named(target))
        if compute is not None:
            context = KernelContext(context.target, compute, context.latent_dtype)
        tables = select_kernels("auto", context)
        return {(table.step, shape): table.choice("moe_experts_mxfp4", shape).kernel
                .rsplit(".", 1)[-1] for table in (tables.eager, tables.graph)
                for shape in ("few_tokens", "small_groups", "large_groups")}

    sm90 = kernels_of("sm90")
    for step in ("eager", "graph"):
        assert sm90[step, "few_tokens"] == "moe_experts_mxfp4_gemv_words_triton"
        assert sm90[step, "small_groups"] == "moe_experts_mxfp4_grouped_triton"
        assert sm90[step, "large_groups"] == "moe_experts_mxfp4_grouped_words_triton"
    fp32 = kernels_of("sm90", torch.float32)
    assert fp32["eager", "few_tokens"] == "moe_experts_mxfp4_gemv_triton"
    assert fp32["eager", "large_groups"] == "moe_experts_mxfp4_grouped_triton"
    assert set(kernels_of("gfx950").values()) == {"moe_experts_mxfp4_flydsl"}
    gfx942 = kernels_of("gfx942")
    assert gfx942["graph", "few_tokens"] == "moe_experts_mxfp4_gemv_triton"
    assert gfx942["eager", "large_groups"] == "moe_experts_mxfp4_grouped_triton"


def test_moe_checks_refuse_mismatched_shapes():
    from atomk31.ops.moe import check_moe_experts_mxfp4, check_moe_route

    weights = random_mxfp4_experts(2, 32, 32, seed=7)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_weights and topk_ids must both be \[T, k\]"):
        check_moe_experts_mxfp4(torch.zeros(3, 32), torch.ones(3, 1), ids, *weights)
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.4 \(E\), got 5"):
        check_moe_route(torch.zeros(3, 8), torch.zeros(4, 8), torch.zeros(4), 5)
