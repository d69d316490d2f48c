"""Runs one rank of a distributed LLM with decode graphs on CPU, recording what its graphs did.

CPU has no CUDA graphs, so each rank process makes three substitutions before building the
engine: decode graphs are allowed (`why_no_decode_graphs` -> None), the graph table is the
eager one (the torch kernels are not capturable, but a stand-in graph only runs them), and
`DecodeGraphs._record` returns a stand-in whose replay runs the step's forward over the
graph's own inputs, collectives included, into the graph's logits tensor. Everything else is
the engine's: shapes, capture, the replay check and its agreement, fills, snapshots, the worker
loop. ``faults`` inject what the ranks must agree on: ``{"fail_capture": [rank, batch,
context]}`` makes that rank's capture of that shape raise; ``{"wrong_replay": [rank, batch,
context]}`` makes that rank's replays of that shape return wrong logits.

Each rank writes ``out_dir / f"rank{rank}.pt"``: every DecodeGraphs event in order (capture,
check, replay, with shapes), the shapes it refused, and on rank 0 the tokens and the logits it
sampled from (or ``rank{rank}.error`` with the traceback).
"""

import os
import traceback
from pathlib import Path

import torch


class StandInGraph:
    """Replays by running ``forward`` over the graph's inputs into ``logits`` (a CUDA graph's
    replay rewrites its captured output tensor the same way). Its capture runs nothing, as a
    CUDA capture runs no collective (NCCL's are recorded): ``logits`` takes its shape at the
    first replay (``resize_``, the same tensor object)."""

    def __init__(self, run, logits: torch.Tensor, events: list, shape: tuple, wrong: bool):
        self.run, self.logits, self.events, self.shape, self.wrong = (run, logits, events,
                                                                      shape, wrong)

    def replay(self) -> None:
        self.events.append(("replay", self.shape))
        logits = self.run()
        self.logits.resize_(logits.shape).copy_(logits * 3.0 if self.wrong else logits)


def _patch(rank: int, faults: dict, events: list) -> None:
    from atomk31.engine import cuda_graphs, rank as rank_module
    from atomk31.ops import Kernels

    rank_module.why_no_decode_graphs = lambda *args, **kwargs: None
    select = rank_module.select_kernels

    def eager_as_graph(backend, context):
        kernels = select(backend, context)
        return Kernels(kernels.backend, kernels.context, kernels.eager, kernels.eager)
    rank_module.select_kernels = eager_as_graph

    def matches(fault: str, shape: tuple) -> bool:
        return fault in faults and faults[fault] == [rank, *shape]

    def record(self, inputs):
        shape = (inputs.batch_size, inputs.context)
        events.append(("capture", shape))
        if matches("fail_capture", shape):
            raise RuntimeError(f"injected capture failure on rank {rank}")
        logits = torch.empty(0)
        graph = StandInGraph(lambda: self.forward(inputs.batch, self.graph_ops), logits, events,
                             shape, matches("wrong_replay", shape))
        return graph, logits
    cuda_graphs.DecodeGraphs._record = record

    agrees = cuda_graphs.DecodeGraphs._replay_agrees

    def checked(self, graph, request, shape):
        events.append(("check", shape))
        return agrees(self, graph, request, shape)
    cuda_graphs.DecodeGraphs._replay_agrees = checked

    init = cuda_graphs.DecodeGraphs.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _GRAPHS.append(self)
    cuda_graphs.DecodeGraphs.__init__ = remember


_GRAPHS: list = []


def run_rank(rank: int, world: int, port: int, checkpoint: str, options: dict,
             prompts: list[list[int]], max_tokens: int, faults: dict, out_dir: str) -> None:
    out = Path(out_dir)
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        events: list = []
        _patch(rank, faults, events)
        result: dict = {}
        if rank == 0:
            result.update(generate(checkpoint, options, prompts, max_tokens))
        else:
            from atomk31.config import EngineConfig, torchrun_rank
            from atomk31.engine.worker import run_torchrun_worker

            run_torchrun_worker(EngineConfig(model=checkpoint, **options), torchrun_rank())
        graphs = _GRAPHS[0]
        result.update(events=events, refused=sorted(graphs.refused), enabled=graphs.enabled,
                      num_replays=graphs.num_replays)
        torch.save(result, out / f"rank{rank}.pt")
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def generate(checkpoint: str, options: dict, prompts, max_tokens: int) -> dict:
    """Greedy tokens and, per request and position, the logits row each token was sampled
    from (the runner's `sample`, which sees replayed and eager logits alike), over two rounds:
    the prompts, then each prompt with its output and three more tokens, whose prefix-cache
    hits restore KDA snapshots that decode steps took."""
    from atomk31 import LLM, SamplingParams

    with LLM(checkpoint, **options) as llm:
        runner, logits = llm.engine.runner, {}
        sample = runner.sample

        def recording(sampling, rows):
            for row, item in zip(rows, sampling):
                position = item.seq.num_computed_tokens + item.num_new_tokens - 1
                logits[item.seq.request_id, position] = row.float().cpu().clone()
            return sample(sampling, rows)
        runner.sample = recording
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate(prompts, params)
        again = [p + o.outputs[0].token_ids + [1, 2, 3] for p, o in zip(prompts, outputs)]
        outputs += llm.generate(again, params)
        engine = llm.engine
        free = (engine.block_pool.num_free_blocks == engine.block_pool.num_blocks and
                engine.state_pool.num_free_slots + engine.snapshots.num_snapshots
                == engine.state_pool.num_slots)
    return {"tokens": [o.outputs[0].token_ids for o in outputs], "logits": logits,
            "pools_free": free, "cached": [o.num_cached_tokens for o in outputs],
            "prompt_lens": [len(p) for p in prompts + again]}
