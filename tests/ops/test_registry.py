"""ops registry: registration rules, backend selection and fallback notes (DESIGN.md §3)."""

import pytest
import torch

import atomk31.ops as ops
from atomk31.ops.registry import OpRegistry, OpTable, OpUnavailableError, resolve_backend

ENGINE_OPS = {
    "rms_norm", "gated_rms_norm", "layer_norm", "situ_glu", "attn_res", "moe_route",
    "moe_experts_mxfp4", "moe_experts_dense", "kda_gate", "short_conv_silu",
    "conv_state_after", "kda_prefill", "kda_decode", "kda_verify",
}


def torch_double(x):
    return 2 * x


def triton_double(x):
    return 20 * x


def amd_double(x):
    return 200 * x


def needs_gpu(device: torch.device) -> str | None:
    return None if device.type == "cuda" else "needs a CUDA or ROCm GPU"


def fake_registry() -> OpRegistry:
    registry = OpRegistry()
    registry.register("double", "torch", torch_double)
    registry.register("double", "triton", triton_double, needs_gpu)
    registry.register("double", "amd", amd_double, needs_gpu)
    registry.register("only_torch", "torch", torch_double)
    return registry


def test_select_torch_on_cpu_uses_torch_without_note():
    table = fake_registry().select_ops("torch", torch.device("cpu"))
    assert table.double(1) == 2
    assert table.describe() == [("double", "torch", ""), ("only_torch", "torch", "")]


def test_select_auto_on_cpu_is_torch():
    table = fake_registry().select_ops("auto", "cpu")
    assert table.backend_of("double") == "torch"


def test_select_triton_on_cpu_falls_back_with_reason():
    table = fake_registry().select_ops("triton", torch.device("cpu"))
    assert table.double(1) == 2
    assert ("double", "torch", "triton: needs a CUDA or ROCm GPU") in table.describe()
    assert ("only_torch", "torch", "triton: no kernel yet") in table.describe()


def test_select_amd_falls_back_through_triton_to_torch():
    table = fake_registry().select_ops("amd", torch.device("cpu"))
    notes = dict((op, note) for op, _, note in table.describe())
    assert notes["double"] == "amd: needs a CUDA or ROCm GPU; triton: needs a CUDA or ROCm GPU"
    assert notes["only_torch"] == "amd: no kernel yet; triton: no kernel yet"


def test_select_triton_on_cuda_device_uses_triton():
    # Selection only asks why_unavailable; no GPU is touched.
    table = fake_registry().select_ops("triton", torch.device("cuda"))
    assert table.double(1) == 20
    assert table.backend_of("only_torch") == "torch"


def test_auto_resolves_amd_on_rocm_and_triton_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    assert resolve_backend("auto", torch.device("cuda")) == "amd"
    table = fake_registry().select_ops("auto", torch.device("cuda"))
    assert table.double(1) == 200
    assert resolve_backend("auto", torch.device("cpu")) == "torch"


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown kernel backend 'cuda'; choose one of \('auto', 'torch'"):
        fake_registry().select_ops("cuda", "cpu")
    with pytest.raises(ValueError, match="unknown backend 'gluon' for op 'x'"):
        OpRegistry().register("x", "gluon", torch_double)


def test_second_implementation_for_same_backend_is_refused():
    registry = fake_registry()
    with pytest.raises(ValueError, match="op 'double' already has a torch implementation"):
        registry.register("double", "torch", triton_double)
    registry.register("double", "torch", torch_double)  # the same function again is fine


def test_bad_op_name_is_refused():
    with pytest.raises(ValueError, match="op name must be a public Python identifier"):
        OpRegistry().register("rms-norm", "torch", torch_double)


def test_op_without_usable_implementation_raises():
    registry = OpRegistry()
    registry.register("gpu_only", "triton", triton_double, needs_gpu)
    with pytest.raises(OpUnavailableError, match="no implementation of op 'gpu_only' can run on cpu"):
        registry.select_ops("triton", "cpu")


def test_unknown_op_attribute_lists_known_ops():
    table = fake_registry().select_ops("torch", "cpu")
    with pytest.raises(AttributeError, match=r"no op named 'tripple'.*'double'"):
        table.tripple  # noqa: B018
    with pytest.raises(ValueError, match="no op named 'tripple'"):
        table.backend_of("tripple")


def test_empty_table():
    table = OpRegistry().select_ops("auto", "cpu")
    assert isinstance(table, OpTable) and table.describe() == []


def test_engine_registry_has_every_core_op_on_torch():
    table = ops.select_ops("auto", torch.device("cpu"))
    described = {op: (backend, note) for op, backend, note in table.describe()}
    assert ENGINE_OPS <= set(described)
    assert all(described[op] == ("torch", "") for op in ENGINE_OPS)
    assert set(ops.registered_ops()) == set(described)
    x = torch.randn(3, 8)
    assert torch.equal(table.rms_norm(x, torch.ones(8), 1e-5),
                       ops.norms.rms_norm_torch(x, torch.ones(8), 1e-5))
