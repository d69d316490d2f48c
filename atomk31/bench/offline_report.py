"""The offline benchmarks' runs, tables and result files (`atomk31 bench latency | throughput`).

A result file holds `bench`, `environment` (environment.py), `settings` (the command line),
`engine` (what the flags resolved to on this device: backend, dtypes, graphs), the figures, and
for latency the `ceilings` measured at the start of the run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from atomk31.bench.ceilings import Ceilings, measure_ceilings
from atomk31.bench.environment import environment, write_result_file
from atomk31.bench.latency import LatencyOptions, run_latency
from atomk31.bench.op_profile import profile_steps
from atomk31.bench.throughput import run_throughput
from atomk31.engine.llm_engine import LLMEngine

NUM_TOP_PRINTED = 8   # kernels / torch ops printed per profiled step (the JSON holds more)


def engine_summary(engine: LLMEngine) -> dict:
    """What the engine flags resolved to on this device."""
    rc, options = engine.config, engine.config.options
    why_eager = engine.why_eager
    graphs = engine.runner.graphs
    if why_eager is None and graphs is not None and not getattr(graphs, "enabled", True):
        why_eager = "graph capture failed (see the log)"
    return {"model": options.model, "device": str(engine.device),
            "kernel_backend": engine.kernels.backend,
            "kernel_target": engine.kernels.context.target.name,
            "compute_dtype": rc.compute_dtype, "latent_cache_dtype": rc.latent_cache_dtype,
            "index_cache_format": rc.index_cache_format, "block_size": options.block_size,
            "max_model_len": rc.max_model_len,
            "max_num_batched_tokens": options.max_num_batched_tokens,
            "enable_prefix_caching": options.enable_prefix_caching,
            "online_quant_config": options.online_quant_config,
            "dequantize_experts": rc.dequantize_experts,
            "decode_graphs": why_eager is None, "why_eager": why_eager}


def run_and_report_latency(engine: LLMEngine, options: LatencyOptions, profile: Path | None,
                           result_file: Path | None, settings: dict) -> int:
    ceilings = measure_ceilings(engine.device, engine.config.compute_dtype)
    summary = engine_summary(engine)
    print(_header("latency", engine, summary, ceilings))
    figures = run_latency(engine, options, ceilings)
    print(format_latency(figures, summary))
    result = {"bench": "latency", "environment": environment(engine.device),
              "settings": settings, "engine": summary, "ceilings": ceilings.to_dict(), **figures}
    if profile is not None:   # the first decode figure's shape and the first prefill length
        decode = figures["decode"][0] if figures["decode"] else {}
        result["profile"] = profile_steps(
            engine, decode.get("batch_size"), decode.get("context"),
            options.prefill_lens[0] if options.prefill_lens else None, profile,
            np.random.default_rng(options.seed + 1))
        print(format_profile(result["profile"]))
        print(f"wrote the op breakdown to {profile} (Chrome traces beside it)")
    if result_file is not None:
        write_result_file(result_file, result)
        print(f"wrote {result_file}")
    return 0


def run_and_report_throughput(engine: LLMEngine, num_prompts: int, input_len: int,
                              output_len: int, range_ratio: float, seed: int,
                              result_file: Path | None, settings: dict) -> int:
    summary = engine_summary(engine)
    figures = run_throughput(engine, num_prompts, input_len, output_len, range_ratio, seed)
    print(f"Throughput: {figures['requests_per_second']:.2f} requests/s, "
          f"{figures['tokens_per_second']:.2f} total tokens/s, "
          f"{figures['output_tokens_per_second']:.2f} output tokens/s "
          f"({num_prompts} prompts, {figures['total_input_tokens']} prompt and "
          f"{figures['total_output_tokens']} output tokens in {figures['elapsed_time']:.2f} s; "
          f"{_mode_text(summary)})")
    if result_file is not None:
        write_result_file(result_file, {"bench": "throughput",
                                        "environment": environment(engine.device),
                                        "settings": settings, "engine": summary, **figures})
        print(f"wrote {result_file}")
    return 0


def _mode_text(summary: dict) -> str:
    if summary["decode_graphs"]:
        return "decode steps from CUDA graphs"
    return f"decode steps eager: {summary['why_eager']}"


def _header(bench: str, engine: LLMEngine, summary: dict, ceilings: Ceilings) -> str:
    quant = "PTPC-FP8 linears" if summary["online_quant_config"] else "weights as stored"
    if summary.get("dequantize_experts"):
        quant += ", experts dequantized at load"
    return "\n".join([
        f"atomk31 bench {bench}: {summary['model']} on {ceilings.device} "
        f"({summary['kernel_backend']} kernels, {_name(summary['compute_dtype'])}, {quant}; "
        f"latent cache {_name(summary['latent_cache_dtype'])}, index keys "
        f"{summary['index_cache_format']}; {_mode_text(summary)})",
        f"ceilings measured now on {ceilings.device}: copy "
        f"{_rate(ceilings.copy_bytes_per_s, 'B/s')}, matmul "
        f"{_rate(ceilings.matmul_flop_per_s, 'FLOP/s')} ({ceilings.label})"])


def format_latency(figures: dict, summary: dict) -> str:
    lines = []
    if figures["prefill"]:
        lines.append(f"prefill: measured for real, one prompt alone, chunks of at most "
                     f"{summary['max_num_batched_tokens']} tokens")
        lines.append(f"{'tokens':>8} {'chunks':>6} {'TTFT ms':>10} {'FLOP':>10} "
                     f"{'FLOP/s':>12} {'MFU':>7}")
        for p in figures["prefill"]:
            lines.append(f"{p['num_tokens']:>8} {p['num_chunks']:>6} {p['ttft_ms']:>10.2f} "
                         f"{_rate(p['flops'], ''):>10} {_rate(p['flop_per_s'], ''):>12} "
                         f"{p['mfu']:>7.1%}")
    if figures["decode"]:
        lines.append("decode: contexts placed synthetically (random cache rows and KDA states), "
                     "steps run and timed as the engine runs them")
        lines.append(f"{'batch':>5} {'context':>8} {'mode':>10} {'step ms':>9} {'mean ms':>9} "
                     f"{'bytes':>9} {'B/s':>10} {'MBU':>7} {'experts':>7} {'tok/step':>8} "
                     f"{'tok/s':>9}")
        for d in figures["decode"]:
            lines.append(f"{d['batch_size']:>5} {d['context']:>8} {d['mode']:>10} "
                         f"{d['step_ms']['median']:>9.3f} {d['step_ms']['mean']:>9.3f} "
                         f"{_rate(d['bytes']['total'], ''):>9} {_rate(d['bytes_per_s'], ''):>10} "
                         f"{d['mbu']:>7.1%} {d['num_distinct_experts']:>7} "
                         f"{d['tokens_per_step']:>8.2f} {d['tokens_per_s']:>9.1f}"
                         + "".join(f"\n      note: {n}" for n in d["notes"]))
    return "\n".join(lines)


def format_profile(profile: dict) -> str:
    lines = []
    for step, p in profile.items():
        lines.append(f"profile of one {step} step ({p['mode']}, {p['time']} time): "
                     f"{p['step_ms']:.3f} ms busy in "
                     f"{p.get('step_wall_ms', float('nan')):.3f} ms wall, "
                     f"of which outside the op table {p['outside_ops_ms']:.3f} ms"
                     + (f"; {p['num_kernels']} kernels" if "num_kernels" in p else ""))
        lines += [f"  {r['op']:<24} {r['calls']:>5} calls {r['ms']:>10.3f} ms {r['share']:>7.1%}"
                  for r in p["ops"]]
        top = p.get("top_kernels", p.get("top_torch_ops", []))[:NUM_TOP_PRINTED]
        if top:
            lines.append("  by self time, " + ("kernels:" if "top_kernels" in p else "torch ops:"))
            lines += [f"    {t['name'][:60]:<60} {t['calls']:>5} calls {t['self_ms']:>10.3f} ms"
                      for t in top]
    return "\n".join(lines)


def _name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _rate(value: float, unit: str) -> str:
    """1.23e12 -> "1.23 T<unit>"."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}".rstrip()
