"""The word-decode grouped MoE GEMMs (atomk31/triton_kernels/moe_grouped_words.py) vs the torch op.

CPU: the interpreter at small shapes, several expert blocks per expert and partly filled
blocks, fp32 activations held to 1e-5. GPU (``-m gpu``): the proxy's shapes at the
configurations bench_moe times (BF16, 1e-2: h rounded to BF16 on both sides; the engine's
tables take it at 300 tokens on NVIDIA: test_moe.py, test_moe_decode_range.py) and fp32
exact.
"""

import pytest
import torch

from atomk31.ops.moe import moe_experts_mxfp4_torch, moe_route_torch
from atomk31.quant import quantize_mxfp4
from atomk31.triton_kernels.moe_grouped_gemm import GroupedConfig
from atomk31.triton_kernels.moe_grouped_words import moe_experts_mxfp4_grouped_words_triton
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
    u = moe_experts_mxfp4_grouped_words_triton(
        x, topk_weights, topk_ids, *weights, 4.0, linear_beta,
        config=GroupedConfig(block_m, 32, 128, num_warps=4))
    assert_relative_close("u", u, expected, 1e-5)


def test_moe_grouped_words_carries_the_scales_a_step_ahead():
    # Dl 384 / F 256 at block_k 128: 3 and 2 K steps, so the scales carried a step ahead
    # (and the last step's unused in-bounds reload) are exercised in both kernels.
    x, topk_weights, topk_ids, weights = moe_case(24, 4, 2, 256, 384, seed=44)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, 25.0)
    u = moe_experts_mxfp4_grouped_words_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                               config=GroupedConfig(16, 32, 128, num_warps=4))
    assert_relative_close("u", u, expected, 1e-5)


def test_moe_grouped_words_rejects_tiles_that_do_not_divide_the_widths():
    x, topk_weights, topk_ids, weights = moe_case(2, 4, 2, 128, 128, seed=41)
    with pytest.raises(ValueError, match="must be multiples of block_n=96"):
        moe_experts_mxfp4_grouped_words_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                               config=GroupedConfig(16, 96, 128, num_warps=4))


# bench_moe's grouped-words configurations at 4096 tokens: the default and the k256 variant.
GROUPED_WORDS_GPU = {
    "T4096-n128-k128-w8": (4096, None),
    "T4096-n128-k256-w8-s2": (4096, GroupedConfig(128, 128, 256, num_warps=8, num_stages=2)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GROUPED_WORDS_GPU.values(), ids=GROUPED_WORDS_GPU.keys())
def test_moe_grouped_words_proxy_shapes_gpu(case, proxy_case):
    num_tokens, config = case
    x, topk_weights, topk_ids, weights = proxy_case
    x, topk_weights, topk_ids = x[:num_tokens], topk_weights[:num_tokens], topk_ids[:num_tokens]
    z = x.bfloat16()
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    for one_factor_exact in (True, False):
        u = moe_experts_mxfp4_grouped_words_triton(z, topk_weights, topk_ids, *weights, 4.0,
                                                   25.0, one_factor_exact=one_factor_exact,
                                                   config=config)
        assert_relative_close(f"u (one_factor_exact={one_factor_exact})", u, expected, 1e-2)


@pytest.mark.gpu
def test_moe_grouped_words_fp32_is_exact_gpu():
    x, topk_weights, topk_ids, weights = moe_case(200, 16, 4, 256, 512, seed=42)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, 25.0)
    u = moe_experts_mxfp4_grouped_words_triton(x, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                               one_factor_exact=True)
    assert_relative_close("u", u, expected, 1e-5)


@pytest.fixture(scope="module")
def proxy_case():
    """4096 tokens routed top-16 over the proxy's experts (64, F 3072, Dl 3584)."""
    return moe_case(4096, 64, 16, 3072, 3584, seed=43)
