"""Runs one rank of a distributed LLM the way torchrun does, recording what the ranks select.

Each rank is its own process with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT): rank 0 builds `LLM(...)` and generates, the others run
`run_torchrun_worker`, exactly as `atomk31 serve` does under torchrun. In every rank the DCP
top-k is wrapped to record each call's local scores, row positions, k and the local selection;
rank 0 also records its tokens and sampled logits. Each rank writes what it recorded to
``out_dir / f"rank{rank}.pt"`` (or the traceback to ``rank{rank}.error``).
"""

import os
import traceback
from pathlib import Path

import torch


def run_rank(rank: int, world: int, port: int, checkpoint: str, options: dict,
             prompts: list[list[int]], max_tokens: int, out_dir: str) -> None:
    out = Path(out_dir)
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        records = _record_dcp_topk()
        result = {"topk": records}
        if rank == 0:
            result.update(_generate(checkpoint, options, prompts, max_tokens))
        else:
            from atomk31.config import EngineConfig, torchrun_rank
            from atomk31.engine.worker import run_torchrun_worker

            run_torchrun_worker(EngineConfig(model=checkpoint, **options), torchrun_rank())
        torch.save(result, out / f"rank{rank}.pt")
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def _record_dcp_topk() -> list[dict]:
    from atomk31.model import dcp_attention

    records: list[dict] = []
    original = dcp_attention.dcp_topk_positions

    def recording(scores, k, positions, comm):
        local = original(scores, k, positions, comm)
        records.append({"scores": scores.clone(), "k": k, "positions": positions.clone(),
                        "local": local.clone()})
        return local

    dcp_attention.dcp_topk_positions = recording
    return records


def _generate(checkpoint: str, options: dict, prompts, max_tokens: int) -> dict:
    from atomk31 import LLM, SamplingParams
    from sampled_logits import SampledLogits

    with LLM(checkpoint, **options) as llm:
        recorder = SampledLogits(llm)
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                       ignore_eos=True))
        engine = llm.engine
        free = (engine.block_pool.num_free_blocks == engine.block_pool.num_blocks and
                engine.state_pool.num_free_slots + engine.snapshots.num_snapshots
                == engine.state_pool.num_slots)
    return {"tokens": [o.outputs[0].token_ids for o in outputs],
            "logits": dict(recorder.logits), "pools_free": free}
