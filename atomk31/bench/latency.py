"""`atomk31 bench latency`: prefill time and decode step time of the engine, in process, each
beside its roofline (roofline.py) over the ceilings measured in the same run (ceilings.py).

Prefill (measured for real): a fresh random prompt of P tokens is added alone and the engine
steps until its first token is sampled; TTFT is that wall time (the device synchronized before
and after), chunked by --max-num-batched-tokens as a server would. One untimed run of each
length precedes the timed ones (compiles, autotuning). MFU = prefill FLOPs / TTFT / matrix rate.

Decode (contexts placed synthetically, steps run by the engine): B requests are placed at a
context (synthetic_context.py), then the engine runs W warm-up steps (CUDA-graph capture happens
here), one eager step whose `moe_route` calls are recorded (the distinct experts of the batch),
and N timed steps, each `engine.step()` exactly as the engine runs it (graphs when they are on:
scheduling, input copies, replay, sampling, stop checks), timed one by one with the device
synchronized around it. The timed steps end one key short of the nominal context C (the step
attending the C-th key would take a KDA prefix snapshot when C is a multiple of
--kda-snapshot-interval, as 2048, 32768 and 131072 are): they attend C - N .. C - 1 keys.
MBU = step bytes / median step time / copy bandwidth.

With speculative decoding (--speculative-config) a step verifies drafts and emits up to
1 + num_speculative_tokens tokens per request: the window leaves room for that many per step,
the timed steps' speculation counters give the tokens emitted per request and step, and
tokens/s = batch x that / median step time. Synthetic contexts are random tokens, so their
acceptance is not the model's on real text (benchmarks/engine/ has task-based measurements).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from atomk31.bench.ceilings import Ceilings, synchronize
from atomk31.bench.errors import BenchmarkError
from atomk31.bench.instrumented_ops import OpWatcher, watched_eager_steps
from atomk31.bench.random_tokens import ordinary_token_ids, random_token_ids
from atomk31.bench.roofline import StorageFormat, decode_step_bytes, prefill_flops
from atomk31.bench.synthetic_context import CacheTooSmallError, place_batch
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class LatencyOptions:
    batch_sizes: tuple[int, ...]
    context_lens: tuple[int, ...]
    prefill_lens: tuple[int, ...]
    num_steps: int
    warmup_steps: int
    num_prefill_runs: int
    seed: int


def storage_format(engine: LLMEngine) -> StorageFormat:
    """What the engine's weights and cache are stored as (for the byte model)."""
    moe = [layer.ffn for layer in engine.model.layers if hasattr(layer.ffn, "is_mxfp4")]
    rc = engine.config
    return StorageFormat(compute_dtype=rc.compute_dtype,
                         online_quant_config=rc.options.online_quant_config,
                         experts_mxfp4=moe[0].is_mxfp4 if moe else True,
                         latent_dtype=rc.latent_cache_dtype,
                         index_format=rc.index_cache_format, fp8_variant=rc.fp8_variant)


def step_stats(seconds: list[float]) -> dict:
    """Median, mean, min and max of step times, in milliseconds."""
    ms = [s * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "mean": statistics.fmean(ms), "min": min(ms),
            "max": max(ms)}


def timed_step(engine: LLMEngine) -> float:
    """Wall seconds of one engine step, the device synchronized before and after."""
    synchronize(engine.device)
    start = time.perf_counter()
    engine.step()
    synchronize(engine.device)
    return time.perf_counter() - start


def measure_prefill(engine: LLMEngine, num_tokens: int, num_runs: int, ceilings: Ceilings,
                    rng: np.random.Generator) -> dict:
    """TTFT of a fresh `num_tokens`-token prompt (module docstring); one untimed run first."""
    pool = ordinary_token_ids(engine.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    runs, num_chunks = [], 0
    for run in range(num_runs + 1):
        engine.add_request(random_token_ids(pool, num_tokens, rng), params)
        seconds, num_chunks = 0.0, 0
        while engine.has_unfinished_requests():
            seconds += timed_step(engine)
            num_chunks += 1
        if run > 0:
            runs.append(seconds)
    flops = prefill_flops(engine.model_config, num_tokens)
    ttft = statistics.median(runs)
    return {"num_tokens": num_tokens, "mode": "real prefill", "num_chunks": num_chunks,
            "ttft_ms": ttft * 1e3, "ttft_ms_runs": [s * 1e3 for s in runs],
            "flops": flops.total, "flops_by_part": vars(flops),
            "flop_per_s": flops.total / ttft,
            "mfu": flops.total / ttft / ceilings.matmul_flop_per_s}


def max_tokens_per_step(engine: LLMEngine) -> int:
    """Tokens a decode step can emit per request: 1, or 1 + the drafts verified."""
    spec = engine.config.speculative
    return 1 + (spec.num_speculative_tokens if spec is not None else 0)


def decode_window(context: int, num_steps: int, warmup_steps: int,
                  tokens_per_step: int = 1) -> tuple[int, int]:
    """(keys the first warm-up step attends, keys the first timed step attends at most): the
    window of warm-up, counting and timed steps, each emitting up to `tokens_per_step` tokens,
    ends at context - 1 keys at the latest (module docstring)."""
    window = (warmup_steps + 1 + num_steps) * tokens_per_step
    first = context - window
    if first < 1:
        raise BenchmarkError(f"context {context} is too short for {warmup_steps} warm-up, one "
                         f"counting and {num_steps} timed steps; pass --context-lens of at least "
                         f"{window + 1} or fewer --num-steps / --warmup-steps")
    return first, first + (warmup_steps + 1) * tokens_per_step


def measure_decode(engine: LLMEngine, batch_size: int, context: int, options: LatencyOptions,
                   ceilings: Ceilings, rng: np.random.Generator) -> dict:
    """Decode step time of `batch_size` requests near `context` keys (module docstring)."""
    per_step = max_tokens_per_step(engine)
    first, first_timed = decode_window(context, options.num_steps, options.warmup_steps,
                                       per_step)
    request_ids = place_batch(engine, batch_size, first,
                              (options.warmup_steps + 1 + options.num_steps) * per_step, rng)
    preemptions = engine.scheduler.num_preemptions
    try:
        for _ in range(options.warmup_steps):
            engine.step()
        recorder = OpWatcher(record_routes=True)
        with watched_eager_steps(engine, recorder):
            engine.step()
        replays, before = _graph_replays(engine), engine.speculation_stats()
        times = [timed_step(engine) for _ in range(options.num_steps)]
        replays = _graph_replays(engine) - replays
        speculation = (engine.speculation_stats().since(before)
                       if before is not None else None)
    finally:
        for request_id in request_ids:
            engine.abort_request(request_id)
    if engine.scheduler.num_preemptions != preemptions:
        raise CacheTooSmallError(f"the engine preempted requests while decoding {batch_size} "
                                 f"requests at context {context}: the cache is too small for "
                                 "them; raise --kv-cache-memory / --gpu-memory-utilization")
    middle = first_timed + options.num_steps // 2
    step_bytes = decode_step_bytes(engine.model_config, storage_format(engine),
                                   [middle] * batch_size, recorder.distinct_experts())
    stats = step_stats(times)
    seconds = stats["median"] * 1e-3
    notes = _window_notes(engine, first_timed, options.num_steps)
    if engine.runner.graphs is not None and replays < options.num_steps:
        refused = sorted(set(getattr(engine.runner.graphs, "refused", {}).values()))
        notes.append("CUDA graphs are on, but timed steps ran eagerly"
                     + (f": {'; '.join(refused)}" if refused else ""))
    return {"batch_size": batch_size, "context": context, "context_source": "synthetic",
            "mode": _decode_mode(replays, options.num_steps),
            "first_context": first_timed,
            "last_context": first_timed + options.num_steps * per_step - 1,
            "step_ms": stats, "step_ms_runs": [t * 1e3 for t in times],
            "num_distinct_experts": recorder.distinct_experts(),
            "bytes": {**vars(step_bytes), "total": step_bytes.total},
            "bytes_per_s": step_bytes.total / seconds,
            "mbu": step_bytes.total / seconds / ceilings.copy_bytes_per_s,
            **_tokens_per_step(speculation, batch_size, seconds), "notes": notes}


def _tokens_per_step(speculation, batch_size: int, step_seconds: float) -> dict:
    """Tokens each request got per timed step (1 without speculation), tokens/s, and the timed
    window's speculation counters (None without speculation)."""
    per_step = 1.0
    counts = None
    if speculation is not None:
        if speculation.num_verify_steps:
            per_step = speculation.mean_acceptance_length
        counts = {"verify_steps": speculation.num_verify_steps,
                  "draft_tokens": speculation.num_draft_tokens,
                  "accepted_tokens": speculation.num_accepted_tokens,
                  "acceptance_rate": speculation.acceptance_rate}
    return {"tokens_per_step": per_step, "tokens_per_s": batch_size * per_step / step_seconds,
            "speculation": counts}


def _graph_replays(engine: LLMEngine) -> int:
    """Decode steps replayed from CUDA graphs so far (0 without graphs)."""
    return getattr(engine.runner.graphs, "num_replays", 0)


def _decode_mode(num_replays: int, num_steps: int) -> str:
    if num_replays == num_steps:
        return "cuda-graph"
    return "eager" if num_replays == 0 else f"mixed ({num_replays} of {num_steps} from graphs)"


def _window_notes(engine: LLMEngine, first_context: int, num_steps: int) -> list[str]:
    """What in the timed window is not a plain decode step: KDA prefix snapshots (at the block
    ends the scheduler's snapshot interval picks) and graph context buckets crossed (each
    captures a graph)."""
    notes = []
    contexts = range(first_context, first_context + num_steps)
    block_size, every = engine.scheduler.block_size, engine.scheduler.snapshot_interval_blocks
    snapshots = sum(1 for n in contexts
                    if every and n % block_size == 0 and (n // block_size) % every == 0)
    if snapshots and engine.config.options.enable_prefix_caching:
        notes.append(f"{snapshots} timed step(s) take a KDA prefix snapshot "
                     "(--kda-snapshot-interval)")
    edges = getattr(engine.runner.graphs, "buckets", None)
    if edges:
        buckets = {min(b for b in edges if b >= n) for n in contexts if n <= edges[-1]}
        if len(buckets) > 1:
            notes.append(f"the timed steps span graph context buckets {sorted(buckets)}")
    return notes


def run_latency(engine: LLMEngine, options: LatencyOptions, ceilings: Ceilings) -> dict:
    """Every prefill length, then every (batch size, context); -> the result's figures."""
    rng = np.random.default_rng(options.seed)
    limit = engine.config.max_model_len
    too_long = [n for n in options.prefill_lens if n >= limit] + \
        [n for n in options.context_lens if n > limit]
    if too_long:
        raise BenchmarkError(f"--prefill-lens / --context-lens {too_long} do not fit the context "
                         f"length of {limit} tokens (a prefill also samples one token); pass "
                         "shorter lengths or a larger --max-model-len")
    prefill = [measure_prefill(engine, n, options.num_prefill_runs, ceilings, rng)
               for n in options.prefill_lens]
    decode = [measure_decode(engine, b, c, options, ceilings, rng)
              for c in options.context_lens for b in options.batch_sizes]
    return {"prefill": prefill, "decode": decode}
