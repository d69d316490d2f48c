"""The word-decode grouped MoE GEMMs (atomk31/triton_kernels/moe_grouped_words.py) vs the torch op.

CPU: the interpreter at small shapes, several expert blocks per expert and partly filled
blocks, fp32 activations held to 1e-5; when it is the default. GPU (``-m gpu``): the proxy's
shapes at the configurations bench_moe times (BF16, 1e-2: h rounded to BF16 on both sides;
the registered op at 300 tokens takes it by default: test_moe.py, test_moe_decode_range.py)
and fp32 exact.
"""

import pytest
import torch

from atomk31.ops.moe import moe_experts_mxfp4_torch, moe_route_torch
from atomk31.quant import quantize_mxfp4
from atomk31.triton_kernels.moe_grouped_gemm import default_words, moe_experts_mxfp4_triton
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def moe_case(num_tokens, num_experts, top_k, intermediate, latent, seed):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * intermediate, latent, generator=generator,
                      device=DEVICE) * 0.05
    w2 = torch.randn(num_experts, latent, intermediate, generator=generator, device=DEVICE) * 0.05
    x = torch.randn(num_tokens, latent, generator=generator, device=DEVICE)
    router = torch.randn(num_experts, latent, generator=generator, device=DEVICE) * 0.1
    topk_weights, topk_ids = moe_route_torch(x, router, torch.zeros(num_experts, device=DEVICE),
                                             top_k, True, 1.0)
    return x, topk_weights, topk_ids, (*quantize_mxfp4(w13), *quantize_mxfp4(w2))


@pytest.mark.parametrize("linear_beta,block_m", [(25.0, 16), (None, 32)],
                         ids=["capped-bm16", "uncapped-bm32"])
def test_moe_grouped_words_fp32_matches_torch(linear_beta, block_m):
    # 40 tokens x top-3 over 8 experts: ~15 pairs per expert, so bm16 gives experts of one
    # and two blocks, most of them partly filled.
    x, topk_weights, topk_ids, weights = moe_case(40, 8, 3, 128, 256, seed=40)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, linear_beta)
    u = moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, linear_beta,
                                 small_batch=False, words=True, block_m=block_m, block_n=32,
                                 block_k=128)
    assert_relative_close("u", u, expected, 1e-5)


def test_moe_grouped_words_scales_ahead_equals_the_default_loop():
    # Dl 384 / F 256 at block_k 128: 3 and 2 K steps, so the scales carried a step ahead
    # (and the last step's unused in-bounds reload) are exercised in both kernels.
    x, topk_weights, topk_ids, weights = moe_case(24, 4, 2, 256, 384, seed=44)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, 25.0)
    knobs = dict(small_batch=False, words=True, block_m=16, block_n=32, block_k=128)
    u_loop = moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0, **knobs)
    u_ahead = moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                       scales_ahead=True, **knobs)
    assert_relative_close("u", u_ahead, expected, 1e-5)
    assert torch.equal(u_ahead, u_loop)


def test_moe_grouped_words_is_the_default_for_bf16_on_nvidia_at_128_pairs_per_block():
    bf16 = torch.bfloat16
    assert default_words(128, bf16, "cuda", False, False)
    assert not default_words(32, bf16, "cuda", False, False)          # not measured
    assert not default_words(128, torch.float32, "cuda", False, False)
    assert not default_words(128, bf16, "hip", False, False)
    assert not default_words(128, bf16, None, False, False)            # the interpreter
    assert not default_words(128, bf16, "cuda", True, False)           # dot_scaled
    assert not default_words(128, bf16, "cuda", False, True)           # fp8 down


def test_moe_grouped_words_rejects_what_it_lacks():
    x, topk_weights, topk_ids, weights = moe_case(2, 4, 2, 128, 128, seed=41)
    with pytest.raises(ValueError, match="takes neither use_dot_scaled nor fp8_down"):
        moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                 small_batch=False, words=True, fp8_down_activations=True)
    with pytest.raises(ValueError, match="must be multiples of block_n=96"):
        moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                 small_batch=False, words=True, block_n=96)


# bench_moe's grouped-words configurations at 4096 tokens: the default, the scales a K step
# ahead and the k256 variant.
GROUPED_WORDS_GPU = {
    "T4096-n128-k128-w8": (4096, dict(block_m=128, block_n=128, block_k=128, num_warps=8)),
    "T4096-n128-k128-w8-ahead": (4096, dict(block_m=128, block_n=128, block_k=128,
                                            num_warps=8, scales_ahead=True)),
    "T4096-n128-k256-w8-s2": (4096, dict(block_m=128, block_n=128, block_k=256, num_warps=8,
                                         num_stages=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GROUPED_WORDS_GPU.values(), ids=GROUPED_WORDS_GPU.keys())
def test_moe_grouped_words_proxy_shapes_gpu(case, proxy_case):
    num_tokens, knobs = case
    x, topk_weights, topk_ids, weights = proxy_case
    x, topk_weights, topk_ids = x[:num_tokens], topk_weights[:num_tokens], topk_ids[:num_tokens]
    z = x.bfloat16()
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    for one_factor_exact in (True, False):
        u = moe_experts_mxfp4_triton(z, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                     small_batch=False, words=True,
                                     one_factor_exact=one_factor_exact, **knobs)
        assert_relative_close(f"u (one_factor_exact={one_factor_exact})", u, expected, 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("scales_ahead", [False, True], ids=["loop", "ahead"])
def test_moe_grouped_words_fp32_is_exact_gpu(scales_ahead):
    x, topk_weights, topk_ids, weights = moe_case(200, 16, 4, 256, 512, seed=42)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, 25.0)
    u = moe_experts_mxfp4_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                 small_batch=False, words=True, one_factor_exact=True,
                                 scales_ahead=scales_ahead)
    assert_relative_close("u", u, expected, 1e-5)


@pytest.fixture(scope="module")
def proxy_case():
    """4096 tokens routed top-16 over the proxy's experts (64, F 3072, Dl 3584)."""
    return moe_case(4096, 64, 16, 3072, 3584, seed=43)
