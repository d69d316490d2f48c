"""The kernel tables of every target, as `atomk31 info --target` prints them (issue 16).

No such device is here: `Target.named` answers for a target with its standard packages, and
the tables import no kernel. These pin what eager and graph steps run on gfx950, gfx942, sm90
and CPU, so that a registration change that moves an op off its kernel is seen.
"""

import pytest

import atomk31.ops  # noqa: F401  (registers every implementation)
from atomk31.cli import main
from atomk31.ops import KernelContext, Target, select_kernels


def tables(target: str):
    return select_kernels("auto", KernelContext.default_for(Target.named(target)))


def chosen(table, op: str, shape: str | None = None) -> tuple[str, str]:
    choice = table.choice(op, shape)
    return choice.target, choice.kernel


def test_gfx950_runs_the_amd_kernels():
    kernels = tables("gfx950")
    eager, graph = kernels.eager, kernels.graph
    assert kernels.backend == "amd"
    # the Gluon indexer in both tables: its launch sizes its row groups on the host
    for table in (eager, graph):
        assert chosen(table, "indexer_score") == \
            ("amd", "gluon_kernels.amd.indexer_score.indexer_score_gluon")
    assert chosen(eager, "topk_slots") == ("amd", "atomk31.ops.amd_adapters.topk_slots_radix")
    assert chosen(graph, "topk_slots") == ("amd", "atomk31.ops.amd_adapters.topk_slots_radix")
    assert chosen(eager, "sparse_mla", "many_rows") == \
        ("amd", "flydsl_kernels.sparse_mla.sparse_mla_flydsl")
    assert chosen(eager, "sparse_mla", "few_rows")[0] == "triton"
    assert chosen(eager, "rms_norm") == ("amd", "atomk31.ops.amd_adapters.rms_norm_aiter")
    # the routed MoE on FlyDSL in every shape class, in graph steps too (its grid is sized on
    # the host: nothing a capture cannot hold)
    for table in (eager, graph):
        for shape in ("few_tokens", "small_groups", "large_groups"):
            assert chosen(table, "moe_experts_mxfp4", shape) == \
                ("amd", "atomk31.ops.amd_adapters.moe_experts_mxfp4_flydsl"), (table.step, shape)


def test_gfx942_has_no_flydsl_and_an_fnuz_latent():
    kernels = tables("gfx942")
    assert str(kernels.context.latent_dtype) == "torch.float8_e4m3fnuz"
    assert chosen(kernels.eager, "sparse_mla", "many_rows")[0] == "triton"
    reason = kernels.eager.choice("sparse_mla", "many_rows").skipped[0].reason
    assert reason == "needs gfx950, got gfx942"
    assert chosen(kernels.eager, "indexer_score")[0] == "amd"
    assert chosen(kernels.graph, "indexer_score")[0] == "amd"
    assert chosen(kernels.eager, "moe_experts_mxfp4", "large_groups")[0] == "triton"


def test_gfx942_keeps_mxfp4_index_keys_off_the_gluon_indexer():
    context = KernelContext(Target.named("gfx942"), index_format="mxfp4")
    eager = select_kernels("amd", context).eager
    assert chosen(eager, "indexer_score")[0] == "triton"
    assert "no FP4 there" in eager.choice("indexer_score").skipped[0].reason


def test_sm90_takes_the_hopper_kernels_and_the_gluon_indexer_only_in_graphs():
    kernels = tables("sm90")
    eager, graph = kernels.eager, kernels.graph
    assert kernels.backend == "hopper"
    assert chosen(eager, "indexer_score")[0] == "triton"
    assert "host time" in eager.choice("indexer_score").skipped[0].reason
    assert chosen(graph, "indexer_score") == \
        ("hopper", "gluon_kernels.hopper.indexer_score.indexer_score_hopper")
    assert chosen(graph, "sparse_mla", "few_rows") == \
        ("hopper", "gluon_kernels.hopper.sparse_mla.sparse_mla_hopper")
    assert chosen(graph, "dense_mla") == \
        ("hopper", "gluon_kernels.hopper.dense_mla.dense_mla_hopper")
    assert chosen(eager, "dense_mla")[0] == chosen(graph, "dense_mla")[0] == "hopper"
    # PTPC: the Gluon kernel for many-row GEMMs (eager: the large ones), the pointer kernel for
    # decode rows and narrow outputs (tests/ops/test_linear.py has the whole table)
    assert chosen(eager, "ptpc_linear", "large_gemm") == \
        ("hopper", "gluon_kernels.hopper.ptpc_fp8_launch.ptpc_linear_hopper")
    assert chosen(graph, "ptpc_linear", "small_gemm")[0] == "hopper"
    assert chosen(eager, "ptpc_linear", "small_gemm")[0] == "triton"
    assert chosen(graph, "ptpc_linear", "few_rows")[0] == "triton"
    for shape in ("few_rows", "many_rows"):
        assert chosen(graph, "sparse_mla", shape)[0] == "hopper"
    assert kernels.why_no_graphs(ops_called={"indexer_score", "sparse_mla"}) is None


def test_hopper_kernels_decline_what_they_cannot_read():
    context = KernelContext(Target.named("sm90"), index_format="mxfp4", block_size=32)
    eager = select_kernels("hopper", context).graph
    assert chosen(eager, "indexer_score")[0] == "triton"
    assert "reads fp8 index keys, the cache has mxfp4" in \
        eager.choice("indexer_score").skipped[0].reason


def test_cpu_runs_torch_and_decodes_eagerly():
    kernels = tables("cpu")
    assert {target for _, _, target, _, _ in kernels.eager.describe()} == {"torch"}
    assert kernels.why_no_graphs(ops_called={"dense_mla"}).startswith(
        "op dense_mla has no implementation a graph may capture")


@pytest.mark.parametrize("target", ["gfx950", "sm90", "cpu"])
def test_info_prints_both_tables_for_a_target_that_is_not_here(target, capsys):
    assert main(["--log-level", "WARNING", "info", "--target", target]) == 0
    out = capsys.readouterr().out
    assert f"target {target} (not this machine" in out
    assert "eager steps:" in out and ("graph steps:" in out) == (target != "cpu")
    if target == "gfx950":
        assert "flydsl_kernels.sparse_mla.sparse_mla_flydsl" in out
        assert "atomk31.ops.amd_adapters.moe_experts_mxfp4_flydsl" in out


def test_info_refuses_an_unknown_target(capsys):
    with pytest.raises(SystemExit, match="unknown target 'h100x'"):
        main(["info", "--target", "h100x"])
