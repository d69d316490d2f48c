"""Linear ops (MODEL_SPEC §6.5): the BF16 linear and the PTPC-FP8 scaled linear (torch)."""

import pytest
import torch

from atomk31.ops.linear import (
    linear_torch, ptpc_linear_quantized_torch, ptpc_linear_torch, ptpc_quantize_torch,
)
from atomk31.quant.ptpc import quantize_weight_ptpc
from assertions import assert_relative_close


def test_linear_torch_is_x_times_w_transposed():
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 5, generator=generator), torch.randn(4, 5, generator=generator)
    assert_relative_close("y", linear_torch(x, w), torch.einsum("abk,nk->abn", x, w), 1e-6)
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\] and weight \[N, K\]"):
        linear_torch(x, w.T)


@pytest.mark.parametrize("fp8_dtype,fmax", [(torch.float8_e4m3fn, 448.0),
                                            (torch.float8_e4m3fnuz, 240.0)], ids=["fn", "fnuz"])
def test_ptpc_quantize_torch_per_token_scale(fp8_dtype, fmax):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 37, generator=generator) * torch.tensor([1.0, 100.0, 1e-3, 0.0])[:, None]
    q, scale = ptpc_quantize_torch(x, fp8_dtype)
    assert torch.equal(scale, x.abs().amax(1).clamp_min(1e-12) / fmax)
    assert q.dtype == fp8_dtype and q[:3].float().abs().amax(1).eq(fmax).all()
    assert torch.equal(q[3].float(), torch.zeros(37))
    with pytest.raises(ValueError, match="fp8_dtype must be torch.float8_e4m3fn or"):
        ptpc_quantize_torch(x, torch.bfloat16)


def test_ptpc_linear_torch_matches_float64_formula():
    generator = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 64, generator=generator), torch.randn(10, 64, generator=generator)
    w_q, w_scale = quantize_weight_ptpc(w)
    x_q, x_scale = ptpc_quantize_torch(x)
    y = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    expected = (x_q.double() @ w_q.double().T) * x_scale.double()[:, None] * w_scale.double()
    assert_relative_close("y", y, expected, 1e-6)
    assert_relative_close("ptpc_linear", ptpc_linear_torch(x, w_q, w_scale), y, 1e-6)
    assert_relative_close("vs the BF16 linear", y, x @ w.T, 0.1)   # FP8 is coarse but close
    with pytest.raises(ValueError, match=r"expected x_q \[\.\.\., K\], x_scale \[\.\.\.\]"):
        ptpc_linear_quantized_torch(x_q, x_scale[:2], w_q, w_scale)


@pytest.mark.parametrize("rows, out_features, in_features, expected", [
    (1, 7168, 12288, "few_rows"),           # decode
    (127, 36864, 7168, "few_rows"),
    (128, 576, 7168, "narrow"),             # kv_a: 576 columns
    (4096, 1023, 7168, "narrow"),
    (128, 7168, 12288, "small_gemm"),       # o_proj at 128 tokens: 2.3e10 FLOP
    (1024, 24576, 512, "small_gemm"),       # kv_b: 2.6e10
    (128, 36864, 7168, "large_gemm"),       # kda qkv: 6.8e10
    (4096, 7168, 12288, "large_gemm"),      # o_proj prefill
])
def test_ptpc_shape_classes_by_the_calls_own_shapes(rows, out_features, in_features, expected):
    from atomk31.ops.linear import ptpc_linear_quantized_shape, ptpc_linear_shape, ptpc_shape

    assert ptpc_shape(rows, out_features, in_features) == expected
    w = torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device="meta")
    x = torch.empty(2, rows // 2, in_features, device="meta") if rows % 2 == 0 else \
        torch.empty(rows, in_features, device="meta")
    assert ptpc_linear_shape(x, w, None) == expected                # leading dims: rows
    assert ptpc_linear_quantized_shape(x, None, w, None) == expected


def test_ptpc_checks_refuse_mismatched_shapes_and_dtypes():
    from atomk31.ops.linear import check_ptpc_linear, check_ptpc_linear_quantized

    x = torch.zeros(3, 64)
    w = torch.zeros(8, 64, dtype=torch.float8_e4m3fn)
    check_ptpc_linear(x, w, torch.ones(8))
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\], w_fp8 \[N, K\]"):
        check_ptpc_linear(x, w[:, :32], torch.ones(8))
    with pytest.raises(ValueError, match="fp8_dtype must be torch.float8_e4m3fn or"):
        check_ptpc_linear(x, w.bfloat16(), torch.ones(8))
    x_q = x.to(torch.float8_e4m3fnuz)
    with pytest.raises(ValueError, match="x_q and w_fp8 must share their FP8 dtype"):
        check_ptpc_linear_quantized(x_q, torch.ones(3), w, torch.ones(8))


def test_the_hopper_target_takes_the_gluon_kernel_for_many_rows_only():
    """sm_90's tables (no such GPU needed): the pointer kernel for few rows and narrow outputs,
    the Gluon kernel for the other many-row GEMMs in graph steps, and in eager steps only where
    the GEMM outweighs the Gluon launch's host time."""
    import atomk31.ops  # noqa: F401  (registers every implementation)
    from atomk31.ops import KernelContext, Target, select_kernels

    kernels = select_kernels("auto", KernelContext.default_for(Target.named("sm90")))
    for op in ("ptpc_linear", "ptpc_linear_quantized"):
        for step, table in (("eager", kernels.eager), ("graph", kernels.graph)):
            targets = {shape: table.choice(op, shape).target
                       for shape in ("few_rows", "narrow", "small_gemm", "large_gemm")}
            gluon_small = "hopper" if step == "graph" else "triton"
            assert targets == {"few_rows": "triton", "narrow": "triton",
                               "small_gemm": gluon_small, "large_gemm": "hopper"}, (op, step)
    skipped = kernels.eager.choice("ptpc_linear", "small_gemm").skipped[0]
    assert skipped.target == "hopper" and "host time" in skipped.reason
    for target in ("gfx950", "gfx942", "sm80"):
        table = select_kernels("auto", KernelContext.default_for(Target.named(target))).graph
        assert table.choice("ptpc_linear", "large_gemm").target == "triton", target


@pytest.mark.gpu
@pytest.mark.parametrize("rows, out_features, in_features", [
    (5, 7168, 1536), (200, 576, 1536), (128, 7168, 6144), (1024, 12288, 7168)],
    ids=["few_rows", "narrow", "small_gemm", "large_gemm"])
def test_ptpc_linear_through_the_engines_tables_gpu(rows, out_features, in_features):
    """What the engine's eager and graph tables run on this GPU for each shape class (on an
    H200 the Gluon kernel in three of the eight), against the torch op: within BF16
    rounding of both."""
    import atomk31.ops  # noqa: F401
    from atomk31.ops import KernelContext, Target, select_kernels

    kernels = select_kernels("auto", KernelContext.default_for(Target.of_device("cuda")))
    generator = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, in_features, device="cuda", generator=generator).bfloat16()
    w_q, w_scale = quantize_weight_ptpc(torch.randn(out_features, in_features, device="cuda",
                                                    generator=generator).bfloat16())
    expected = ptpc_linear_torch(x, w_q, w_scale).float()
    for table in (kernels.eager, kernels.graph):
        y = table.ptpc_linear(x, w_q, w_scale)
        error = ((y.float() - expected).abs().max() / expected.abs().max()).item()
        assert y.dtype == torch.bfloat16 and error <= 2 ** -7, (table.step, error)
