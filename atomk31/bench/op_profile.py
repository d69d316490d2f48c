"""`atomk31 bench latency --profile FILE`: where the time of one decode step and of one prefill
chunk goes, per op of the op table (and per kernel on a GPU), through `torch.profiler`.

The profiled steps run eagerly: every op call runs inside `record_function("op:<name>")`
(instrumented_ops.py), which a CUDA-graph replay would skip; a replay launches the same kernels
(except where a launcher picks a capturable variant). Work outside the op table (the matmuls of
BF16 linears, embedding gathers, residual adds, sampling, scheduling) is the step's remainder.
Where the engine has decode graphs, the same decode batch is also profiled as a graph replay
("decode_graph": no op ranges, but the kernels the replay ran, their summed device time beside
the step's wall time, so the gaps between kernels show).
The decode step runs `batch_size` requests placed at `context` (attending context - 1 keys,
one untimed eager step first);
the prefill chunk is the first engine step of a fresh `num_tokens`-token prompt.

Outputs: FILE holds the breakdown as JSON; the Chrome traces (chrome://tracing, Perfetto) go
beside it as `<FILE stem>.decode.trace.json` and `<FILE stem>.prefill.trace.json`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from atomk31.bench.ceilings import synchronize
from atomk31.bench.environment import write_result_file
from atomk31.bench.instrumented_ops import OpWatcher, watched_eager_steps
from atomk31.bench.random_tokens import ordinary_token_ids, random_token_ids
from atomk31.bench.synthetic_context import place_batch
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.sampling_params import SamplingParams

OP_PREFIX, STEP_PREFIX = "op:", "step:"
NUM_TOP_KERNELS = 20


def trace_path(path: Path, step: str) -> Path:
    return path.with_name(f"{path.stem}.{step}.trace.json")


def profile_steps(engine: LLMEngine, batch_size: int | None, context: int | None,
                  prefill_tokens: int | None, path: Path, rng: np.random.Generator) -> dict:
    """Profile one decode step and one prefill chunk (either may be None: skipped), write the
    breakdown to `path` and the traces beside it; -> the breakdown."""
    result = {}
    if batch_size is not None and context is not None:
        result.update(_profile_decode(engine, batch_size, context, trace_path(path, "decode"),
                                      rng))
    if prefill_tokens is not None:
        result["prefill"] = _profile_prefill(engine, prefill_tokens,
                                             trace_path(path, "prefill"), rng)
    write_result_file(path, result)
    return result


def _profile_decode(engine: LLMEngine, batch_size: int, context: int, trace: Path,
                    rng: np.random.Generator) -> dict:
    """{"decode": the eager step's breakdown, "decode_graph": the replay's, where graphs exist}"""
    # every step stays below `context` (the timed steps' graph shape: one more key may need
    # another capture); the last profiled step attends context - 1 keys, as latency.py's end
    graphed = engine.runner.graphs is not None
    num_steps = 4 if graphed else 2
    request_ids = place_batch(engine, batch_size, context - num_steps, num_steps, rng)
    wrapper = OpWatcher(annotate=True)
    shape = {"batch_size": batch_size, "context": context}
    try:
        with watched_eager_steps(engine, wrapper):
            engine.step()                                 # compiles the eager kernels
            eager = _profile_one_step(engine, "decode", trace)
        result = {"decode": {**shape, "mode": "eager", **eager}}
        if graphed:
            engine.step()                                 # the batch's first replay
            replay_trace = trace.with_name(trace.name.replace(".decode.", ".decode_graph."))
            replay = _profile_one_step(engine, "decode_graph", replay_trace)
            result["decode_graph"] = {**shape, "mode": "graph", **replay}
    finally:
        for request_id in request_ids:
            engine.abort_request(request_id)
    return result


def _profile_prefill(engine: LLMEngine, num_tokens: int, trace: Path,
                     rng: np.random.Generator) -> dict:
    prompt = random_token_ids(ordinary_token_ids(engine.tokenizer), num_tokens, rng)
    request_id = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
    wrapper = OpWatcher(annotate=True)
    try:
        with watched_eager_steps(engine, wrapper):
            breakdown = _profile_one_step(engine, "prefill", trace)
    finally:
        engine.abort_request(request_id)
    chunk = min(num_tokens, engine.scheduler.max_num_batched_tokens)
    return {"num_tokens": num_tokens, "chunk_tokens": chunk, "mode": "eager", **breakdown}


def _profile_one_step(engine: LLMEngine, step: str, trace: Path) -> dict:
    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(engine.device)
    with profile(activities=activities) as prof:
        with record_function(STEP_PREFIX + step):
            start = time.perf_counter()
            engine.step()
            synchronize(engine.device)
            wall_ms = (time.perf_counter() - start) * 1e3
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    return {**op_breakdown(prof.key_averages(), STEP_PREFIX + step,
                           on_gpu=engine.device.type == "cuda"),
            "step_wall_ms": wall_ms, "trace": str(trace)}


def op_breakdown(events: list, step_key: str, on_gpu: bool) -> dict:
    """From profiler averages: the step's time, its time per op (`op:` ranges), the remainder
    outside the op table and the top kernels (GPU) or torch ops (CPU) by self time.

    On a GPU every range appears twice: as the host-side range, whose device time is the sum
    of the kernels launched inside it, and as its device-side annotation, whose time is the
    span from its first kernel's start to its last kernel's end, queueing included (eager
    launches run behind the host, so those spans overlap each other). Only the host-side
    ranges are read: their kernel times add up, and the step's is its busy time."""
    ranges = [e for e in events if e.key.startswith((OP_PREFIX, STEP_PREFIX))
              and getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    step = next(e for e in ranges if e.key == step_key)
    step_ms = _total_ms(step, on_gpu)
    ops = sorted(({"op": e.key[len(OP_PREFIX):], "calls": e.count, "ms": _total_ms(e, on_gpu),
                   "share": _total_ms(e, on_gpu) / step_ms if step_ms else 0.0}
                  for e in ranges if e.key.startswith(OP_PREFIX)), key=lambda r: -r["ms"])
    # on a GPU the kernels themselves (not the torch ops that launched them, which would count
    # each kernel twice); on a CPU the torch ops
    inner = [e for e in events if not e.key.startswith((OP_PREFIX, STEP_PREFIX))
             and (not on_gpu or getattr(e, "device_type", None) == DeviceType.CUDA)]
    top = sorted(inner, key=lambda e: -_self_ms(e, on_gpu))[:NUM_TOP_KERNELS]
    return {"time": "device" if on_gpu else "cpu", "step_ms": step_ms,
            "num_kernels" if on_gpu else "num_torch_ops": sum(e.count for e in inner),
            "step_cpu_ms": step.cpu_time_total / 1e3, "ops": ops,
            "outside_ops_ms": step_ms - sum(r["ms"] for r in ops),
            "top_kernels" if on_gpu else "top_torch_ops": [
                {"name": e.key, "calls": e.count, "self_ms": _self_ms(e, on_gpu)}
                for e in top if _self_ms(e, on_gpu) > 0]}


def _total_ms(event, on_gpu: bool) -> float:
    if not on_gpu:
        return event.cpu_time_total / 1e3
    return _first_attribute(event, "device_time_total", "cuda_time_total") / 1e3


def _self_ms(event, on_gpu: bool) -> float:
    if not on_gpu:
        return event.self_cpu_time_total / 1e3
    return _first_attribute(event, "self_device_time_total", "self_cuda_time_total") / 1e3


def _first_attribute(event, *names: str) -> float:
    """The first of `names` the profiler event has (torch renamed cuda_* to device_*)."""
    for name in names:
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0
