"""Triton MoE routing, expert sort, small-batch MXFP4 GEMVs and byte-decode grouped GEMMs vs the
torch ops (the word-decode grouped GEMMs: test_moe_grouped_words.py).

CPU: Triton's interpreter at small shapes (fp32 activations), the GEMVs in each mode; GPU
(``-m gpu``): the proxy's shapes (latent 3584, intermediate 3072, 64 experts, top-16) with BF16
activations, and fp32 activations held to 1e-5, each implementation the registry may choose
for ``moe_experts_mxfp4`` on its own and through the engine's tables.
"""

import pytest
import torch
import triton
import triton.language as tl


from atomk31.ops.moe import moe_experts_mxfp4_torch, moe_route_torch
from atomk31.quant import quantize_mxfp4
from atomk31.triton_kernels.moe_gemv import (GemvConfig, moe_experts_mxfp4_gemv_triton,
                                             moe_experts_mxfp4_gemv_words_triton, to_words_order)
from atomk31.triton_kernels.moe_gemv_tiles import words_order
from atomk31.triton_kernels.moe_grouped_gemm import (GroupedConfig, grouped_tiles,
                                                     moe_experts_mxfp4_grouped_triton)
from atomk31.triton_kernels.moe_routing import RouteConfig, moe_route_triton, sort_pairs_by_expert
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def router_inputs(num_tokens, hidden, num_experts, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=generator)
    weight = torch.randn(num_experts, hidden, generator=generator) * 0.1
    bias = torch.randn(num_experts, generator=generator) * 0.05
    return x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE)


ROUTER_LOGITS = {name: RouteConfig(name) for name in ("fused", "gemm", "split")}


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 16, 4), (7, 100, 16)],
                         ids=["T1-E16-k4", "T7-E100-k16"])
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("router", ROUTER_LOGITS.values(), ids=ROUTER_LOGITS.keys())
def test_moe_route_triton_matches_torch(num_tokens, num_experts, top_k, renormalize, router):
    # D = 200: not a multiple of the fused kernel's D block nor of the split kernel's.
    x, weight, bias = router_inputs(num_tokens, 200, num_experts, seed=num_experts)
    expected_w, expected_ids = moe_route_torch(x, weight, bias, top_k, renormalize, 2.5)
    w, ids = moe_route_triton(x, weight, bias, top_k, renormalize, 2.5, router)
    assert torch.equal(ids, expected_ids)
    assert_relative_close("weights", w, expected_w, 1e-6)


def test_moe_route_triton_ties_go_to_lower_expert_id():
    x, weight, bias = router_inputs(3, 32, 8, seed=1)
    weight[5], bias[5] = weight[2], bias[2]                    # experts 2 and 5 always tie
    weight[2] += 10 * x.mean(0)                                # ... and rank high
    weight[5] = weight[2]
    _, expected_ids = moe_route_torch(x, weight, bias, 4, True, 1.0)
    for router in ROUTER_LOGITS.values():
        _, ids = moe_route_triton(x, weight, bias, 4, True, 1.0, router)
        assert torch.equal(ids, expected_ids)
    assert ((ids == 2).int().argmax(1) < (ids == 5).int().argmax(1)).all()


def test_moe_route_triton_refuses_an_unknown_way_to_form_the_logits():
    x, weight, bias = router_inputs(2, 32, 8, seed=1)
    with pytest.raises(ValueError, match="RouteConfig.logits must be one of"):
        moe_route_triton(x, weight, bias, 2, True, 1.0, RouteConfig("cublas"))


def test_sort_pairs_by_expert_pads_each_expert_to_the_block():
    topk_ids = torch.tensor([[3, 0], [3, 1], [0, 3]], dtype=torch.int32, device=DEVICE)
    blocks = sort_pairs_by_expert(topk_ids, num_experts=5, block_m=2)
    pairs, experts = blocks.pair_ids.tolist(), blocks.block_expert.tolist()
    # expert 0: pairs 1, 4; expert 1: pair 3 (+ pad 6); expert 3: pairs 0, 2, 5 (+ pad).
    assert pairs[:8] == [1, 4, 3, 6, 0, 2, 5, 6]
    assert experts[:4] == [0, 1, 3, 3] and all(e == 5 for e in experts[4:])


def expert_weights(num_experts, intermediate, latent, seed):
    # Drawn and quantized on the test device: the proxy's 64 experts are 2 G values.
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * intermediate, latent, generator=generator,
                      device=DEVICE) * 0.05
    w2 = torch.randn(num_experts, latent, intermediate, generator=generator, device=DEVICE) * 0.05
    return [*quantize_mxfp4(w13), *quantize_mxfp4(w2)]


@pytest.mark.parametrize("num_tokens,linear_beta", [(1, 25.0), (6, None)],
                         ids=["T1-capped", "T6-uncapped"])
def test_moe_experts_mxfp4_triton_grouped_matches_torch(num_tokens, linear_beta):
    num_experts, top_k = 8, 3
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(num_experts, 128, 256, seed=2)
    x, router, bias = router_inputs(num_tokens, 256, num_experts, seed=3)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, top_k, True, 1.0)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, linear_beta)
    u = moe_experts_mxfp4_grouped_triton(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                         w2_packed, w2_scales, 4.0, linear_beta)
    assert_relative_close("u", u, expected, 1e-5)


def test_moe_grouped_tiles_follow_the_pairs_per_expert():
    """16 / 32 rows up to 32 pairs per expert (the small groups), 128 above; the byte decode's
    128 x 64 weight tiles at 128 rows, the word decode's 128 x 128 on 8 warps."""
    assert grouped_tiles(16 * 16, 64, words=False) == GroupedConfig(16, 64, 128, 4)
    assert grouped_tiles(128 * 16, 64, words=False) == GroupedConfig(32, 64, 128, 4)
    assert grouped_tiles(4096 * 16, 64, words=False) == GroupedConfig(128, 128, 64, 8)
    assert grouped_tiles(4096 * 16, 64, words=True) == GroupedConfig(128, 128, 128, 8)


@pytest.mark.parametrize("num_tokens,mode,linear_beta",
                         [(1, "fma", 25.0), (3, "fma", None), (2, "dot_t", 25.0),
                          (3, "dot_t", None), (1, "dot_t_words", 25.0)],
                         ids=["T1-fma-capped", "T3-fma-uncapped", "T2-dot_t-capped",
                              "T3-dot_t-uncapped", "T1-dot_t_words-capped"])
def test_moe_experts_mxfp4_gemv_matches_torch(num_tokens, mode, linear_beta):
    # 8 experts, top-3: most experts get no token (their programs exit early); at 1 and 2
    # tokens fewer slots than experts (programs per slot). Dl = 192: not a multiple of 128.
    num_experts, top_k = 8, 3
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(num_experts, 64, 192, seed=9)
    x, router, bias = router_inputs(num_tokens, 192, num_experts, seed=10)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, top_k, True, 1.0)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, linear_beta)
    u = moe_experts_mxfp4_gemv_triton(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                      w2_packed, w2_scales, 4.0, linear_beta,
                                      config=GemvConfig(mode=mode, block_n=32, block_k=64))
    assert_relative_close("u", u, expected, 1e-5)


@pytest.mark.parametrize("num_tokens,block_k,dtype",
                         [(2, 128, torch.float32), (3, 256, torch.bfloat16)],
                         ids=["T2-k128-fp32", "T3-k256-bf16"])
def test_moe_experts_mxfp4_gemv_words_matches_torch(num_tokens, block_k, dtype):
    # Word order spans whole K tiles of 128 / 256 inputs (4 / 8 words per lane); scales from
    # 2^-30 to 2^33 (E8M0 97..160): past 2^1, one BF16 factor 2^(s-1) would overflow.
    num_experts, top_k = 4, 2
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(num_experts, block_k, 256,
                                                                  seed=20)
    generator = torch.Generator().manual_seed(21)
    w13_scales = torch.randint(97, 161, w13_scales.shape, generator=generator).to(
        torch.uint8).to(DEVICE)
    x, router, bias = router_inputs(num_tokens, 256, num_experts, seed=22)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, top_k, True, 1.0)
    z = (x * 2.0 ** -20).to(dtype)                          # h stays finite with these scales
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, 25.0)
    u = moe_experts_mxfp4_gemv_words_triton(z, topk_weights, topk_ids, w13_packed, w13_scales,
                                            w2_packed, w2_scales, 4.0, 25.0,
                                            config=GemvConfig(block_n=64, block_k=block_k))
    assert_relative_close("u", u, expected, 1e-5 if dtype == torch.float32 else 1e-2)


GATHER_CASES = {"T40-E4-k2-words-bm16": (40, 4, 2, "dot_t_words", 16, 128, 128, 256),
                "T1-E8-k3-fma-by_slot": (1, 8, 3, "fma", None, 64, 64, 128),
                "T5-E8-k3-fma-bm2": (5, 8, 3, "fma", 2, 64, 64, 128)}


@pytest.mark.parametrize("case", GATHER_CASES.values(), ids=GATHER_CASES.keys())
def test_moe_experts_mxfp4_gemv_gathered_rows_match_torch(case):
    # Gathered rows: a program multiplies its expert's own tokens, block_m at a time. 40
    # tokens x top-2 over 4 experts is ~20 tokens per expert: two chunks of 16 (the second
    # partly masked); block_m=2: up to 2 chunks (5 tokens: experts of 0 to 4 tokens); 1
    # token: programs per slot.
    num_tokens, num_experts, top_k, mode, block_m, block_k, intermediate, latent = case
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(num_experts, intermediate,
                                                                  latent, seed=23)
    x, router, bias = router_inputs(num_tokens, latent, num_experts, seed=24)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, top_k, True, 1.0)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, 25.0)
    config = GemvConfig(mode=mode, block_n=32, block_k=block_k, gather_rows=True,
                        block_m=block_m)
    u = moe_experts_mxfp4_gemv_triton(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                      w2_packed, w2_scales, 4.0, 25.0, config=config)
    assert_relative_close("u", u, expected, 1e-5)


@triton.jit
def words_positions_kernel(out_ptr, BLOCK_K: tl.constexpr, SIZE: tl.constexpr):
    o_k = tl.arange(0, SIZE)
    tl.store(out_ptr + o_k, words_order(o_k, BLOCK_K))


def test_moe_gemv_words_order_matches_the_launchers_permutation():
    # The kernel's words_order (where input k goes) and to_words_order (the activations'
    # permutation) must agree, else the products pair weights with the wrong inputs.
    for block_k in (32, 64, 128, 256):
        size = 2 * block_k
        positions = torch.empty(size, dtype=torch.int32, device=DEVICE)
        words_positions_kernel[(1,)](positions, BLOCK_K=block_k, SIZE=size)
        inputs = torch.arange(size, device=DEVICE, dtype=torch.float32)[None]
        permuted = to_words_order(inputs, block_k)[0]
        assert torch.equal(permuted[positions.long()], inputs[0]), f"block_k={block_k}"


def test_moe_experts_mxfp4_gemv_programs_per_slot_share_experts():
    # 2 tokens x 3 slots < 16 experts: programs per slot; experts 5 and 2 appear twice and
    # must be computed once each (a second owner would add their down projection twice).
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(16, 128, 128, seed=14)
    x, _, _ = router_inputs(2, 128, 16, seed=15)
    topk_ids = torch.tensor([[0, 5, 2], [5, 2, 9]], dtype=torch.int32, device=DEVICE)
    topk_weights = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], device=DEVICE)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, 25.0)
    # Slot ownership does not depend on the mode: one mode.
    u = moe_experts_mxfp4_gemv_triton(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                      w2_packed, w2_scales, 4.0, 25.0,
                                      config=GemvConfig(mode="fma", block_n=32, block_k=64))
    assert_relative_close("u", u, expected, 1e-5)


def test_moe_experts_mxfp4_gemv_rejects_large_batches_and_odd_blocks():
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(2, 128, 128, seed=13)
    ids = torch.zeros(65, 1, dtype=torch.int32, device=DEVICE)
    z = torch.zeros(65, 128, device=DEVICE)
    with pytest.raises(ValueError, match="at most 64 tokens, got 65"):
        moe_experts_mxfp4_gemv_triton(z, ids.float(), ids, w13_packed, w13_scales, w2_packed,
                                      w2_scales, 4.0, 25.0)
    one = (z[:1], ids[:1].float(), ids[:1], w13_packed, w13_scales, w2_packed, w2_scales, 4.0,
           25.0)
    with pytest.raises(ValueError, match="must be multiples of block_n=96"):
        moe_experts_mxfp4_gemv_triton(*one, config=GemvConfig(block_n=96))
    with pytest.raises(ValueError, match="block_m is for gathered rows only"):
        moe_experts_mxfp4_gemv_triton(*one, config=GemvConfig(block_m=16))
    with pytest.raises(ValueError, match="at most 64 tokens, got 65"):
        moe_experts_mxfp4_gemv_triton(z, ids.float(), ids, w13_packed, w13_scales, w2_packed,
                                      w2_scales, 4.0, 25.0, config=GemvConfig(gather_rows=True))
    with pytest.raises(ValueError, match="mode must be one of"):
        moe_experts_mxfp4_gemv_triton(*one, config=GemvConfig(mode="dot"))


def test_moe_experts_mxfp4_triton_empty_batch_and_what_the_kernels_refuse():
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(4, 128, 128, seed=4)
    z = torch.zeros(0, 128, device=DEVICE)
    ids = torch.zeros(0, 2, dtype=torch.int32, device=DEVICE)
    u = moe_experts_mxfp4_grouped_triton(z, ids.float(), ids, w13_packed, w13_scales, w2_packed,
                                         w2_scales, 4.0, 25.0)
    assert u.shape == (0, 128)
    with pytest.raises(ValueError, match="must be contiguous; pass tensor.contiguous"):
        moe_experts_mxfp4_grouped_triton(z, ids.float(), ids, w13_packed, w13_scales,
                                         w2_packed.transpose(1, 2).contiguous().transpose(1, 2),
                                         w2_scales, 4.0, 25.0)
    small = expert_weights(4, 64, 192, seed=4)
    with pytest.raises(ValueError, match="Dl and F must be multiples of 128"):
        moe_experts_mxfp4_grouped_triton(torch.zeros(0, 192, device=DEVICE), ids.float(), ids,
                                         *small, 4.0, 25.0)


@pytest.fixture(scope="module")
def proxy_weights():
    """The proxy's experts (64, F 3072, Dl 3584) in MXFP4, built once for the GPU tests."""
    return expert_weights(64, 3072, 3584, seed=5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 16, 64, 100, 300], ids=lambda n: f"T{n}")
def test_moe_experts_mxfp4_through_the_engines_tables_proxy_shapes_gpu(num_tokens,
                                                                       proxy_weights):
    """Routing (every way of forming the logits) and the experts as the engine's eager and
    graph tables run them on this GPU (1-64 tokens: the GEMVs; 100: 25 pairs per expert, the
    small groups; 300: the large groups), BF16 activations against the torch op."""
    import atomk31.ops  # noqa: F401
    from atomk31.ops import KernelContext, Target, select_kernels

    kernels = select_kernels("auto", KernelContext.default_for(Target.of_device("cuda")))
    x, router, bias = router_inputs(num_tokens, 3584, 64, seed=6)
    expected_w, expected_ids = moe_route_torch(x, router, bias, 16, True, 1.0)
    for logits in ROUTER_LOGITS.values():
        w, ids = moe_route_triton(x, router, bias, 16, True, 1.0, logits)
        assert torch.equal(ids, expected_ids), logits
        assert_relative_close(f"weights ({logits})", w, expected_w, 1e-6)
    z = x.bfloat16()
    expected = moe_experts_mxfp4_torch(z, expected_w, expected_ids, *proxy_weights, 4.0, 25.0)
    for table in (kernels.eager, kernels.graph):
        u = table.moe_experts_mxfp4(z, expected_w, expected_ids, *proxy_weights, 4.0, 25.0)
        # BF16 products vs fp32 products of the same BF16 activations; SiTU output BF16 in
        # both.
        assert_relative_close(f"u ({table.step})", u, expected, 1e-2)


# The GEMV modes at the batch sizes where they matter: "dot_t_words" the BF16 GEMV on NVIDIA
# (1 token: programs per slot; 4: the one-multiply decode; 64: gathered rows), "fma" / "dot_t"
# the portable GEMV's (1 / 16 tokens).
GEMV_MODES_GPU = [(1, "dot_t_words"), (4, "dot_t_words"), (64, "dot_t_words"), (1, "fma"),
                  (16, "dot_t")]


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,mode", GEMV_MODES_GPU, ids=lambda v: str(v))
def test_moe_experts_mxfp4_gemv_proxy_shapes_gpu(num_tokens, mode, proxy_weights):
    w13_packed, w13_scales, w2_packed, w2_scales = proxy_weights
    x, router, bias = router_inputs(num_tokens, 3584, 64, seed=6)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, 16, True, 1.0)
    one_factor = mode == "dot_t_words" and num_tokens == 4
    for z, tolerance in ((x.bfloat16(), 1e-2), (x, 1e-5)):     # BF16, then exact fp32
        expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, w13_packed, w13_scales,
                                           w2_packed, w2_scales, 4.0, 25.0)
        u = moe_experts_mxfp4_gemv_triton(z, topk_weights, topk_ids, w13_packed, w13_scales,
                                          w2_packed, w2_scales, 4.0, 25.0,
                                          one_factor_exact=one_factor,
                                          config=GemvConfig(mode=mode))
        assert_relative_close(f"u ({z.dtype})", u, expected, tolerance)


# The GEMV configurations bench_moe times besides the defaults (64 tokens), with the
# one-multiply decode the bench gives them (these weights' scale bytes allow it).
WORDS_CONFIGS_GPU = {
    "T64-gather-n128-k256-w8-s2": (64, GemvConfig(block_n=128, block_k=256, num_warps=8,
                                                  num_stages=2, gather_rows=True, block_m=32)),
    # ~half of the experts get more than 16 of the 64 tokens: two chunks.
    "T64-gather-bm16-k256-s2-r128": (64, GemvConfig(block_n=64, block_k=256, num_stages=2,
                                                    gather_rows=True, block_m=16,
                                                    max_registers=128)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", WORDS_CONFIGS_GPU.values(), ids=WORDS_CONFIGS_GPU.keys())
def test_moe_experts_mxfp4_gemv_words_configs_gpu(case, proxy_weights):
    num_tokens, config = case
    x, router, bias = router_inputs(num_tokens, 3584, 64, seed=6)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, 16, True, 1.0)
    z = x.bfloat16()
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *proxy_weights, 4.0, 25.0)
    u = moe_experts_mxfp4_gemv_words_triton(z, topk_weights, topk_ids, *proxy_weights, 4.0,
                                            25.0, one_factor_exact=True, config=config)
    assert_relative_close("u", u, expected, 1e-2)


@pytest.mark.gpu
def test_moe_experts_mxfp4_triton_grouped_fp32_is_exact_gpu():
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(16, 256, 512, seed=7)
    x, router, bias = router_inputs(40, 512, 16, seed=8)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, 4, True, 1.0)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                       w2_packed, w2_scales, 4.0, 25.0)
    u = moe_experts_mxfp4_grouped_triton(x, topk_weights, topk_ids, w13_packed, w13_scales,
                                         w2_packed, w2_scales, 4.0, 25.0)
    assert_relative_close("u", u, expected, 1e-5)
