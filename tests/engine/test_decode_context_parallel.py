"""Decode context parallelism on CPU (gloo) equals one process (issue 18), ranks run by a
torchrun-like launcher (``tests/dcp_ranks.py``: the ``env://`` path of multi-node serving).

Configurations: DCP2 = ``--tensor-parallel-size 2 --decode-context-parallel-size 2``, DCP4 =
4 / 4, TP2 x DCP2 = 4 / 2 (two head groups, each over two token shards). Two prompts of 70 and
150 tokens are prefilled in chunks of 64 tokens and decoded 4 steps; index_topk is 64, so
most steps select.

The checkpoint is the tiny one with MLA layer 3's index-key projection zeroed: its keys are
all the LayerNorm bias, so every key of a row scores the same and the selection is decided by
the tie rule alone (the lowest positions), with the threshold tie spread over every rank.
Layer 7 keeps random scores. For every MLA layer and step:

* the union of the ranks' selections is exactly the single-device top-k of the scores the
  ranks computed (assembled from their shards);
* it equals the one-process engine's selection exactly on the tied layer. On layer 7 the
  ranks' scores are the one process's only up to the forward's summation order (TP's
  all-reduces, the LSE merge), and FP8 index keys turn a 1e-7 difference into a 1e-3 one
  where a key or query rounds the other way: rows whose scores agree (within 1e-5 of their
  largest) must select the same keys up to swaps at the threshold among near-ties (MODEL_SPEC
  §9 #5); rows with such a flip may differ, and there must be few of them (10%).

Tokens must equal one process's, logits agree within 1e-5 of the largest, pools end free.
"""

import dataclasses
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import dcp_ranks
from rank_processes import run_rank_processes
from atomk31 import LLM, SamplingParams
from atomk31.ops.topk import topk_positions_torch
from sampled_logits import SampledLogits, largest_difference

pytestmark = pytest.mark.slow

OPTIONS = dict(block_size=16, kernel_backend="torch", kv_cache_memory=64 << 20, max_num_seqs=8,
               max_num_batched_tokens=64)
MAX_TOKENS = 4
TIED_KEYS = "language_model.model.layers.3.self_attn.indexer.wk.weight"
NEAR_TIE = 1e-6


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 768, (n,), generator=g).tolist() for n in (70, 150)]


@pytest.fixture(scope="module")
def tied_checkpoint(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-tied")
    for file in tiny_checkpoint.iterdir():
        shutil.copy(file, out / file.name)
    tensors = load_file(out / "model.safetensors")
    tensors[TIED_KEYS] = torch.zeros_like(tensors[TIED_KEYS])
    save_file(tensors, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def one_process(tied_checkpoint):
    """Tokens, sampled logits and every top-k call's (scores, k, lengths) of one process."""
    llm = LLM(tied_checkpoint, **OPTIONS)
    calls = []

    def wrap(op, fn):
        if op != "topk_slots":
            return fn

        def recorded(scores, k, lengths, *rest):
            calls.append((scores.clone(), k, lengths.clone()))
            return fn(scores, k, lengths, *rest)
        return recorded

    runner = llm.engine.runner
    runner.kernels = dataclasses.replace(runner.kernels, eager=runner.kernels.eager.wrapped(wrap))
    recorder = SampledLogits(llm)
    outputs = llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                     ignore_eos=True))
    return [o.outputs[0].token_ids for o in outputs], recorder.logits, calls


def run_ranks(checkpoint, tp: int, dcp: int, out_dir) -> list[dict]:
    options = dict(OPTIONS, tensor_parallel_size=tp, decode_context_parallel_size=dcp)
    return run_rank_processes(dcp_ranks.run_rank, tp,
                              (str(checkpoint), options, prompts(), MAX_TOKENS), out_dir)


def group_selection(records: list[dict], dcp: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the union of a DCP group's selections as global positions [Nq, k], the scores its
    ranks computed assembled into [Nq, L], k) for one call."""
    first = records[0]
    positions, k = first["positions"], first["k"]
    length = int(positions.max()) + 1
    scores = torch.full((positions.shape[0], length), -torch.inf)
    chosen = []
    for rank, record in enumerate(records):
        columns = torch.arange(rank, length, dcp)
        scores[:, columns] = record["scores"][:, :columns.numel()]
        local = record["local"]
        chosen.append(torch.where(local >= 0, local * dcp + rank, length + 1))
    union = torch.sort(torch.cat(chosen, dim=1), dim=1).values[:, :k]
    return torch.where(union <= length, union, -1), scores, k


def assert_same_selection_where_scores_agree(got, want, scores, scores_one, k) -> None:
    """Rows whose scores agree between the runs select the same keys, up to swaps at the
    threshold among near-ties; rows whose scores moved (an FP8 rounding flip of a key or a
    query, from a different summation order upstream) may select differently, but they are
    few."""
    is_key = torch.isfinite(scores_one)
    largest = torch.where(is_key, scores_one.abs(), 0).amax(1)
    moved = torch.where(is_key, (scores - scores_one).abs(), 0).amax(1) > NEAR_TIE * 10 * largest
    differs = ~(got == want).all(1)
    assert int(differs.sum()) <= max(1, got.shape[0] // 10), int(differs.sum())
    for row in torch.nonzero(differs & ~moved).flatten().tolist():
        ours, theirs = set(got[row].tolist()) - {-1}, set(want[row].tolist()) - {-1}
        ranked = torch.sort(scores_one[row].masked_fill(scores_one[row] == 0, 0.0),
                            descending=True)
        threshold = ranked.values[k - 1]
        for position in ours ^ theirs:
            assert abs(scores_one[row, position] - threshold) <= NEAR_TIE * largest[row], row


@pytest.mark.parametrize("tp,dcp", [(2, 2), (4, 4), (4, 2)], ids=["dcp2", "dcp4", "tp2xdcp2"])
def test_dcp_selects_and_attends_as_one_process(tied_checkpoint, one_process, tmp_path, tp,
                                                dcp):
    tokens, logits, single_calls = one_process
    ranks = run_ranks(tied_checkpoint, tp, dcp, tmp_path)
    first = ranks[0]
    assert first["pools_free"], "blocks or KDA slots leaked"
    assert first["tokens"] == tokens
    assert largest_difference(first["logits"], logits) <= 1e-5
    calls = [r["topk"] for r in ranks]
    assert len(calls[0]) == len(single_calls) and len(single_calls) >= 4
    for i, (scores_one, k_one, lengths) in enumerate(single_calls):
        group_picks = []
        for group in range(tp // dcp):
            members = [calls[r][i] for r in range(group * dcp, (group + 1) * dcp)]
            got, scores, k = group_selection(members, dcp)
            assert torch.equal(got, topk_positions_torch(scores, k, lengths).long()), (i, group)
            group_picks.append(got)
        assert all(torch.equal(p, group_picks[0]) for p in group_picks)
        want = topk_positions_torch(scores_one, k_one, lengths).long()
        if i % 2 == 0:       # MLA layer 3 (every key tied): the tie rule alone decides
            assert torch.equal(got, want), i
            lowest = torch.arange(k_one)[None, :]
            assert torch.equal(want, torch.where(lowest < lengths[:, None], lowest, -1))
        else:
            assert_same_selection_where_scores_agree(got, want, scores, scores_one, k_one)
