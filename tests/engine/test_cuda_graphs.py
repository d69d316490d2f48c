"""CUDA-graph decode (atomk31/engine/cuda_graphs.py).

On CPU: the shape rules, and the padded, bucketed batch a graph replays run eagerly: its real
rows must give the logits and KDA states of the plain eager step (padding rows touch only the
scratch block and slot; the bucket's host values change no result). On the GPU: the engine with
graphs against the same engine with ``enforce_eager``.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.engine import cuda_graphs
from atomk31.engine.cuda_graphs import (
    GRAPH_BATCH_SIZES, MIN_GRAPH_CONTEXT, DecodeGraphs, DecodeInputs, context_buckets,
    graph_batch_size, why_no_decode_graphs,
)
from atomk31.engine.step_batch import StepRequest
from atomk31.info import RELEASE_OPS
from atomk31.ops import KernelContext, Kernels, Target, select_kernels


def random_prompts(lengths, seed=0, vocab=768):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("requests, max_batch, expected", [
    (1, 64, 1), (3, 64, 4), (5, 64, 8), (9, 64, 16), (17, 64, 32), (64, 64, 64),
    (65, 64, None), (300, 512, 304), (513, 1024, None),
])
def test_graph_batch_size(requests, max_batch, expected):
    assert graph_batch_size(requests, max_batch) == expected
    assert expected is None or expected in GRAPH_BATCH_SIZES


def kernels_for(target: str, backend: str = "auto"):
    return select_kernels(backend, KernelContext.default_for(Target.named(target)))


def test_why_no_decode_graphs():
    release = RELEASE_OPS
    assert why_no_decode_graphs(kernels_for("sm90"), False, release) is None
    assert why_no_decode_graphs(kernels_for("sm90", "triton"), False, release) is None
    assert why_no_decode_graphs(kernels_for("gfx950"), False, release) is None
    assert why_no_decode_graphs(kernels_for("sm90"), True, release) == "--enforce-eager"
    assert why_no_decode_graphs(kernels_for("sm90", "torch"), False, release).startswith(
        "op conv_state_after has no implementation a graph may capture (torch "
        "conv_state_after_torch: reads tensor values on the host")
    assert why_no_decode_graphs(kernels_for("cpu"), False, release) == "no GPU"


def test_context_buckets_include_the_topk_edge_and_the_context_length():
    assert context_buckets(1000, 16, [64]) == [64, 256, 512, 1008]
    assert context_buckets(4096, 128, [2048]) == [256, 512, 1024, 2048, 4096]
    assert context_buckets(300, 512, []) == [512]
    assert context_buckets(1 << 20, 128, [2048])[-1] == 1 << 20
    assert min(context_buckets(1 << 20, 128, [])) == MIN_GRAPH_CONTEXT


def Item(computed: int, new: int = 1, last: bool = True, **fields) -> StepRequest:
    """A step's request of `new` tokens from position `computed`."""
    return StepRequest(list(range(new)), computed, [0], 0, last, **fields)


def test_shape_for_takes_decode_steps_only():
    graphs = DecodeGraphs(lambda batch, ops: None, kernels_for("cpu"), block_size=16,
                          max_batch=8, max_context=1000, split_points=[64], scratch_block=0,
                          scratch_slot=0, backup_slot=1, device=torch.device("cpu"),
                          copy_state=lambda src, dst: None)
    assert graphs.shape_for([Item(10), Item(63)]) == (2, 64)
    assert graphs.shape_for([Item(10), Item(64)]) == (2, 256)      # position 64: 65 keys
    assert graphs.shape_for([Item(999)] * 3) == (4, 1008)
    assert graphs.shape_for([Item(10)] * 9) is None                # over max_batch
    assert graphs.shape_for([Item(10), Item(10, new=5)]) is None   # a prefill chunk
    assert graphs.shape_for([Item(10, last=False)]) is None
    assert graphs.shape_for([Item(10, draft_tokens=[4, 5])]) is None   # a verify pass
    assert graphs.shape_for([Item(10, prompt_logit_rows=[0])]) is None  # prompt logprobs
    assert graphs.shape_for([Item(1008)]) is None                  # past the context length
    assert graphs.shape_for([]) is None


class FakeGraph:
    def __init__(self, logits: torch.Tensor):
        self.logits, self.replays = logits, 0

    def replay(self) -> None:
        self.replays += 1
        self.logits += 1


def decode_item(position: int, state_slot: int, snapshots=()) -> StepRequest:
    """A one-token decode of a sequence whose token `position` is next."""
    return StepRequest([position], position, list(range(position // 16 + 1)), state_slot, True,
                       list(snapshots))


def test_run_replays_fills_inputs_takes_snapshots_and_keeps_the_recent_graphs(monkeypatch):
    """run() without a GPU: a stub capture stands in for CUDA's; the rest is the real path."""
    monkeypatch.setattr(cuda_graphs, "MAX_GRAPHS", 2)
    copies: list[tuple[int, int]] = []
    graphs = DecodeGraphs(lambda batch, ops: None, kernels_for("cpu"), block_size=16,
                          max_batch=8, max_context=1000, split_points=[64], scratch_block=99,
                          scratch_slot=7, backup_slot=8, device=torch.device("cpu"),
                          copy_state=lambda *slots: copies.append(slots))
    captured = []

    def capture(batch, context):
        captured.append((batch, context))
        inputs = DecodeInputs(batch, context, 16, 99, 7, torch.device("cpu"))
        graph = FakeGraph(torch.zeros(batch, 3))
        return cuda_graphs._Graph(inputs, graph, graph.logits)

    monkeypatch.setattr(graphs, "_capture", capture)
    monkeypatch.setattr(graphs, "_replay_agrees", lambda graph, item, shape: True)
    step = [decode_item(20, 3), decode_item(47, 5, snapshots=[(1, 11)])]
    logits = graphs.run(step)
    assert captured == [(2, 64)] and logits.shape == (2, 3) and (logits == 1).all()
    assert copies == [(5, 11)]                   # the snapshot: the state after the step
    batch = graphs.graphs[2, 64].inputs.batch
    assert batch.positions.tolist() == [20, 47] and batch.state_slots.tolist() == [3, 5]
    assert batch.slot_mapping.tolist() == [1 * 16 + 4, 2 * 16 + 15]
    graphs.run(step)                             # replayed, not captured again
    assert captured == [(2, 64)] and graphs.num_replays == 2
    graphs.run([decode_item(100, 3)])            # (1, 256)
    graphs.run(step)                             # (2, 64) is now the most recent
    graphs.run([decode_item(300, 3)] * 3)        # (4, 512): drops (1, 256)
    assert list(graphs.graphs) == [(2, 64), (4, 512)]
    padding = graphs.graphs[4, 512].inputs.batch
    assert padding.state_slots.tolist() == [3, 3, 3, 7]
    assert padding.block_tables[3].tolist()[:2] == [99, -1]


def clone_caches(engine) -> list[torch.Tensor]:
    return [engine.kv_pool.clone(), engine.state_pool.conv.clone(),
            engine.state_pool.recurrent.clone()]


def restore_caches(engine, saved: list[torch.Tensor]) -> None:
    for target, values in zip((engine.kv_pool, engine.state_pool.conv,
                               engine.state_pool.recurrent), saved):
        target.copy_(values)


def test_padded_bucketed_batch_equals_the_eager_step(tiny_checkpoint):
    """Requests on both sides of index_topk (64): dense and sparse buckets, padded to 8."""
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", dtype="float32",
              kv_cache_dtype="fp32")
    engine = llm.engine
    for prompt in random_prompts((5, 40)):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=40,
                                                  ignore_eos=True))
    scratch_block = engine.block_pool.allocate(1)[0]
    scratch_slot = engine.state_pool.allocate()
    runner = engine.runner
    checked = set()
    while engine.has_unfinished_requests():
        scheduled = engine.scheduler.schedule()
        if not all(item.num_new_tokens == 1 for item in scheduled):
            sampled = runner.run(scheduled)             # a prefill step, eager as ever
        else:
            need = max(item.seq.num_computed_tokens for item in scheduled) + 1
            context = next(c for c in context_buckets(1000, 16, [64]) if c >= need)
            saved = clone_caches(engine)
            expected = runner.forward(runner.prepare(scheduled))
            after_eager = clone_caches(engine)
            restore_caches(engine, saved)
            inputs = DecodeInputs(8, context, 16, scratch_block, scratch_slot, engine.device)
            inputs.fill(runner.step_requests(scheduled))
            got = runner.forward(inputs.batch)[:len(scheduled)]
            scale = expected.abs().max()
            assert (got - expected).abs().max() <= 1e-5 * scale, f"context {context}"
            real = [item.seq.state_slot for item in scheduled]
            for eager, padded in zip(after_eager, (engine.kv_pool, engine.state_pool.conv,
                                                   engine.state_pool.recurrent)):
                if padded.dim() > 2:                    # the KDA states of the real slots
                    diff = (padded[:, real].float() - eager[:, real].float()).abs().max()
                    assert diff <= 1e-5 * eager[:, real].abs().max(), (padded.shape, diff)
            checked.add(context)
            sampled = [(item.seq, int(got[i].argmax()), None)
                       for i, item in enumerate(scheduled)]
        engine.scheduler.complete(scheduled)
        for seq, token, _ in sampled:
            seq.append_token(token, None)
            engine.stop_checker.check(seq, engine.config.max_model_len)
            if seq.is_finished:
                engine.scheduler.finish(seq)
    assert checked >= {64, 256}, checked      # both sides of the top-k edge were run


@pytest.mark.gpu
def test_graph_decode_equals_eager_decode(tiny_checkpoint):
    """Greedy tokens equal and logprobs close, with graphs captured and replayed, in float32 (a
    graph's bucket may split attention differently from the eager step: in bf16 that flips
    near-tied greedy tokens of the random tiny model). The batch shrinks through several graph
    sizes and ends in the dense bucket (every position under index_topk = 64). A second turn
    then hits the prefix cache at a KDA snapshot a graph decode step took."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    lengths = (290, 130, 100, 64, 63, 50, 7, 1)
    max_tokens = (20, 6, 8, 10, 12, 14, 20, 24)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=1)
              for n in max_tokens]
    prompts = random_prompts(lengths)
    outputs, second_turns, second_prompt = {}, {}, None
    for eager in (True, False):
        # a snapshot at every block (kda_snapshot_interval = block size), so that a decode
        # step ending block 19 (position 303) takes one for the second turn to hit
        llm = LLM(tiny_checkpoint, block_size=16, device="cuda", dtype="float32",
                  kv_cache_dtype="fp32", kv_cache_memory=512 << 20, enforce_eager=eager,
                  kda_snapshot_interval=16)
        outputs[eager] = llm.generate(prompts, params)
        graphs = llm.engine.runner.graphs
        if eager:
            assert graphs is None
            # the first turn's tokens (position 303, a graph decode step, ends the 19th block)
            second_prompt = prompts[0] + outputs[eager][0].outputs[0].token_ids + [5, 6, 7]
        else:
            assert graphs.enabled and graphs.num_replays > 0
            contexts = {context for _, context in graphs.graphs}
            assert len(graphs.graphs) >= 3 and 64 in contexts and max(contexts) >= 256, \
                sorted(graphs.graphs)
        second_turns[eager] = llm.generate([second_prompt], params[-1])[0]
    for graph_out, eager_out in zip(outputs[False], outputs[True]):
        got, want = graph_out.outputs[0], eager_out.outputs[0]
        assert got.token_ids == want.token_ids, len(graph_out.prompt_token_ids)
        for a, b in zip(got.logprobs, want.logprobs):
            assert abs(a.logprob - b.logprob) <= 1e-3
    assert second_turns[False].num_cached_tokens == second_turns[True].num_cached_tokens == 304
    got, want = second_turns[False].outputs[0], second_turns[True].outputs[0]
    assert got.token_ids == want.token_ids
    for a, b in zip(got.logprobs, want.logprobs):
        assert abs(a.logprob - b.logprob) <= 1e-3
