"""Engine test fixtures: a spy that records the logits of every token the model computes."""

import gc
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from atomk31 import LLM


class LogitRecorder:
    """Wraps an LLM's runner so that each step computes logits for every token, keeps them by
    (request id, completion index, position), and hands the runner only the rows it asked for.
    Also counts the tokens each request had computed by the model (prefix-cache checks)."""

    def __init__(self, llm: LLM):
        runner = llm.engine.runner
        runner.graphs = None        # every step eager: logits of every token, read on the host
        model = runner.model
        self.logits: dict[tuple[str, int], dict[int, torch.Tensor]] = defaultdict(dict)
        self.num_computed: dict[str, int] = defaultdict(int)
        original_run, original_forward = runner.run, model.forward

        def run(scheduled):
            def forward(batch, *args):
                wanted = batch.logits_indices
                batch.logits_indices = torch.arange(batch.input_ids.numel())
                logits = original_forward(batch, *args)
                starts = batch.cu_seqlens.tolist()
                for r, item in enumerate(scheduled):
                    key = (item.seq.request_id, item.seq.index)
                    for i in range(starts[r], starts[r + 1]):
                        self.logits[key][int(batch.positions[i])] = logits[i].float().cpu()
                    self.num_computed[item.seq.request_id] += starts[r + 1] - starts[r]
                batch.logits_indices = wanted
                return logits[wanted]

            model.forward = forward
            try:
                return original_run(scheduled)
            finally:
                model.forward = original_forward

        runner.run = run

    def sequence_logits(self, request_id: str, index: int = 0) -> torch.Tensor:
        """[num positions, vocab] for positions 0..max, in order (every position must exist)."""
        rows = self.logits[(request_id, index)]
        return torch.stack([rows[p] for p in range(len(rows))])


@pytest.fixture(params=[
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(("triton", "cuda"), id="triton-cuda", marks=pytest.mark.gpu),
])
def backend(request) -> dict:
    """LLM keyword arguments for each kernel backend the equality tests run on."""
    kernel_backend, device = request.param
    return {"kernel_backend": kernel_backend, "device": device, "kv_cache_memory": 512 << 20}


@pytest.fixture
def record_logits() -> Callable[[LLM], LogitRecorder]:
    return LogitRecorder


def assert_pools_free(llm) -> None:
    """Every block free and every state slot either free or holding a prefix snapshot.
    `llm`: an LLM or an AsyncEngine (anything with `.engine`, the LLMEngine)."""
    engine = llm.engine
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks, "blocks leaked"
    held = engine.snapshots.num_snapshots
    pool = engine.state_pool
    assert pool.num_free_slots + held == pool.num_slots, "KDA state slots leaked"
    assert not engine.scheduler.has_unfinished() and not engine.requests


@pytest.fixture
def pools_free() -> Callable[[object], None]:
    return assert_pools_free


@pytest.fixture(autouse=True)
def free_engines():
    """An engine holds hundreds of MB, and the spies above patch methods into reference
    cycles that only a full collection frees: collect after every test, or the suite's
    memory grows by an engine per test."""
    yield
    gc.collect()
