"""The kernel registry (atomk31/ops/registry.py, op_table.py): registration rules, the eager and
graph tables, shape classes, fallback reasons (DESIGN.md §3)."""

import pytest
import torch

import atomk31.ops as ops
from atomk31.ops.registry import OpRegistry, OpUnavailableError, resolve_backend
from atomk31.ops.requirements import needs_gpu
from atomk31.ops.target import KernelContext, Target

ENGINE_OPS = {
    "rms_norm", "gated_rms_norm", "layer_norm", "situ_glu", "attn_res", "moe_route",
    "moe_experts_mxfp4", "moe_experts_dense", "kda_gate", "short_conv_silu",
    "conv_state_after", "kda_prefill", "kda_decode", "kda_verify", "kv_write", "indexer_score",
    "topk_slots", "dense_mla", "sparse_mla", "ptpc_linear",
}
CPU = KernelContext.default_for(Target.named("cpu"))
SM90 = KernelContext.default_for(Target.named("sm90"))
SM80 = KernelContext.default_for(Target.named("sm80"))
GFX950 = KernelContext.default_for(Target.named("gfx950"))


def torch_double(x):
    return 2 * x


def triton_double(x):
    return 20 * x


def hopper_double(x):
    return 30 * x


def amd_double(x):
    return 200 * x


def needs_amd(context):
    return None if context.target.vendor == "amd" else "needs a ROCm GPU"


def fake_registry() -> OpRegistry:
    registry = OpRegistry()
    registry.register("double", "torch", torch_double)
    registry.register("double", "triton", triton_double, why_not=needs_gpu)
    registry.register("double", "hopper", hopper_double,
                      why_not=lambda c: None if c.target.name == "sm90" else "needs sm_90",
                      not_in_eager="slow host launch")
    registry.register("double", "amd", amd_double, why_not=needs_amd,
                      not_in_graph="reads the device")
    registry.register("only_torch", "torch", torch_double)
    return registry


def kernel_of(table, op, shape=None):
    return table.choice(op, shape).kernel.rsplit(".", 1)[-1]


def test_cpu_takes_torch_and_says_why_the_others_were_passed_over():
    kernels = fake_registry().select_kernels("amd", CPU)
    assert kernels.eager.double(1) == 2 and kernels.graph.double(1) == 2
    rows = {op: passed for op, _, _, _, passed in kernels.eager.describe()}
    assert rows["double"] == "amd amd_double: needs a ROCm GPU; triton triton_double: " \
                             "needs a GPU (Triton)"
    assert rows["only_torch"] == "amd: no kernel yet; triton: no kernel yet"


def test_auto_resolves_per_target():
    assert resolve_backend("auto", Target.named("cpu")) == "torch"
    assert resolve_backend("auto", Target.named("sm90")) == "hopper"
    assert resolve_backend("auto", Target.named("sm80")) == "triton"
    assert resolve_backend("auto", Target.named("gfx950")) == "amd"
    assert resolve_backend("triton", Target.named("sm90")) == "triton"


def test_eager_and_graph_tables_differ_where_implementations_say_so():
    hopper = fake_registry().select_kernels("auto", SM90)
    assert hopper.eager.double(1) == 20          # hopper passed over eagerly: host launch
    assert hopper.graph.double(1) == 30
    assert "hopper hopper_double: slow host launch" in hopper.eager.choice("double").skipped[0].line()
    amd = fake_registry().select_kernels("auto", GFX950)
    assert amd.eager.double(1) == 200
    assert amd.graph.double(1) == 20             # the amd kernel may not be captured
    assert fake_registry().select_kernels("auto", SM80).graph.double(1) == 20


def test_a_graph_table_without_a_capturable_implementation_names_the_op():
    registry = OpRegistry()
    registry.register("syncs", "torch", torch_double, not_in_graph="reads the device")
    registry.register("fine", "torch", torch_double)
    kernels = registry.select_kernels("torch", CPU)
    assert kernels.eager.syncs(2) == 4
    assert kernels.graph.missing() == ["syncs"]
    assert kernels.why_no_graphs() == "op syncs has no implementation a graph may capture " \
                                      "(torch torch_double: reads the device)"
    assert kernels.why_no_graphs(ops_called={"fine"}) is None
    with pytest.raises(OpUnavailableError, match="op syncs has no implementation for this step"):
        kernels.graph.syncs(2)


def test_shape_classes_dispatch_per_call():
    registry = OpRegistry()
    registry.define_op("rows", shapes={"few": "< 4 rows", "many": ">= 4 rows"},
                       classify=lambda x: "many" if x.shape[0] >= 4 else "few")
    registry.register("rows", "torch", lambda x: x * 0)
    registry.register("rows", "amd", lambda x: x * 0 + 1, why_not=needs_amd, shapes=("many",))
    table = registry.select_kernels("amd", GFX950).eager
    assert table.rows(torch.ones(3)).tolist() == [0, 0, 0]
    assert table.rows(torch.ones(4)).tolist() == [1, 1, 1, 1]
    few = {shape: passed for op, shape, _, _, passed in table.describe()}["few"]
    assert "serves many only" in few
    with pytest.raises(ValueError, match=r"has shape classes \('few', 'many'\); got \('lots',\)"):
        registry.register("rows", "triton", torch_double, shapes=("lots",))
    with pytest.raises(ValueError, match="give shapes and classify together"):
        registry.define_op("bad", shapes={"a": "b"})


def test_the_op_check_runs_before_kernels_but_not_before_torch():
    calls = []
    registry = OpRegistry()
    registry.define_op("checked", check=lambda x: calls.append(x))
    registry.register("checked", "torch", torch_double)
    registry.register("checked", "amd", amd_double, why_not=needs_amd)
    registry.select_kernels("torch", CPU).eager.checked(1)
    assert calls == []
    registry.select_kernels("amd", GFX950).eager.checked(1)
    assert calls == [1]


def test_kernels_named_by_string_import_on_first_call_for_absent_targets():
    registry = OpRegistry()
    registry.register("x", "torch", torch_double)
    registry.register("x", "amd", "no_such_package.kernels:fn", why_not=needs_amd)
    table = registry.select_kernels("amd", GFX950).eager       # imports nothing yet
    assert table.choice("x").kernel == "no_such_package.kernels.fn"
    with pytest.raises(ModuleNotFoundError, match="no_such_package"):
        table.x(1)
    present = KernelContext(Target("gfx950", "amd", frozenset(), is_present=True))
    with pytest.raises(ModuleNotFoundError):                  # a present target: at start-up
        registry.select_kernels("amd", present)


def test_step_config_is_bound_per_step():
    registry = OpRegistry()
    registry.register("cfg", "torch", lambda x, config=None: (x, config),
                      step_config={"graph": "math:pi"})
    kernels = registry.select_kernels("torch", CPU)
    assert kernels.eager.cfg(1) == (1, None)
    assert kernels.graph.cfg(1)[1] == pytest.approx(3.14159, abs=1e-5)


def test_an_error_inside_an_op_carries_the_op_and_kernel():
    def broken(x):
        raise RuntimeError("boom")
    registry = OpRegistry()
    registry.register("broken", "torch", broken)
    with pytest.raises(RuntimeError, match="boom") as caught:
        registry.select_kernels("torch", CPU).eager.broken(1)
    assert any("in op broken (torch: " in note for note in caught.value.__notes__)


def test_registration_errors_are_clear():
    with pytest.raises(ValueError, match=r"unknown kernel backend 'cuda'; choose one of auto, "
                                         r"torch, triton, hopper, amd"):
        fake_registry().select_kernels("cuda", CPU)
    with pytest.raises(ValueError, match="unknown target 'gluon' for op 'x'"):
        OpRegistry().register("x", "gluon", torch_double)
    with pytest.raises(ValueError, match="op name must be a public Python identifier"):
        OpRegistry().register("rms-norm", "torch", torch_double)
    registry = OpRegistry()
    registry.register("gpu_only", "triton", triton_double, why_not=needs_gpu)
    with pytest.raises(OpUnavailableError, match="no implementation of op 'gpu_only' can run "
                                                 "on cpu"):
        registry.select_kernels("triton", CPU)
    with pytest.raises(ValueError, match="unknown target 'tpu7'"):
        Target.named("tpu7")


def test_reregistering_the_same_function_replaces_it():
    registry = fake_registry()
    registry.register("double", "torch", torch_double)
    assert [i.target for i in registry.implementations["double"]].count("torch") == 1


def test_unknown_op_attribute_lists_known_ops():
    table = fake_registry().select_kernels("torch", CPU).eager
    with pytest.raises(AttributeError, match=r"no op named 'tripple'.*'double'"):
        table.tripple  # noqa: B018
    with pytest.raises(ValueError, match="no op named 'tripple'"):
        table.choice("tripple")


def test_wrapped_tables_pass_every_call_through_the_wrapper():
    seen = []
    table = fake_registry().select_kernels("torch", CPU).eager
    wrapped = table.wrapped(lambda op, fn: lambda *a: (seen.append(op), fn(*a))[1])
    assert wrapped.double(2) == 4 and seen == ["double"]
    assert table.double(2) == 4 and seen == ["double"]        # the original is untouched


def test_engine_registry_has_every_core_op_on_torch():
    table = ops.select_kernels("auto", CPU).eager
    described = {op: (target, passed) for op, _, target, _, passed in table.describe()}
    assert ENGINE_OPS <= set(described)
    assert all(described[op][0] == "torch" for op in ENGINE_OPS)
    assert set(ops.registered_ops()) == set(described)
    x = torch.randn(3, 8)
    assert torch.equal(table.rms_norm(x, torch.ones(8), 1e-5),
                       ops.norms.rms_norm_torch(x, torch.ones(8), 1e-5))
