"""The `amd` backend's registrations (atomk31/ops/amd_backend.py): what `atomk31 info` shows.

No ROCm GPU here, so every AMD implementation must decline with a reason naming what it needs,
and the table must fall back along amd -> triton -> torch.
"""

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
