"""PTPC-FP8 scaled GEMM: atomk31's Triton kernels vs torch._scaled_mm with row-wise scales, on
the proxy model's linear shapes; and the time to quantize the proxy's BF16 linears at load.

Both GEMMs take the same FP8 activations (one scale per token) and FP8 weights (one scale per
output channel) and write BF16. Per case the peer, what the engine runs (``default``: the
``ptpc_linear_quantized`` op of the engine's eager table, timed eagerly, and of its graph
table, replayed from a CUDA graph: `engine_kernels`) and a few variants (ptpc_variants.py:
the pointer kernel's and the Gluon Hopper kernel's tiles and stages, the TMA kernel of
variants/ptpc_fp8_tma.py) are checked, then timed, and each row is printed as soon as it is
measured. Checks against fp32 math of the same quantized values (max-abs error over max-abs
output): the bf16 output ("ok" within BF16_OUTPUT_TOLERANCE), and where asked the fp32 output
(the accumulation error; "e/bnd" is it over ERROR_FACTOR x torch._scaled_mm's on the same
inputs + ERROR_SLACK, as the GPU tests require: 1.3-1.6e-4 with promotion every 128 K, ~1e-2
without; over 1 is "WRONG").
Times: CUDA-graph replay (what the engine pays once it captures decode; no launch overhead)
and eager (triton's do_bench, L2 flushed); the ratio to the peer uses the graph times. Limits
measured in the same run: copy bandwidth (bytes A + B read and C written) and the FP8 matrix
rate (an 8192^3 torch._scaled_mm with row-wise scales).

Run: python -m benchmarks.kernels.bench_ptpc_fp8 [--quick] [--quantize-only] [--out DIR]
(--quick: the cases of QUICK_CASES in priority order, within QUICK_TIME_BUDGET_S.)
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import (engine_kernels, measure_copy_bandwidth, time_graph_ms, time_ms,
                               write_result)
from benchmarks.kernels.ptpc_variants import (
    Variant, launch_overhead, launcher, risky_variants_for, variants_for,
)

# (N, K) of the proxy's PTPC-eligible linears (MODEL_SPEC §3.2, §6.5).
SHAPES = {
    "kda qkv (fused)": (3 * 12288, 7168),
    "o_proj": (7168, 12288),
    "shared gate_up": (2 * 6144, 7168),
    "shared down": (7168, 6144),
    "mla q_b": (18432, 1536),
    "mla kv_a": (576, 7168),
    "mla kv_b": (24576, 512),
}
TOKENS = [1, 16, 128, 256, 1024, 4096]
# --quick: o_proj and the largest proxy shape at 4096, 1024 and 128 tokens; the other shapes of
# the Gluon kernel's classes (shared experts, q_b) and kv_b (K = 512); decode (peer and default);
# then the host time of a launch. About one compile per new kernel config and output dtype
# (Triton 2-3 s, Gluon ~2 s).
QUICK_CASES = [("o_proj", 4096), ("kda qkv (fused)", 4096), ("o_proj", 1024),
               ("kda qkv (fused)", 1024), ("o_proj", 128), ("kda qkv (fused)", 128),
               ("shared down", 128), ("shared gate_up", 128), ("mla q_b", 128),
               ("mla kv_b", 128), ("o_proj", 256), ("shared down", 256),
               ("shared gate_up", 4096), ("shared down", 1024), ("mla q_b", 1024),
               ("mla kv_b", 4096), ("o_proj", 1), ("o_proj", 16), ("kda qkv (fused)", 1),
               ("kda qkv (fused)", 16), ("mla kv_a", 1)]
# No new variant starts after this many seconds of --quick (the H200 step allows 90).
QUICK_TIME_BUDGET_S = 78.0
# A variant is correct when its bf16 output is within this of fp32 math (max-abs error over
# max-abs output): bf16 rounding gives up to 2^-8 (half an ulp), a wrong tile or split O(1).
BF16_OUTPUT_TOLERANCE = 1e-2
# The fp32-output error may be at most this many times torch._scaled_mm's on the same inputs,
# plus ERROR_SLACK (what the GPU tests require: equal accuracy).
ERROR_FACTOR, ERROR_SLACK = 1.25, 1e-5
# Timing: graph replays of GRAPH_REP_MS (x10 measurements), eager do_bench warmup / rep (ms).
GRAPH_REP_MS = 20
EAGER_WARMUP_MS, EAGER_REP_MS = 5, 25


def relative_error(y: torch.Tensor, expected: torch.Tensor) -> float:
    return ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def scaled_mm_fp32(x_q, x_scale, w_q, w_scale) -> torch.Tensor:
    """torch._scaled_mm with an fp32 output: row-wise scales write only bf16, so unit
    per-tensor scales and the row/column scales applied afterwards in fp32."""
    one = torch.ones((), device=x_q.device)
    y = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return y * x_scale[:, None] * w_scale[None, :]


def measure_fp8_matmul_rate(n: int = 8192) -> float:
    """FLOP/s of an n x n x n torch._scaled_mm (FP8 e4m3, row-wise scales, bf16 out): the FP8
    matrix roofline of this GPU and cuBLASLt."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    scale_a = torch.ones(n, 1, device="cuda")
    scale_b = torch.ones(1, n, device="cuda")
    ms = time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b,
                                          out_dtype=torch.bfloat16))
    return 2 * n**3 / (ms * 1e-3)


def time_both(fn: Callable) -> tuple[float, float]:
    """(graph ms, eager ms) of fn."""
    return (time_graph_ms(fn, rep=GRAPH_REP_MS),
            time_ms(fn, warmup=EAGER_WARMUP_MS, rep=EAGER_REP_MS))


def config_brief(kind: str, config: dict) -> str:
    """'gluon 128x64 s6', 'pointer 64x128x256 w8 s3 splitK2', 'tma 128x128x128 w8 s3 lag2':
    the kernel and the fields its config differs in."""
    if kind == "gluon":
        return f"gluon 128x{config['block_n']} s{config['num_stages']}" + \
            (" overlap" if config.get("overlap_epilogue") else "")
    text = f"{kind} {config['block_m']}x{config['block_n']}x{config['block_k']} " \
           f"w{config['num_warps']} s{config['num_stages']}"
    if config["split_k"] > 1:
        text += f" splitK{config['split_k']}"
    if config["promote_every"] is None and not config.get("promote_per_tile") and \
            not config.get("promote_lagged"):
        text += " nopromo"
    flags = {"warp_specialize": "ws", "promote_per_tile": "tile", "promote_lagged": "lag2",
             "split_n": "splitN", "persistent": "persist", "device_descriptors": "dev"}
    return text + "".join(f" {short}" for key, short in flags.items() if config.get(key))


HEADER = (f"{'shape':>8} {'M':>5} {'variant':>24} {'graph':>7} {'eager':>7} {'ratio':>5} "
          f"{'r eag':>5} {'bw':>4} {'fp8':>4} {'error':>8} {'e/bnd':>5} {'bf16 err':>8} "
          f"ok config")


def print_row(name: str, m: int, label: str, result: dict) -> None:
    """One table row, flushed (a run cut short by its timeout still shows what it measured)."""
    shape = name.replace("mla ", "")[:8]
    if "graph_ms" not in result:
        note = result.get("failed") or f"same config as {result.get('same_as')}"
        print(f"{shape:>8} {m:>5} {label[:24]:>24} {note[:90]}", flush=True)
        return
    error = f"{result['error']:8.2e}" if result.get("error") is not None else f"{'-':>8}"
    error += f" {result['error_over_bound']:5.2f}" if result.get("error_over_bound") is not None \
        else f" {'-':>5}"
    ratio = f"{result['ratio_vs_peer']:5.2f} {result['eager_ratio_vs_peer']:5.2f}" \
        if "ratio_vs_peer" in result else f"{'peer':>5} {'':>5}"
    brief = config_brief(result["kind"], result["config"]) if result.get("config") else \
        result.get("kernels", "")
    print(f"{shape:>8} {m:>5} {label[:24]:>24} {result['graph_ms']:7.4f} "
          f"{result['eager_ms']:7.4f} {ratio} {result['fraction_of_copy_bw']:4.2f} "
          f"{result['fraction_of_fp8_matmul_rate']:4.2f} {error} "
          f"{result.get('bf16_output_error', float('nan')):8.2e} "
          f"{'ok' if result.get('correct', True) else 'WRONG'} {brief}", flush=True)


def error_verdict(result: dict, peer_error: float) -> None:
    """Adds the fp32-output error over its bound (ERROR_FACTOR x the peer's + ERROR_SLACK),
    and marks a variant over it as not correct."""
    if result.get("error") is None or peer_error != peer_error:     # not measured, or nan
        return
    result["error_over_bound"] = result["error"] / (ERROR_FACTOR * peer_error + ERROR_SLACK)
    result["correct"] = result["correct"] and result["error_over_bound"] <= 1.0


def run_case(name: str, m: int, w_q, w_scale, limits: dict, variants: list[Variant],
             deadline: float, kernels, with_default: bool = True) -> dict:
    """Time the peer, then check and time the engine's tables (``with_default``) and the
    variants at one (shape, M) (no new variant after ``deadline``, a time.perf_counter()
    value)."""
    from atomk31.ops.linear import ptpc_shape
    from atomk31.triton_kernels.ptpc_fp8 import ptpc_quantize_triton

    n, k = w_q.shape
    x_q, x_scale = ptpc_quantize_triton(torch.randn(m, k, device=w_q.device,
                                                    dtype=torch.bfloat16))
    expected = (x_q.float() @ w_q.float().T) * x_scale[:, None] * w_scale[None, :]
    moved, flops = m * k + n * k + 2 * m * n, 2 * m * n * k

    def figures(graph_ms: float, eager_ms: float) -> dict:
        return {"graph_ms": graph_ms, "eager_ms": eager_ms,
                "fraction_of_copy_bw": moved / (graph_ms * 1e-3) / limits["copy"],
                "fraction_of_fp8_matmul_rate": flops / (graph_ms * 1e-3) / limits["fp8_matmul"]}

    peer = figures(*time_both(lambda: torch._scaled_mm(
        x_q, w_q.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :],
        out_dtype=torch.bfloat16)))
    try:
        peer["error"] = relative_error(scaled_mm_fp32(x_q, x_scale, w_q, w_scale), expected)
    except RuntimeError:        # no fp32 output from this cuBLASLt: the error stays unknown
        peer["error"] = float("nan")
    print_row(name, m, "torch._scaled_mm", peer)
    shape = ptpc_shape(m, n, k)
    row = {"shape": name, "m": m, "n": n, "k": k, "shape_class": shape,
           "tables": {step: table.choice("ptpc_linear_quantized", shape).kernel
                      for step, table in (("eager", kernels.eager), ("graph", kernels.graph))},
           "torch._scaled_mm": peer, "variants": {}}
    inputs = (x_q, x_scale, w_q, w_scale, expected, peer["error"])
    if with_default:
        result = measure_tables(kernels, inputs, measure_error=m >= 1024, check_factor=1.25)
        finish(result, figures, peer)
        result["kernels"] = " / ".join(row["tables"][step].rsplit(".", 1)[-1]
                                       for step in ("eager", "graph"))
        row["variants"]["default"] = result
        print_row(name, m, "default", result)
    seen = {}
    for number, variant in enumerate(variants, start=1):
        config = variant.config_for(m, n, k)
        key = (variant.kind, config)
        if time.perf_counter() > deadline:
            result = {"failed": "skipped: past the time budget"}
        elif key in seen:
            result = {"same_as": seen[key]}
        else:
            seen[key] = variant.label
            gemm = launcher(variant.kind)
            result = measure(lambda out_dtype, scale: gemm(x_q, scale, w_q, w_scale, out_dtype,
                                                          config),
                             lambda: gemm(x_q, x_scale, w_q, w_scale, torch.bfloat16, config),
                             expected, variant.measure_error, 1.25 + 0.25 * number, x_scale)
            result.update(kind=variant.kind, config=dataclasses.asdict(config))
            finish(result, figures, peer)
        row["variants"][variant.label] = result
        print_row(name, m, variant.label, result)
    return row


def finish(result: dict, figures: Callable, peer: dict) -> None:
    """Adds the error verdict, the fractions of the limits and the ratios to the peer."""
    if "graph_ms" not in result:
        return
    error_verdict(result, peer["error"])
    result.update(figures(result["graph_ms"], result["eager_ms"]))
    result["ratio_vs_peer"] = peer["graph_ms"] / result["graph_ms"]
    result["eager_ratio_vs_peer"] = peer["eager_ms"] / result["eager_ms"]


def measure_tables(kernels, inputs: tuple, measure_error: bool, check_factor: float) -> dict:
    """The engine's ``ptpc_linear_quantized``: checked through the graph table, timed eagerly
    through the eager table and replayed through the graph table."""
    x_q, x_scale, w_q, w_scale, expected, _ = inputs
    eager, graph = kernels.eager.ptpc_linear_quantized, kernels.graph.ptpc_linear_quantized
    checked = measure(lambda out_dtype, scale: graph(x_q, scale, w_q, w_scale, out_dtype),
                      None, expected, measure_error, check_factor, x_scale)
    if "failed" in checked:
        return checked
    try:
        checked["graph_ms"] = time_graph_ms(lambda: graph(x_q, x_scale, w_q, w_scale),
                                            rep=GRAPH_REP_MS)
        checked["eager_ms"] = time_ms(lambda: eager(x_q, x_scale, w_q, w_scale),
                                      warmup=EAGER_WARMUP_MS, rep=EAGER_REP_MS)
    except Exception as failure:  # reported, not raised: the variants still run
        return {"failed": f"{type(failure).__name__}: {str(failure)[:200]}"}
    return checked


def measure(gemm: Callable, timed: Callable | None, expected, measure_error: bool,
            check_factor: float, x_scale) -> dict:
    """Check one GEMM (``gemm(out_dtype, x_scale)``; bf16 output, fp32 output where asked),
    then time ``timed`` (None: untimed). The checks scale the activation scales by
    ``check_factor`` (a different one per variant, never 1): the launcher's fresh output may be
    a cached block still holding an earlier call's result, which then differs from this one's
    by that factor instead of passing unwritten."""
    try:
        check_scale, check_expected = x_scale * check_factor, expected * check_factor
        bf16_error = relative_error(gemm(torch.bfloat16, check_scale), check_expected)
        error = relative_error(gemm(torch.float32, check_scale), check_expected) \
            if measure_error else None
        result = {"error": error, "bf16_output_error": bf16_error,
                  "correct": bf16_error <= BF16_OUTPUT_TOLERANCE}
        if timed is not None:
            result["graph_ms"], result["eager_ms"] = time_both(timed)
    except Exception as failure:  # a variant that does not compile is a result, not a stop
        return {"failed": f"{type(failure).__name__}: {str(failure)[:200]}"}
    return result


def proxy_linears(layer: int, is_mla: bool, is_dense: bool) -> dict[str, tuple[int, int]]:
    """Shapes of one proxy layer's linear weights (eligible and excluded), by checkpoint name."""
    a = f"language_model.model.layers.{layer}.self_attn."
    m = f"language_model.model.layers.{layer}."
    hidden, heads = 7168, 96
    if is_mla:
        shapes = {a + "q_a_proj.weight": (1536, hidden), a + "q_b_proj.weight": (18432, 1536),
                  a + "kv_a_proj_with_mqa.weight": (576, hidden),
                  a + "kv_b_proj.weight": (24576, 512), a + "g_proj.weight": (12288, hidden),
                  a + "o_proj.weight": (hidden, 12288),
                  a + "indexer.wq_b.weight": (4096, 1536), a + "indexer.wk.weight": (128, hidden)}
    else:
        shapes = {a + f"{p}_proj.weight": (heads * 128, hidden) for p in "qkvg"}
        shapes.update({a + "f_a_proj.weight": (128, hidden), a + "f_b_proj.weight": (12288, 128),
                       a + "b_proj.weight": (heads, hidden), a + "o_proj.weight": (hidden, 12288)})
    if is_dense:
        shapes.update({m + "mlp.gate_proj.weight": (33792, hidden),
                       m + "mlp.up_proj.weight": (33792, hidden),
                       m + "mlp.down_proj.weight": (hidden, 33792)})
    else:
        e = m + "block_sparse_moe."
        shapes.update({e + "gate.weight": (64, hidden),
                       e + "routed_expert_down_proj.weight": (3584, hidden),
                       e + "routed_expert_up_proj.weight": (hidden, 3584),
                       e + "shared_experts.gate_proj.weight": (6144, hidden),
                       e + "shared_experts.up_proj.weight": (6144, hidden),
                       e + "shared_experts.down_proj.weight": (hidden, 6144)})
    return shapes


def time_quantizing_proxy() -> dict:
    """Quantize every proxy layer's linears on the GPU (random BF16 weights, one layer at a
    time, nothing written); returns the summed quantization time and counts."""
    from atomk31.quant.ptpc import quantize_linears_ptpc

    config = {"global_quant_config": "ptpc_fp8",
              "exclude_layer": ["lm_head", "model.embed_tokens", "*self_attn.[qkv]_conv1d*",
                                "*block_sparse_moe.experts*", "*block_sparse_moe.routed_expert_*"]}
    quantize_linears_ptpc({"w.weight": torch.randn(64, 64, device="cuda").bfloat16()}, config)
    total_s, quantized, params = 0.0, 0, 0
    for layer in range(8):
        weights = {name: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                   for name, shape in proxy_linears(layer, layer in (3, 7), layer == 0).items()}
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = quantize_linears_ptpc(weights, config)
        torch.cuda.synchronize()
        total_s += time.perf_counter() - start
        scaled = [n for n in out if n.endswith("weight_scale")]
        quantized += len(scaled)
        params += sum(out[n[: -len("_scale")]].numel() for n in scaled)
        del weights, out
    return {"seconds": total_s, "linears_quantized": quantized, "parameters": params,
            "note": "8 proxy layers, random BF16 weights already on the GPU, no checkpoint I/O"}


def run(quick: bool, out_dir: Path | None, budget_s: float = QUICK_TIME_BUDGET_S) -> dict:
    from atomk31.quant.ptpc import quantize_weight_ptpc
    from atomk31.triton_kernels.ptpc_fp8 import ptpc_quantize_triton

    started = time.perf_counter()
    deadline = started + budget_s if quick else float("inf")
    torch.backends.cuda.matmul.allow_tf32 = False        # the fp32 reference stays fp32
    limits = {"copy": measure_copy_bandwidth(), "fp8_matmul": measure_fp8_matmul_rate()}
    print(f"copy {limits['copy'] / 1e12:.2f} TB/s, FP8 _scaled_mm "
          f"{limits['fp8_matmul'] / 1e12:.0f} TFLOP/s; graph / eager ms; ratio = peer ms / ours "
          f"(graph, eager; goal >= 0.9); bw / fp8 = fractions of those limits; error = fp32 "
          f"output vs fp32 math", flush=True)
    print(HEADER, flush=True)
    cases = QUICK_CASES if quick else [(name, m) for name in SHAPES for m in TOKENS]
    kernels = engine_kernels("cuda")
    payload = {"copy_bandwidth_bytes_per_s": limits["copy"],
               "fp8_matmul_flops_per_s": limits["fp8_matmul"], "quick": quick, "rows": []}
    # a timeout's SIGTERM still writes what was measured
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        weights: dict = {}

        def weight(name: str) -> tuple:
            if name not in weights:
                weights.clear()
                n, k = SHAPES[name]
                weights[name] = quantize_weight_ptpc(
                    torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
            return weights[name]
        for name, m in cases:
            payload["rows"].append(run_case(name, m, *weight(name), limits,
                                            variants_for(name, SHAPES[name][0], m, quick),
                                            deadline, kernels))
        # last: the variants that may hang the GPU (a hang loses no row printed before it)
        for name, m in cases:
            if risky_variants_for(SHAPES[name][0], m, quick):
                payload["rows"].append(run_case(name, m, *weight(name), limits,
                                                risky_variants_for(SHAPES[name][0], m, quick),
                                                deadline, kernels, with_default=False))
        # the host time of a launch (o_proj at 128 tokens: kernels shorter than it)
        name, m = "o_proj", 128
        if time.perf_counter() < deadline:
            x_q, x_scale = ptpc_quantize_triton(torch.randn(m, SHAPES[name][1], device="cuda",
                                                            dtype=torch.bfloat16))
            payload["host_us_per_launch"] = launch_overhead(x_q, x_scale, *weight(name))
        if not quick:
            payload["quantize_proxy_linears"] = time_quantizing_proxy()
            print(f"quantize proxy linears: {payload['quantize_proxy_linears']}")
    finally:
        path = write_result("ptpc_fp8", payload, out_dir)
        print(f"wrote {path} ({time.perf_counter() - started:.0f} s)", flush=True)
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"QUICK_CASES in priority order, within {QUICK_TIME_BUDGET_S:.0f} s "
                             f"(then the remaining variants are listed as skipped)")
    parser.add_argument("--budget-s", type=float, default=QUICK_TIME_BUDGET_S,
                        help="--quick's time budget in seconds")
    parser.add_argument("--quantize-only", action="store_true",
                        help="only the time to quantize the proxy's linears (ptpc_quantize.json)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quantize_only:
        result = time_quantizing_proxy()
        print(f"quantize proxy linears: {result}", flush=True)
        print(f"wrote {write_result('ptpc_quantize', {'quantize_proxy_linears': result}, args.out)}")
        return
    run(args.quick, args.out, args.budget_s)


if __name__ == "__main__":
    main()
