"""A new decode graph proves itself against the eager step (atomk31/engine/graph_check.py and
DecodeGraphs._replay_agrees), on CPU: the "replay" of a stand-in graph is the model run with
the graph table, which these tests make right or wrong on purpose (issue 16, item 6)."""

import logging

import torch

from atomk31 import LLM, SamplingParams
from atomk31.engine import cuda_graphs
from atomk31.engine.cuda_graphs import DecodeGraphs, DecodeInputs
from atomk31.ops import Kernels


class ForwardGraph:
    """Replays by running the model over its inputs with ``ops`` (the graph table)."""

    def __init__(self, runner, inputs: DecodeInputs, ops):
        self.runner, self.inputs, self.ops = runner, inputs, ops
        self.logits = torch.zeros(inputs.batch_size, runner.model.lm_head.shape[0])

    def replay(self) -> None:
        self.logits.copy_(self.runner.forward(self.inputs.batch, self.ops))


def engine_at_first_decode(tiny_checkpoint):
    """A float32 torch engine with two requests prefilled and their first decode scheduled."""
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", dtype="float32",
              kv_cache_dtype="fp32")
    engine = llm.engine
    for prompt in ([5, 6, 7, 8, 9], list(range(30, 70))):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4,
                                                  ignore_eos=True))
    engine.step()                                   # the prefill
    scheduled = engine.scheduler.schedule()
    assert all(item.num_new_tokens == 1 for item in scheduled)
    return engine, scheduled


def decode_graphs(engine, graph_ops, monkeypatch) -> DecodeGraphs:
    kernels = engine.kernels
    graphs = DecodeGraphs(
        engine.runner.forward, Kernels(kernels.backend, kernels.context, kernels.eager, graph_ops),
        block_size=16, max_batch=4, max_context=256, split_points=[64],
        scratch_block=engine.block_pool.allocate(1)[0], scratch_slot=engine.state_pool.allocate(),
        backup_slot=engine.state_pool.allocate(), device=engine.device,
        copy_state=engine.state_pool.copy)

    def capture(batch, context):
        inputs = DecodeInputs(batch, context, 16, graphs.scratch_block, graphs.scratch_slot,
                              engine.device)
        graph = ForwardGraph(engine.runner, inputs, graph_ops)
        return cuda_graphs._Graph(inputs, graph, graph.logits)
    monkeypatch.setattr(graphs, "_capture", capture)
    return graphs


def states(engine, slots):
    return engine.state_pool.recurrent[:, slots].clone(), engine.state_pool.conv[:, slots].clone()


def test_a_replay_that_agrees_serves_the_step_and_leaves_the_states_alone(tiny_checkpoint,
                                                                           monkeypatch):
    engine, scheduled = engine_at_first_decode(tiny_checkpoint)
    slots = [item.seq.state_slot for item in scheduled]
    before = states(engine, slots)
    expected = engine.runner.forward(engine.runner.prepare(scheduled))
    after_eager = states(engine, slots)
    for tensor, saved in zip((engine.state_pool.recurrent, engine.state_pool.conv), before):
        tensor[:, slots] = saved
    graphs = decode_graphs(engine, engine.kernels.eager, monkeypatch)
    logits = graphs.run(engine.runner.step_requests(scheduled))
    assert logits is not None and not graphs.refused
    assert (logits - expected).abs().max() <= 1e-5 * expected.abs().max()
    # the check's replay and eager run left no trace: the states advanced exactly once
    for got, want in zip(states(engine, slots), after_eager):
        assert torch.equal(got, want)


def test_a_replay_that_differs_turns_its_shape_eager_and_names_the_op(tiny_checkpoint,
                                                                       monkeypatch, caplog):
    engine, scheduled = engine_at_first_decode(tiny_checkpoint)
    slots = [item.seq.state_slot for item in scheduled]
    before = states(engine, slots)

    def wrong_rms_norm(op, fn):
        return (lambda *args: fn(*args) * 1.5) if op == "rms_norm" else fn
    graphs = decode_graphs(engine, engine.kernels.eager.wrapped(wrong_rms_norm), monkeypatch)
    with caplog.at_level(logging.WARNING, logger="atomk31.engine.cuda_graphs"):
        assert graphs.run(engine.runner.step_requests(scheduled)) is None                     # run eagerly instead
    (shape, reason), = graphs.refused.items()
    assert shape == (2, 64) and "op rms_norm" in reason, reason
    assert "run eagerly: the graph's replay differs from the eager step" in caplog.text
    assert "op rms_norm (atomk31.ops.norms.rms_norm_torch) differs most" in caplog.text
    for got, want in zip(states(engine, slots), before):       # nothing advanced yet
        assert torch.equal(got, want)
    assert graphs.run(engine.runner.step_requests(scheduled)) is None and not graphs.graphs  # refused: not captured again


def test_a_capture_that_fails_turns_only_its_shape_eager(tiny_checkpoint, monkeypatch, caplog):
    engine, scheduled = engine_at_first_decode(tiny_checkpoint)
    graphs = decode_graphs(engine, engine.kernels.eager, monkeypatch)
    monkeypatch.undo()                                   # the real capture path

    def forward(batch, ops):
        error = RuntimeError("operation not permitted when stream is capturing")
        error.add_note("in op indexer_score (amd: gluon_kernels.amd.indexer_score)")
        raise error
    graphs.forward = forward
    with caplog.at_level(logging.WARNING, logger="atomk31.engine.cuda_graphs"):
        assert graphs.run(engine.runner.step_requests(scheduled)) is None
    assert graphs.enabled, "one shape's failure leaves the other shapes to graphs"
    assert "in op indexer_score" in graphs.refused[2, 64]
    assert "capturing them failed in op indexer_score" in caplog.text
