"""The collectives `step_collectives` lists are the ones the layers issue, byte for byte
(distributed/collective_bytes.py), counted on the tiny model with its ranks as threads; and
the full model's figures (issue 18, README: Several GPUs)."""

from collections import Counter
from pathlib import Path

import pytest
import torch

from atomk31.config import EngineConfig, ModelConfig
from atomk31.distributed.collective_bytes import (
    figures_table, per_mla_layer_row_bytes, step_bytes_sent, step_collectives,
)
from atomk31.distributed.communicator import LocalCommunicator
from atomk31.distributed.layout import ParallelLayout
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.engine.rank import build_rank
from atomk31.engine.step_batch import StepRequest
from k31_config import k31_pro_config
from thread_ranks import CountingCommunicator, run_ranks

PROMPT = list(range(1, 101))       # 100 tokens: past index_topk (64), so the step selects


def counted_steps(checkpoint, tp: int, dcp: int, token_sharded_from: int) -> list[dict]:
    """Per rank: Counter of (group, collective, payload) for a 100-token prefill and a decode."""
    options = EngineConfig(model=str(checkpoint), block_size=16, kernel_backend="torch",
                           kv_cache_memory=32 << 20, max_num_seqs=2, max_model_len=256)
    model_config = ModelConfig.from_pretrained(checkpoint)
    config = options.resolve(model_config, torch.device("cpu"))

    def rank_body(comm):
        layout = ParallelLayout(tp, comm.rank, dcp)
        tp_comm = CountingCommunicator(comm)
        dcp_comm = (CountingCommunicator(comm.split(layout.dcp_group_ranks())) if dcp > 1
                    else LocalCommunicator())
        parallel = ParallelContext(layout, tp_comm, dcp_comm, token_sharded_from)
        parts = build_rank(options, model_config, config, torch.device("cpu"), parallel)
        table = list(range(8))
        steps = [StepRequest(PROMPT, 0, table, 0, True), StepRequest([7], 100, table, 0, True)]
        counts = []
        for request in steps:
            tp_comm.calls.clear()
            if dcp > 1:
                dcp_comm.calls.clear()
            parts.runner.forward(parts.runner.build([request]))
            counted = Counter(("tp",) + call for call in tp_comm.calls)
            if dcp > 1:
                counted += Counter(("dcp",) + call for call in dcp_comm.calls)
            counts.append(counted)
        return counts

    return run_ranks(tp, rank_body)


def listed(config, layout, num_rows, token_sharded) -> Counter:
    counts = Counter()
    for c in step_collectives(config, layout, num_rows, 1, compute_bytes=4,
                              token_sharded=token_sharded):
        counts[(c.group, c.kind, c.payload)] += c.calls
    return counts


def without_tie_exchanges(counts: Counter, num_rows: int, k: int) -> Counter:
    """The counts less the DCP top-k's positions exchange (int64 [rows, k]), which runs only
    when a tie straddles the threshold (ReLU zeros do, in short contexts)."""
    return Counter({key: n for key, n in counts.items()
                    if key != ("dcp", "all_gather", num_rows * k * 8)})


@pytest.mark.parametrize("tp,dcp,token_sharded", [(2, 1, True), (2, 2, False)],
                         ids=["tp2-token-sharded", "tp2-dcp2"])
def test_listed_collectives_are_the_ones_the_layers_issue(tiny_checkpoint, tp, dcp,
                                                          token_sharded):
    config = ModelConfig.from_pretrained(tiny_checkpoint)
    ranks = counted_steps(tiny_checkpoint, tp, dcp, 64 if token_sharded else 1 << 20)
    k = config.index_topk
    for rank, (prefill, decode) in enumerate(ranks):
        layout = ParallelLayout(tp, rank, dcp)
        assert without_tie_exchanges(prefill, 100, k) == listed(config, layout, 100,
                                                                token_sharded), rank
        assert without_tie_exchanges(decode, 1, k) == listed(config, layout, 1, False), rank


def full_model() -> ModelConfig:
    return ModelConfig.from_dict(k31_pro_config())


def test_full_model_figures_per_decode_row_and_per_mla_layer():
    """The seed's DCP figures: 8 KiB of candidate scores per query row per GPU (k = 2048);
    about 119 KiB per verification row per MLA layer at DCP8 all told."""
    config = full_model()
    dcp8 = ParallelLayout(8, 0, 8, expert_parallel=True)
    calls = {c.where: c for c in step_collectives(config, dcp8, 1, 1)}
    assert calls["DCP top-k candidate scores (fp32)"].payload == 8 * 1024
    per_mla_layer = sum(c.payload for c in calls.values()
                        if c.where.startswith(("DCP", "MLA")))
    assert 115 * 1024 <= per_mla_layer <= 120 * 1024, per_mla_layer / 1024
    tp8 = ParallelLayout(8, 0, 1, expert_parallel=True)
    assert step_bytes_sent(step_collectives(config, tp8, 1, 1), tp8) < \
        step_bytes_sent(step_collectives(config, dcp8, 1, 1), dcp8)


def test_the_readme_quotes_these_figures():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert figures_table(full_model()) in readme, "regenerate the README's Several GPUs table"
    assert f"{per_mla_layer_row_bytes(full_model(), ParallelLayout(8, 0, 8, True)) / 1024:.1f} " \
        "KiB all" in readme.replace("\n", " ")
