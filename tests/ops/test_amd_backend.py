"""The `amd` backend's registrations (atomk31/ops/amd_backend.py): what `atomk31 info` shows.

No ROCm GPU here, so every AMD implementation must decline with a reason naming what it needs,
and the table must fall back along amd -> triton -> torch.
"""

import pytest
import torch

import atomk31.ops  # noqa: F401  (registers every op's torch/triton implementations)
from atomk31.ops import amd_backend, select_ops

AMD_OPS = ("indexer_score", "topk_positions", "sparse_mla", "rms_norm", "moe_experts_mxfp4")


def test_amd_backend_on_cpu_falls_back_and_says_why():
    table = select_ops("amd", torch.device("cpu"))
    notes = {op: (backend, note) for op, backend, note in table.describe()}
    for op in AMD_OPS:
        backend, note = notes[op]
        assert backend == "torch", f"{op}: expected the torch fallback on CPU, got {backend}"
        assert "amd: needs a ROCm GPU" in note, f"{op}: note {note!r} does not say why"


def test_gluon_ops_decline_other_rocm_archs(monkeypatch):
    monkeypatch.setattr(amd_backend, "rocm_arch", lambda device: "gfx90a")
    check = amd_backend._needs_rocm_arch(amd_backend.GLUON_ARCHS)
    assert check(torch.device("cuda")) == "needs gfx950 or gfx942, got gfx90a"


def test_flydsl_op_needs_the_package(monkeypatch):
    monkeypatch.setattr(amd_backend, "rocm_arch", lambda device: "gfx950")
    monkeypatch.setattr(amd_backend.importlib.util, "find_spec", lambda name: None)
    check = amd_backend._needs_rocm_arch(amd_backend.FLYDSL_ARCHS, "flydsl")
    assert check(torch.device("cuda")) == "needs the flydsl package (pip install 'atomk31[amd]')"


def test_graph_replayed_launches_take_the_capturable_kernels(monkeypatch):
    """Inside a CUDA (HIP) graph capture, the indexer and the MoE go to the Triton kernels: the
    Gluon indexer and the FlyDSL MoE read their grid sizes back from the device."""
    pytest.importorskip("flydsl", reason="the FlyDSL wheel is x86-64 only")
    import flydsl_kernels.moe_mxfp4 as flydsl_moe
    import gluon_kernels.indexer_score as gluon_indexer

    from atomk31.ops import indexer_score as indexer_ops
    from atomk31.triton_kernels.runtime import replayed_launches

    def host_syncing(*args, **kwargs):
        raise AssertionError("a host-syncing kernel ran inside a graph capture")

    monkeypatch.setattr(gluon_indexer, "indexer_score_gluon", host_syncing)
    monkeypatch.setattr(flydsl_moe, "moe_experts_mxfp4_flydsl", host_syncing)
    monkeypatch.setattr(flydsl_moe, "check_shapes", lambda w13_packed: None)
    monkeypatch.setattr(indexer_ops, "indexer_score_triton", lambda *args, **kwargs: "triton")
    monkeypatch.setattr(amd_backend, "_portable_moe_experts_mxfp4",
                        lambda: lambda *args, **kwargs: "portable")
    packed = torch.zeros(2, 256, 64, dtype=torch.uint8)
    with replayed_launches():
        assert amd_backend.indexer_score_amd(*[None] * 10) == "triton"
        assert amd_backend.moe_experts_mxfp4_amd(None, None, None, packed, None, None, None,
                                                 1.0, None) == "portable"
    # eager launches keep the AMD kernels
    with pytest.raises(AssertionError, match="host-syncing"):
        amd_backend.indexer_score_amd(*[None] * 10)
    with pytest.raises(AssertionError, match="host-syncing"):
        amd_backend.moe_experts_mxfp4_amd(None, None, None, packed, None, None, None, 1.0, None)
