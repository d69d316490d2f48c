"""Decode steps of the engine from CUDA graphs against the same engine run eagerly
(`enforce_eager`), on the tiny checkpoint: what the graphs save is host time, so a model whose
kernels are short shows it undiluted.

Per batch size: N greedy requests (prompts across the tiny model's top-k edge, so dense and
sparse attention steps both run) decode DECODE_TOKENS tokens each; the run is repeated once
untimed first, so that capture and compiles are not counted. Figures: milliseconds per decode
step (wall time of the decode steps over their count, sampling included) and eager / graph.

Run: python -m benchmarks.engine.bench_decode_graphs [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result

BATCH_SIZES = (1, 8, 32, 64)
DECODE_TOKENS = 48
PROMPT_LENGTHS = (20, 60, 100, 200)   # the tiny model's index_topk is 64


def decode_ms_per_step(llm, batch: int) -> float:
    """Wall milliseconds per decode-only step of one generate call of `batch` requests."""
    from atomk31 import SamplingParams

    engine = llm.engine
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    for i in range(batch):
        length = PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)]
        engine.add_request(torch.randint(0, 768, (length,), generator=g).tolist(), params)
    total, steps = 0.0, 0
    while engine.has_unfinished_requests():
        decode = all(seq.num_computed_tokens > 0 for seq in engine.scheduler.running) and \
            not engine.scheduler.waiting
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        if decode:
            total += time.perf_counter() - start
            steps += 1
    return total / max(steps, 1) * 1e3


def run(out_dir: Path | None) -> dict:
    from atomk31 import LLM
    from atomk31.checkpoint import make_checkpoint

    checkpoint = Path(tempfile.mkdtemp()) / "tiny"
    make_checkpoint("tiny", seed=0, out=checkpoint)
    rows = []
    print(f"{'batch':>5} {'eager ms':>9} {'graph ms':>9} {'eager/graph':>11} graphs", flush=True)
    engines = {eager: LLM(checkpoint, block_size=16, device="cuda", enforce_eager=eager,
                          max_num_seqs=max(BATCH_SIZES), kv_cache_memory=2 << 30)
               for eager in (True, False)}
    for batch in BATCH_SIZES:
        row = {"batch": batch}
        for eager, llm in engines.items():
            decode_ms_per_step(llm, batch)                  # capture and compile: untimed
            row["eager_ms" if eager else "graph_ms"] = decode_ms_per_step(llm, batch)
        graphs = engines[False].engine.runner.graphs
        row["graphs_captured"] = len(graphs.graphs)
        row["graphs_enabled"] = graphs.enabled
        row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
        rows.append(row)
        print(f"{batch:>5} {row['eager_ms']:9.3f} {row['graph_ms']:9.3f} "
              f"{row['eager_over_graph']:11.2f} {row['graphs_captured']}"
              f"{'' if graphs.enabled else ' (OFF: capture failed)'}", flush=True)
    payload = {"model": "tiny (MODEL_SPEC §2.4: 8 layers, width 256)", "rows": rows,
               "decode_tokens": DECODE_TOKENS, "prompt_lengths": PROMPT_LENGTHS}
    path = write_result("decode_graphs", payload, out_dir)
    print(f"wrote {path}", flush=True)
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
