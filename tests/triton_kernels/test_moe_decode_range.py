"""The MoE kernels' one-multiply MXFP4 decode and the scale range where it is exact
(atomk31/ops/moe.py: ONE_FACTOR_SCALE_BYTES, mxfp4_scales_allow_one_factor, one_factor_exact).

CPU (interpreter): the load-time flag at the range's edges; the model layer computes it once
and hands it to the op; the launchers pick the one-multiply decode only with the flag and BF16
activations, and the results equal the torch op either way (fp32 products on the interpreter:
1e-5); forcing the decode on weights outside the range breaks them (the range is not slack).
GPU (``-m gpu``): the PTX decodes on the proxy shapes. At top-1 every output element is one
program's store, so the two decodes of in-range weights must agree bit for bit; the engine's
tables (the flag from the weights) against the torch op with in-range and out-of-range
weights.
"""

from types import SimpleNamespace

import pytest
import torch

from atomk31.model.ffn import LatentMoE
from atomk31.ops.moe import (ONE_FACTOR_SCALE_BYTES, moe_experts_mxfp4_torch, moe_route_torch,
                             mxfp4_scales_allow_one_factor)
from atomk31.quant import quantize_mxfp4
from atomk31.triton_kernels import moe_gemv, moe_grouped_words
from atomk31.triton_kernels.moe_gemv import (GemvConfig, moe_experts_mxfp4_gemv_words_triton,
                                             pick_word_decode)
from atomk31.triton_kernels.moe_grouped_gemm import GroupedConfig
from atomk31.triton_kernels.moe_grouped_words import moe_experts_mxfp4_grouped_words_triton
from atomk31.triton_kernels.moe_mxfp4_decode import ONE_FACTOR_SHIFT
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def scale_bytes(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def test_one_factor_range_follows_the_kernels_shift():
    # Factor byte s + 126 - SHIFT <= 254 and lowest weight bit 2^(s - 128 - SHIFT) >= 2^-133.
    assert ONE_FACTOR_SCALE_BYTES == (ONE_FACTOR_SHIFT.value - 5, 128 + ONE_FACTOR_SHIFT.value)


@pytest.mark.parametrize("values,allowed", [((0, 59, 119, 192), True), ((120, 58), False),
                                            ((193,), False), ((1,), False), ((255,), False)],
                         ids=["edges-and-zero", "58", "193", "1", "nan-255"])
def test_mxfp4_scales_allow_one_factor_at_the_edges(values, allowed):
    inside = scale_bytes(120, 121)
    assert mxfp4_scales_allow_one_factor(inside, scale_bytes(*values)) is allowed


def test_mxfp4_scales_allow_one_factor_rejects_other_dtypes():
    with pytest.raises(ValueError, match="expected uint8 E8M0 scale bytes, got torch.float32"):
        mxfp4_scales_allow_one_factor(torch.zeros(3))


def test_pick_word_decode_takes_one_multiply_only_with_the_promise_and_bf16():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert pick_word_decode(bf16, "cuda", True) == "ptx_one_factor"
    assert pick_word_decode(bf16, "cuda", False) == "ptx"
    assert pick_word_decode(bf16, None, True) == "triton_one_factor"
    assert pick_word_decode(bf16, "hip", False) == "triton"
    assert pick_word_decode(fp32, "cuda", True) == "triton"   # fp32: exact


def engine_tables():
    """The engine's eager and graph tables on this GPU."""
    import atomk31.ops  # noqa: F401
    from atomk31.ops import KernelContext, Target, select_kernels

    return select_kernels("auto", KernelContext.default_for(Target.of_device(DEVICE)))


def expert_weights(num_experts, intermediate, latent, seed):
    generator = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * intermediate, latent, generator=generator) * 0.05
    w2 = torch.randn(num_experts, latent, intermediate, generator=generator) * 0.05
    return [t.to(DEVICE) for t in (*quantize_mxfp4(w13), *quantize_mxfp4(w2))]


def routed_inputs(num_tokens, latent, num_experts, top_k, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, latent, generator=generator)
    router = torch.randn(num_experts, latent, generator=generator) * 0.1
    bias = torch.zeros(num_experts)
    topk_weights, topk_ids = moe_route_torch(x, router, bias, top_k, True, 1.0)
    return x.to(DEVICE), topk_weights.to(DEVICE), topk_ids.to(DEVICE)


@pytest.fixture
def word_decodes(monkeypatch):
    """The word decodes the GEMV / grouped-words launchers picked, in call order."""
    picked = []

    def spy(dtype, backend, one_factor_exact):
        picked.append(pick_word_decode(dtype, backend, one_factor_exact))
        return picked[-1]
    monkeypatch.setattr(moe_gemv, "pick_word_decode", spy)
    monkeypatch.setattr(moe_grouped_words, "pick_word_decode", spy)
    return picked


# The BF16 word decode of this device: inline PTX on NVIDIA, plain Triton on the interpreter.
BF16_DECODE = "ptx" if DEVICE == "cuda" else "triton"
CASES = {"in-range": (None, True), "w2-byte-58": (58, False), "w2-byte-193": (193, False)}


def words_gemv(z, topk_weights, topk_ids, weights, one_factor_exact):
    return moe_experts_mxfp4_gemv_words_triton(z, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                               one_factor_exact=one_factor_exact,
                                               config=GemvConfig(block_n=32, block_k=128))


@pytest.mark.parametrize("outside,allowed", CASES.values(), ids=CASES.keys())
def test_moe_gemv_words_decode_follows_the_scales_and_matches_torch(outside, allowed,
                                                                    word_decodes):
    # One scale byte just outside the range anywhere (here in w2) sends the whole layer to
    # the exact decode. BF16 activations (the decode with a one-multiply form): the
    # interpreter multiplies in fp32 in one order, so in range the one-multiply result must
    # be the two-multiply one bit for bit; against the torch op, h's BF16 rounding (an h next
    # to a rounding point may round the other way) allows 1e-2. fp32 activations ignore the
    # flag and match the torch op to 1e-5.
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(4, 128, 256, seed=30)
    if outside is not None:
        w2_scales[1, 3, 0] = outside
    x, topk_weights, topk_ids = routed_inputs(3, 256, 4, 2, seed=31)
    flag = mxfp4_scales_allow_one_factor(w13_scales, w2_scales)
    assert flag is allowed
    weights = (w13_packed, w13_scales, w2_packed, w2_scales)
    z = x.bfloat16()
    u = words_gemv(z, topk_weights, topk_ids, weights, flag)
    two_factors = words_gemv(z, topk_weights, topk_ids, weights, False)
    u_fp32 = words_gemv(x, topk_weights, topk_ids, weights, flag)
    # Top-2: two fp32 atomic adds per u element, the same sum in either order.
    assert word_decodes == [BF16_DECODE + ("_one_factor" if allowed else ""), BF16_DECODE,
                            "triton"]
    assert torch.equal(u, two_factors)
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    assert_relative_close("u", u, expected, 1e-2)
    expected = moe_experts_mxfp4_torch(x, topk_weights, topk_ids, *weights, 4.0, 25.0)
    assert_relative_close("u (fp32)", u_fp32, expected, 1e-5)


def test_moe_registered_op_and_grouped_words_carry_the_flag(word_decodes):
    # The word-decode grouped GEMMs take the promise too (several pairs per expert block);
    # on the GPU the engine's table passes it down to the GEMVs.
    weights = expert_weights(4, 128, 256, seed=32)
    x, topk_weights, topk_ids = routed_inputs(5, 256, 4, 2, seed=33)
    z = x.bfloat16()
    config = GroupedConfig(16, 32, 128, num_warps=4)
    grouped = [moe_experts_mxfp4_grouped_words_triton(z, topk_weights, topk_ids, *weights, 4.0,
                                                      25.0, one_factor_exact=flag, config=config)
               for flag in (True, False)]
    assert word_decodes == [BF16_DECODE + "_one_factor", BF16_DECODE]
    assert torch.equal(grouped[0], grouped[1])
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    assert_relative_close("u (grouped words)", grouped[0], expected, 1e-2)
    if DEVICE == "cuda":      # the engine's tables: the word-decode GEMV on NVIDIA
        engine_tables().eager.moe_experts_mxfp4(z, topk_weights, topk_ids, *weights, 4.0,
                                                25.0, one_factor_exact=True)
        assert word_decodes[-1] == "ptx_one_factor"


def test_moe_one_factor_forced_outside_the_range_is_wrong():
    # The negative control: w2 scales of 2^-97 (byte 30) make every one-multiply weight
    # 2^-161 or smaller, below fp32's (and BF16's) smallest subnormal: all of w2 becomes 0.
    w13_packed, w13_scales, w2_packed, w2_scales = expert_weights(4, 128, 256, seed=34)
    w2_scales.fill_(30)
    x, topk_weights, topk_ids = routed_inputs(3, 256, 4, 2, seed=35)
    weights = (w13_packed, w13_scales, w2_packed, w2_scales)
    z = x.bfloat16()
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    assert_relative_close("u (two multiplies)", words_gemv(z, topk_weights, topk_ids, weights,
                                                           False), expected, 1e-2)
    forced = words_gemv(z, topk_weights, topk_ids, weights, True)
    assert forced.abs().max() == 0 and expected.abs().max() > 0


class OpSpy:
    """An op table for LatentMoE: routing by the torch op, experts recorded, zeros returned."""

    def __init__(self):
        self.expert_calls = []

    def moe_route(self, *args):
        return moe_route_torch(*args)

    def moe_experts_mxfp4(self, z, *args, **kwargs):
        self.expert_calls.append(kwargs)
        return torch.zeros(z.shape[0], z.shape[1])


def latent_moe_tensors(num_experts: int, hidden: int, intermediate: int, outside: int | None):
    prefix = "layer.block_sparse_moe."
    generator = torch.Generator().manual_seed(36)
    tensors = {prefix + "gate.weight": torch.randn(num_experts, hidden, generator=generator),
               prefix + "gate.e_score_correction_bias": torch.zeros(num_experts)}
    for e in range(num_experts):
        for name, shape in (("w1", (intermediate, hidden)), ("w3", (intermediate, hidden)),
                            ("w2", (hidden, intermediate))):
            packed, scales = quantize_mxfp4(torch.randn(*shape, generator=generator) * 0.05)
            tensors[f"{prefix}experts.{e}.{name}.weight_packed"] = packed
            tensors[f"{prefix}experts.{e}.{name}.weight_scale"] = scales
    if outside is not None:
        tensors[f"{prefix}experts.1.w3.weight_scale"][0, 0] = outside
    return tensors


@pytest.mark.parametrize("outside,allowed", [(None, True), (200, False)],
                         ids=["in-range", "w3-byte-200"])
def test_latent_moe_computes_the_flag_once_and_passes_it(outside, allowed):
    from atomk31.model.weights import WeightSource

    config = SimpleNamespace(num_experts_per_token=2, moe_renormalize=True,
                             routed_scaling_factor=1.0, activation_situ_beta=4.0,
                             activation_situ_linear_beta=25.0, rms_norm_eps=1e-6,
                             routed_expert_hidden_size=None, latent_moe_use_norm=False,
                             num_shared_experts=0, num_experts=3, moe_intermediate_size=32)
    weights = WeightSource(latent_moe_tensors(3, 64, 32, outside), torch.float32,
                           torch.device("cpu"))
    ops = OpSpy()
    layer = LatentMoE(config, weights, "layer.")
    assert layer.one_factor_exact is allowed
    layer.forward(torch.randn(2, 64), ops)
    assert ops.expert_calls == [{"one_factor_exact": allowed}]


@pytest.fixture(scope="module")
def proxy_weights():
    """The proxy's experts (64, F 3072, Dl 3584) in MXFP4 on the GPU (scale bytes near 120)."""
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    w13 = torch.randn(64, 2 * 3072, 3584, generator=generator, device=DEVICE) * 0.05
    w2 = torch.randn(64, 3584, 3072, generator=generator, device=DEVICE) * 0.05
    return [*quantize_mxfp4(w13), *quantize_mxfp4(w2)]


def proxy_routing(num_tokens: int, top_k: int):
    generator = torch.Generator(device=DEVICE).manual_seed(6)
    x = torch.randn(num_tokens, 3584, generator=generator, device=DEVICE)
    router = torch.randn(64, 3584, generator=generator, device=DEVICE) * 0.1
    topk_weights, topk_ids = moe_route_torch(x, router, torch.zeros(64, device=DEVICE), top_k,
                                             True, 1.0)
    return x.bfloat16(), topk_weights, topk_ids


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 16, 64], ids=lambda n: f"T{n}")
def test_moe_gemv_one_factor_equals_two_factors_bitwise_gpu(num_tokens, proxy_weights):
    # Top-1 (and routing weights 1): every u element is one down program's only atomic add,
    # so the result is deterministic; the one-multiply weights are the two-multiply weights
    # times 2^-64 exactly, and so are the fp32 sums (no subnormal partial sums here).
    assert mxfp4_scales_allow_one_factor(proxy_weights[1], proxy_weights[3])
    z, topk_weights, topk_ids = proxy_routing(num_tokens, 1)
    one, two = (moe_experts_mxfp4_gemv_words_triton(z, topk_weights, topk_ids, *proxy_weights,
                                                    4.0, 25.0, one_factor_exact=flag)
                for flag in (True, False))
    assert torch.equal(one, two)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,outside", [(1, None), (4, None), (64, None), (4, 58),
                                                (300, None)],
                         ids=["T1", "T4", "T64", "T4-byte-58", "T300"])
def test_moe_registered_op_default_decode_gpu(num_tokens, outside, proxy_weights):
    # The engine's call: the flag from the weights (once), the tables' implementations.
    w13_packed, w13_scales, w2_packed, w2_scales = proxy_weights
    if outside is not None:
        w13_scales = w13_scales.clone()
        w13_scales[0, 0, 0] = outside
    weights = (w13_packed, w13_scales, w2_packed, w2_scales)
    flag = mxfp4_scales_allow_one_factor(w13_scales, w2_scales)
    assert flag is (outside is None)
    z, topk_weights, topk_ids = proxy_routing(num_tokens, 16)
    expected = moe_experts_mxfp4_torch(z, topk_weights, topk_ids, *weights, 4.0, 25.0)
    for table in (engine_tables().eager, engine_tables().graph):
        u = table.moe_experts_mxfp4(z, topk_weights, topk_ids, *weights, 4.0, 25.0,
                                    one_factor_exact=flag)
        assert_relative_close(f"u ({table.step})", u, expected, 1e-2)
