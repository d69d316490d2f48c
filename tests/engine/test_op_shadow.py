"""Shadow mode (atomk31/ops/shadow.py): each op on two backends, differences recorded per op.

On the GPU this is the float32 engine with every Triton kernel checked against its torch
implementation on the same inputs: the test that names the kernel when the engine-level
float32 comparison (test_llm_vs_reference.py) fails.
"""

import dataclasses

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.engine import rank
from atomk31.ops import KernelContext, Target, registry, select_kernels
from atomk31.ops.shadow import ShadowOpTable

FLOAT32_TOLERANCE = 1e-5  # of the largest |value| of each output: float32-exact kernels


def _tables():
    reg = registry.OpRegistry()

    def scale_torch(x, state):
        state.add_(1.0)
        return x * 2.0

    def scale_off(x, state):
        state.add_(1.5)            # writes its state wrong
        return x * 2.0 + 1e-3      # and its output a little off

    def ids_torch(x):
        return torch.tensor([[3, 1, 2]])

    def ids_reordered(x):
        return torch.tensor([[1, 2, 3]])

    reg.register("scale", "torch", scale_torch)
    reg.register("scale", "triton", scale_off)
    reg.register("topk_slots", "torch", ids_torch)
    reg.register("topk_slots", "triton", ids_reordered)
    gpu = KernelContext(Target.named("sm80"))       # a GPU target: no device is touched
    return reg.select_kernels("triton", gpu).eager, reg.select_kernels("torch", gpu).eager


def test_shadow_records_each_op_and_hands_on_the_reference_results():
    checked, reference = _tables()
    table = ShadowOpTable(checked, reference)
    x, state = torch.ones(4), torch.zeros(2)
    out = table.scale(x, state)
    assert torch.equal(out, x * 2.0), "follow='reference' returns the reference's output"
    assert torch.equal(state, torch.ones(2)), "and leaves the reference's in-place writes"
    stats = dict(table.report())
    assert stats["scale"].calls == 1
    assert stats["scale"].max_rel == pytest.approx(0.5)   # the state: 1.5 vs 1.0
    assert "arg" in stats["scale"].worst
    table.topk_slots(x)
    assert table.stats["topk_slots"].max_rel == 1.0, "integer outputs compare element by element"
    as_sets = ShadowOpTable(checked, reference, unordered_ops=frozenset({"topk_slots"}))
    as_sets.topk_slots(x)
    assert as_sets.stats["topk_slots"].max_rel == 0.0, "unordered_ops compares them as sets"


def test_shadow_can_follow_the_checked_backend():
    checked, reference = _tables()
    table = ShadowOpTable(checked, reference, follow="checked")
    state = torch.zeros(2)
    out = table.scale(torch.ones(4), state)
    assert torch.allclose(out, torch.full((4,), 2.001))
    assert torch.equal(state, torch.full((2,), 1.5))
    with pytest.raises(ValueError, match="follow"):
        ShadowOpTable(checked, reference, follow="both")


@pytest.mark.gpu
def test_every_triton_op_matches_torch_in_the_float32_engine(tiny_checkpoint, monkeypatch):
    real_select = rank.select_kernels

    def shadowed(backend, context):
        kernels = real_select("triton", context)
        table = ShadowOpTable(kernels.eager, real_select("torch", context).eager)
        shadowed.table = table
        return dataclasses.replace(kernels, eager=table)
    monkeypatch.setattr(rank, "select_kernels", shadowed)
    # eager: the shadow table reads both results on the host, which a graph capture cannot
    llm = LLM(tiny_checkpoint, block_size=16, dtype="float32", kv_cache_dtype="fp32",
              kernel_backend="triton", device="cuda", kv_cache_memory=512 << 20,
              enforce_eager=True)
    generator = torch.Generator().manual_seed(0)
    # 1 token, a block boundary, past index_topk (64) so top-k and sparse MLA run
    prompts = [torch.randint(0, 768, (n,), generator=generator).tolist() for n in (1, 17, 130)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    report = shadowed.table.report()
    lines = [f"{op}: {s.max_rel:.2e} of max (abs {s.max_abs:.2e}, {s.calls} calls, {s.worst})"
             for op, s in report]
    print("\n".join(lines))
    bad = [line for (op, s), line in zip(report, lines) if s.max_rel > FLOAT32_TOLERANCE]
    assert not bad, "Triton ops differing from torch in float32:\n" + "\n".join(bad)
