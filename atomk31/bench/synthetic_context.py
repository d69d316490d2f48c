"""Requests placed at a long context without prefilling them, for `atomk31 bench latency`.

Prefilling 16-64 requests of 32K-128K tokens for real would take minutes per figure, and decode
speed does not depend on what the cache holds. `place_batch` therefore adds each request with a
random prompt, marks all but its last prompt token computed (`Scheduler.place_computed`: a KDA
state slot and the blocks covering those tokens) and fills what a prefill would have written
with random values in the engine's own formats: every MLA layer's latent rows and index keys go
through the engine's `kv_write` op (so FP8/MXFP4 codes and scales are valid), and the KDA
recurrent and conv states are drawn in their pool dtypes. The first decode step then computes
the last prompt token, attending `first_context` keys, exactly as after a real prefill.
"""

from __future__ import annotations

import numpy as np
import torch

from atomk31.bench.errors import BenchmarkError
from atomk31.bench.random_tokens import ordinary_token_ids, random_token_ids
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.sequence import Sequence

FILL_CHUNK_TOKENS = 1 << 15   # rows written per kv_write call (bounds the temporaries)
STATE_STD = 0.1               # spread of the random recurrent state (keeps outputs finite)


class CacheTooSmallError(BenchmarkError):
    """The engine's cache cannot hold the requested batch at the requested context."""


def place_batch(engine: LLMEngine, num_requests: int, first_context: int, num_steps: int,
                rng: np.random.Generator) -> list[str]:
    """Add `num_requests` greedy requests whose next `num_steps` decode steps attend
    first_context, first_context + 1, ... keys, with their earlier tokens placed synthetically
    (module docstring); -> their request ids. Raises CacheTooSmallError (nothing left placed)
    when the cache cannot hold them through those steps."""
    if first_context < 1:
        raise BenchmarkError(f"first_context must be >= 1, got {first_context}")
    _check_room(engine, num_requests, first_context + num_steps - 1)
    pool = ordinary_token_ids(engine.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=num_steps, ignore_eos=True)
    generator = torch.Generator(device=engine.device).manual_seed(int(rng.integers(1 << 31)))
    request_ids: list[str] = []
    for _ in range(num_requests):
        request_id = engine.add_request(random_token_ids(pool, first_context, rng), params)
        request_ids.append(request_id)
        seq = engine.requests[request_id].seqs[0]
        if first_context == 1:
            continue                    # nothing precedes the first token: a plain admission
        if not engine.scheduler.place_computed(seq, first_context - 1):
            for placed in request_ids:
                engine.abort_request(placed)
            raise CacheTooSmallError(_room_message(engine, num_requests, first_context))
        write_random_cache(engine, seq, first_context - 1, generator)
    return request_ids


def write_random_cache(engine: LLMEngine, seq: Sequence, num_tokens: int,
                       generator: torch.Generator) -> None:
    """Fill the cache rows of positions 0..num_tokens-1 of `seq` (every MLA layer) and its KDA
    state slot with random values in the engine's formats."""
    config, device = engine.model_config, engine.device
    block_size = engine.scheduler.block_size
    table = torch.tensor(seq.block_table, dtype=torch.int64, device=device)
    for start in range(0, num_tokens, FILL_CHUNK_TOKENS):
        positions = torch.arange(start, min(num_tokens, start + FILL_CHUNK_TOKENS), device=device)
        slots = table[positions // block_size] * block_size + positions % block_size
        for view in engine.runner.kv_views:
            latent = _randn(len(positions), config.latent_dim, generator, engine)
            key = (_randn(len(positions), config.index_head_dim, generator, engine)
                   if config.has_indexer else None)
            engine.kernels.eager.kv_write(latent, key, slots, view.latent, view.latent_scale,
                                         view.index_values, view.index_scales,
                                         engine.config.index_cache_format,
                                         engine.config.fp8_variant)
    state = engine.state_pool
    state.recurrent[:, seq.state_slot].normal_(0.0, STATE_STD, generator=generator)
    state.conv[:, seq.state_slot].normal_(0.0, 1.0, generator=generator)


def blocks_needed(engine: LLMEngine, num_requests: int, max_context: int) -> int:
    """Blocks that `num_requests` requests of `max_context` tokens hold at once."""
    return num_requests * -(-max_context // engine.scheduler.block_size)


def _check_room(engine: LLMEngine, num_requests: int, max_context: int) -> None:
    pool, scheduler = engine.block_pool, engine.scheduler
    free_slots = engine.state_pool.num_free_slots
    if (blocks_needed(engine, num_requests, max_context) > pool.num_free_blocks
            or num_requests > min(free_slots, scheduler.max_num_seqs - len(scheduler.running))):
        raise CacheTooSmallError(_room_message(engine, num_requests, max_context))


def _room_message(engine: LLMEngine, num_requests: int, context: int) -> str:
    return (f"{num_requests} requests at a context of {context} tokens need "
            f"{blocks_needed(engine, num_requests, context)} cache blocks and {num_requests} "
            f"KDA state slots; the engine has {engine.block_pool.num_free_blocks} free blocks, "
            f"{engine.state_pool.num_free_slots} free slots and --max-num-seqs "
            f"{engine.scheduler.max_num_seqs}. Lower --batch-sizes or --context-lens, or raise "
            "--kv-cache-memory / --gpu-memory-utilization / --max-num-seqs")


def _randn(rows: int, cols: int, generator: torch.Generator, engine: LLMEngine) -> torch.Tensor:
    return torch.randn(rows, cols, generator=generator, device=engine.device).to(
        engine.config.compute_dtype)
