"""Decode graphs under several ranks (issue 18): every rank captures, checks and replays the same
shapes in the same order, what one rank decides alone is agreed, and the tokens are those of
one process.

On CPU with gloo, through a stand-in for CUDA's capture (``tests/graph_ranks.py``: its replay
runs the step's forward, collectives included, over the graph's own inputs): the engine's
graph logic, its agreement collectives and the workers' loop run as on GPUs. Prompts of 10, 30
and 60 tokens decode 6 tokens as 3 requests padded to a graph of 4, at context 64 until the
longest passes position 63 and at 256 after (the indexer's top-k edge, 64, is a bucket edge).
A second round sends each prompt again with its output and three more tokens: its prefix-cache
hit restores a KDA snapshot a replayed decode step took (one every block of 16 tokens), so a
snapshot missed, or repeated a step late on the other ranks, changes its logits.
"""

import pytest
import torch

import graph_ranks
from rank_processes import run_rank_processes

pytestmark = pytest.mark.slow

OPTIONS = dict(block_size=16, kernel_backend="torch", kv_cache_memory=64 << 20, max_num_seqs=8,
               kda_snapshot_interval=16)
MAX_TOKENS = 6
SHAPES = [(4, 64), (4, 256)]
TOLERANCE = 1e-5          # of the largest |logit|


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(23)
    return [torch.randint(0, 768, (n,), generator=g).tolist() for n in (10, 30, 60)]


@pytest.fixture(scope="module")
def one_process(tiny_checkpoint):
    return graph_ranks.generate(str(tiny_checkpoint), OPTIONS, prompts(), MAX_TOKENS)


def run_ranks(checkpoint, out_dir, tp: int = 2, dcp: int = 1, faults=None) -> list[dict]:
    options = dict(OPTIONS, tensor_parallel_size=tp, decode_context_parallel_size=dcp)
    return run_rank_processes(graph_ranks.run_rank, tp, (str(checkpoint), options, prompts(),
                                                        MAX_TOKENS, faults or {}), out_dir)


def assert_equals_one_process(first: dict, one_process: dict) -> None:
    assert first["tokens"] == one_process["tokens"]
    assert first["logits"].keys() == one_process["logits"].keys()
    for key, row in first["logits"].items():
        want = one_process["logits"][key]
        assert (row - want).abs().max() <= TOLERANCE * want.abs().max(), key
    assert first["pools_free"]
    second_round = range(len(prompts()), len(first["cached"]))
    # a hit past the first round's prompt: the state came from a decode step's snapshot
    assert any(first["cached"][i] > first["prompt_lens"][i - len(prompts())]
               for i in second_round), first["cached"]


@pytest.mark.parametrize("tp,dcp", [(2, 1), (2, 2)], ids=["tp2", "tp2-dcp2"])
def test_ranks_replay_the_same_graphs_and_equal_one_process(tiny_checkpoint, one_process,
                                                            tmp_path, tp, dcp):
    ranks = run_ranks(tiny_checkpoint, tmp_path, tp, dcp)
    assert_equals_one_process(ranks[0], one_process)
    events = ranks[0]["events"]
    captured = [shape for event, shape in events if event == "capture"]
    assert captured == SHAPES, events
    # each shape: capture, check (one replay of its own), then one replay per decode step
    decode_steps = 2 * (MAX_TOKENS - 1)
    assert ranks[0]["num_replays"] == decode_steps
    assert sum(event == "replay" for event, _ in events) == decode_steps + len(SHAPES)
    for other in ranks[1:]:
        assert other["events"] == events           # the same graphs, in the same order
        assert other["num_replays"] == ranks[0]["num_replays"]
        assert other["refused"] == [] and other["enabled"]


def test_what_one_rank_finds_wrong_every_rank_refuses(tiny_checkpoint, one_process, tmp_path):
    """Rank 1's capture of the first shape fails; rank 0's replay of the second is wrong (only
    rank 0 can see it: it alone holds the whole logits). Both shapes must run eagerly on both
    ranks, and the tokens stay those of one process."""
    faults = {"fail_capture": [1, *SHAPES[0]], "wrong_replay": [0, *SHAPES[1]]}
    ranks = run_ranks(tiny_checkpoint, tmp_path, faults=faults)
    assert_equals_one_process(ranks[0], one_process)
    for rank in ranks:
        assert rank["refused"] == SHAPES and rank["enabled"] and rank["num_replays"] == 0
    assert ranks[1]["events"] == ranks[0]["events"]
    assert [e for e, _ in ranks[0]["events"]] == ["capture", "capture", "check", "replay"]
