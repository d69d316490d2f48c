"""Routed MXFP4 experts (latent MoE) on the proxy shapes: atomk31's Triton GEMVs / grouped GEMMs.

Proxy shapes (MODEL_SPEC §2.3 widths, 64 experts): latent Dl = 3584, intermediate F = 3072,
top-16, tokens 1 to 4096, BF16 activations, random MXFP4 weights and random routing.
Each variant is checked against the torch op (max-abs error / max-abs value, BF16 products:
about 1e-3 expected) and timed. Figures: weight bytes of the experts in use (packed + scales)
/ time against the measured copy bandwidth (what bounds small batches), FLOP/s (6 F Dl per
(token, expert) pair) against the measured BF16 matrix rate (large batches), and the peer
measured side by side: torch._grouped_mm on the same routing with BF16 weights (4x the weight
bytes). Routing is timed alone and with the default experts path. Up to 64 tokens every
variant is timed both as CUDA-graph replays (``ms``, what a captured decode step pays: no
launch overhead) and eagerly (``eager_ms``); the ratios use the graph figure. The opt-in MXFP8
down activations (``fp8_down_activations``, grouped GEMMs) are timed at 16 and 4096 tokens
against the torch op with the same option.

Run: python -m benchmarks.kernels.bench_moe [--out DIR] [--tokens 1 16 4096] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import (measure_copy_bandwidth, measure_matmul_rate, time_graph_ms,
                               time_ms, write_result)

NUM_EXPERTS, TOP_K, LATENT, INTERMEDIATE = 64, 16, 3584, 3072
DEVICE = "cuda"
TOLERANCE = 1e-2

GEMV = "gemv"        # atomk31/triton_kernels/moe_gemv.py, called directly with these knobs
GROUPED = "grouped"  # moe_experts_mxfp4_triton(small_batch=False, ...knobs)
DEFAULT = "default"  # moe_experts_mxfp4_triton as the engine calls it


def gemv(mode: str, block_n: int, block_k: int, num_warps: int = 4, num_stages: int = 3,
         loop_stages: int = 0, one_factor: bool = False) -> tuple[str, dict]:
    knobs = dict(mode=mode, block_n=block_n, block_k=block_k, num_warps=num_warps,
                 num_stages=num_stages, loop_stages=loop_stages)
    return GEMV, knobs | (dict(one_factor=True) if one_factor else {})


def variants(num_tokens: int, quick: bool) -> dict[str, tuple[str, dict]]:
    """The designs / configurations timed side by side at this batch size. "default": BF16
    on NVIDIA "dot_t_words" 64 x 256 up to 16 tokens, 128 x 128 at 64 (round 3); "words" =
    dot_t_words (weights decoded two per op into tensor-core registers), "1f" its one-multiply
    decode (scale range limited; these weights' scales are in it); "dot_t" / "fma" = round 2's
    defaults; n / k = block_n / block_k, w = num_warps, s = num_stages."""
    cases: dict[str, tuple[str, dict]] = {"default": (DEFAULT, {})}
    if num_tokens > 64:
        return cases
    words = {"words n64 k256 w4": gemv("dot_t_words", 64, 256),
             "words n128 k128 w4": gemv("dot_t_words", 128, 128),
             "words n128 k128 w8": gemv("dot_t_words", 128, 128, num_warps=8),
             "words n64 k256 w4 s4": gemv("dot_t_words", 64, 256, num_stages=4),
             "words n64 k256 w4 1f": gemv("dot_t_words", 64, 256, one_factor=True),
             "words n128 k256 w8": gemv("dot_t_words", 128, 256, num_warps=8),
             "words n64 k128 w4": gemv("dot_t_words", 64, 128)}
    # The default's own configuration is timed as "default".
    del words["words n64 k256 w4" if num_tokens <= 16 else "words n128 k128 w4"]
    if quick:
        words = {name: knobs for name, knobs in words.items()
                 if name in ("words n64 k256 w4", "words n128 k128 w4", "words n128 k128 w8",
                             "words n64 k256 w4 s4", "words n64 k256 w4 1f")}
    cases |= words
    if quick:                       # round 2 measured these (eager): 0.246 / 0.170 / 1.876 ms
        return cases
    if num_tokens == 1:
        cases |= {"fma n32 k128 w4": gemv("fma", 32, 128),
                  "dot_t n64 k128 w4": gemv("dot_t", 64, 128),
                  "fma_f32 n32 k256 w4 ls2": gemv("fma_f32", 32, 256, loop_stages=2)}
    elif num_tokens == 64:
        cases |= {"dot_t n64 k128 w4": gemv("dot_t", 64, 128),
                  "grouped bm16 n64 k128": (GROUPED, dict(block_m=16, block_n=64,
                                                           block_k=128))}
    return cases


FP8_DOWN_VARIANTS = {"fp8 down": dict(fp8_down_activations=True),
                     "fp8 down dot_scaled": dict(fp8_down_activations=True,
                                                 use_dot_scaled=True)}


def random_mxfp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (NUM_EXPERTS, rows, cols // 2), dtype=torch.uint8,
                           device=DEVICE)
    scales = torch.randint(118, 124, (NUM_EXPERTS, rows, cols // 32), dtype=torch.uint8,
                           device=DEVICE)
    return packed, scales


def expert_bytes() -> int:
    w13 = 2 * INTERMEDIATE * (LATENT // 2 + LATENT // 32)
    w2 = LATENT * (INTERMEDIATE // 2 + INTERMEDIATE // 32)
    return w13 + w2


def grouped_mm_peer(z, topk_ids, w13_bf16, w2_bf16):
    """torch._grouped_mm over the same (token, expert) pairs with BF16 weights, or None."""
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        return None
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat)
    offsets = torch.bincount(flat, minlength=NUM_EXPERTS).cumsum(0).to(torch.int32)
    rows = z[order // TOP_K]

    def step():
        gate_up = grouped_mm(rows, w13_bf16.transpose(1, 2), offs=offsets)
        gate, up = gate_up.chunk(2, dim=-1)
        return grouped_mm((torch.nn.functional.silu(gate) * up), w2_bf16.transpose(1, 2),
                          offs=offsets)
    return step


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).abs().max()
            / expected.double().abs().max().clamp_min(1e-30)).item()


def _timed(step, weight_bytes: int, flops: int, copy_bw: float, matmul_rate: float,
           peer_ms: float, graph: bool) -> dict:
    """Eager and (small batches) CUDA-graph milliseconds of `step`; the ratios use the graph
    figure where there is one (what the engine pays once it captures decode)."""
    eager = time_ms(step)
    replayed = float("nan")
    if graph:
        try:
            replayed = time_graph_ms(step)
        except Exception:  # a path with a host sync cannot be captured: eager only
            pass
    ms = eager if replayed != replayed else replayed
    return {"ms": ms, "eager_ms": eager, "graph_ms": replayed,
            "fraction_of_copy_bw": weight_bytes / (ms * 1e-3) / copy_bw,
            "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate,
            "speedup_vs_peer": peer_ms / ms}


def run(token_counts: list[int], out_dir: Path | None, budget_s: float, quick: bool) -> dict:
    from atomk31.ops.moe import moe_experts_mxfp4_torch
    from atomk31.triton_kernels.moe_gemv import moe_experts_mxfp4_gemv_triton
    from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_triton
    from atomk31.triton_kernels.moe_routing import moe_route_triton

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    w13_packed, w13_scales = random_mxfp4(2 * INTERMEDIATE, LATENT)
    w2_packed, w2_scales = random_mxfp4(LATENT, INTERMEDIATE)
    weights_mx = (w13_packed, w13_scales, w2_packed, w2_scales)
    w13_bf16 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, LATENT, device=DEVICE,
                           dtype=torch.bfloat16) * 0.02
    w2_bf16 = torch.randn(NUM_EXPERTS, LATENT, INTERMEDIATE, device=DEVICE,
                          dtype=torch.bfloat16) * 0.02
    router = torch.randn(NUM_EXPERTS, LATENT, device=DEVICE) * 0.05
    bias = torch.zeros(NUM_EXPERTS, device=DEVICE)
    launchers = {
        GEMV: lambda z, w, i, knobs: moe_experts_mxfp4_gemv_triton(
            z, w, i, *weights_mx, 4.0, 25.0, **knobs),
        GROUPED: lambda z, w, i, knobs: moe_experts_mxfp4_triton(
            z, w, i, *weights_mx, 4.0, 25.0, small_batch=False, **knobs),
        DEFAULT: lambda z, w, i, knobs: moe_experts_mxfp4_triton(z, w, i, *weights_mx, 4.0, 25.0),
    }
    rows = []
    deadline = time.monotonic() + budget_s
    for num_tokens in token_counts:
        graph = num_tokens <= 64
        z = torch.randn(num_tokens, LATENT, device=DEVICE, dtype=torch.bfloat16)
        weights, ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0)
        expected = moe_experts_mxfp4_torch(z, weights, ids, *weights_mx, 4.0, 25.0)
        used = int(torch.unique(ids).numel())
        weight_bytes = used * expert_bytes()
        flops = 6 * num_tokens * TOP_K * INTERMEDIATE * LATENT
        row = {"tokens": num_tokens, "experts_used": used, "weight_bytes": weight_bytes,
               "floor_bytes_us": weight_bytes / copy_bw * 1e6,
               "floor_flops_us": flops / matmul_rate * 1e6}
        peer = grouped_mm_peer(z, ids, w13_bf16, w2_bf16)
        peer_bytes = used * 2 * 3 * INTERMEDIATE * LATENT              # BF16 weights in use
        if peer is not None:
            row["peer grouped_mm bf16"] = _timed(peer, peer_bytes, flops, copy_bw, matmul_rate,
                                                 float("nan"), graph)
        peer_ms = row.get("peer grouped_mm bf16", {}).get("ms", float("nan"))
        cases = {name: (launchers[kind], knobs, expected)
                 for name, (kind, knobs) in variants(num_tokens, quick).items()}
        if num_tokens in (16, 4096):
            expected_fp8 = moe_experts_mxfp4_torch(z, weights, ids, *weights_mx, 4.0, 25.0,
                                                   fp8_down_activations=True)
            cases |= {name: (launchers[GROUPED], knobs, expected_fp8)
                      for name, knobs in FP8_DOWN_VARIANTS.items()}
        for name, (launch, knobs, reference) in cases.items():
            if time.monotonic() > deadline:  # compiles are most of the time: stay in budget
                row[name] = "skipped: over the --budget-s time budget"
                continue
            step = lambda: launch(z, weights, ids, knobs)  # noqa: E731
            try:
                error = relative_error(step(), reference)
                timing = _timed(step, weight_bytes, flops, copy_bw, matmul_rate, peer_ms, graph)
            except Exception as failure:  # a variant that does not compile is reported
                row[name] = f"failed: {type(failure).__name__}: {str(failure)[:200]}"
                continue
            row[name] = {**timing, "relative_error": error, "correct": error <= TOLERANCE}
        row["routing_ms"] = time_ms(lambda: moe_route_triton(z, router, bias, TOP_K, True, 1.0))
        split_ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0, split_router=True)[1]
        row["routing_split_ids_match"] = bool(torch.equal(split_ids, ids))

        def routed_step(split_router: bool):
            w, i = moe_route_triton(z, router, bias, TOP_K, True, 1.0, split_router=split_router)
            return moe_experts_mxfp4_triton(z, w, i, *weights_mx, 4.0, 25.0)
        for name, split_router in (("default + routing", False),
                                   ("default + split routing", True)):
            row[name] = _timed(lambda split=split_router: routed_step(split), weight_bytes,
                               flops, copy_bw, matmul_rate, peer_ms, graph)
        rows.append(row)
        print_table([row], header=len(rows) == 1)
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "experts": NUM_EXPERTS, "top_k": TOP_K, "latent": LATENT,
               "intermediate": INTERMEDIATE,
               "timing": "ms = CUDA graph replay median up to 64 tokens (eager_ms beside it), "
                         "eager (do_bench) above", "rows": rows}
    path = write_result("moe_mxfp4", payload, out_dir)
    print(f"wrote {path}")
    print_best(rows)
    return payload


def print_table(rows: list[dict], header: bool = True) -> None:
    if header:
        print(f"{'T':>4} {'variant':>26} {'graph ms':>8} {'eager ms':>8} {'of copy':>7} "
              f"{'of mma':>7} {'x peer':>6} {'err/bound':>9}", flush=True)
    for row in rows:
        print(f"{row['tokens']:>4} floors: bytes {row['floor_bytes_us']:.1f} us, flops "
              f"{row['floor_flops_us']:.1f} us; {row['experts_used']} experts; routing "
              f"{row['routing_ms'] * 1e3:.1f} us eager (split router ids match: "
              f"{row['routing_split_ids_match']})")
        for name, value in row.items():
            if isinstance(value, dict):
                error = value.get("relative_error", float("nan")) / TOLERANCE
                print(f"{row['tokens']:>4} {name[:26]:>26} {value['graph_ms']:8.4f} "
                      f"{value['eager_ms']:8.4f} {value['fraction_of_copy_bw']:7.3f} "
                      f"{value['fraction_of_matmul_rate']:7.4f} "
                      f"{value['speedup_vs_peer']:6.2f} {error:9.2e}"
                      f"{'' if value.get('correct', True) else '  WRONG'}", flush=True)
            elif isinstance(value, str):
                print(f"{row['tokens']:>4} {name[:26]:>26} {value[:90]}", flush=True)


def print_best(rows: list[dict]) -> None:
    """Last lines (what a log tail shows): the fastest correct variant per batch size."""
    print("best correct variant per batch (ms, of copy bw, x peer; default ms):")
    for row in rows:
        timed = {name: value for name, value in row.items() if isinstance(value, dict)
                 and value.get("correct") and not name.startswith("fp8")}
        if not timed:
            print(f"T={row['tokens']}: none")
            continue
        name, best = min(timed.items(), key=lambda item: item[1]["ms"])
        default = row.get("default", {})
        print(f"T={row['tokens']}: {name} {best['ms']:.4f} {best['fraction_of_copy_bw']:.3f} "
              f"x{best['speedup_vs_peer']:.2f}; default "
              f"{default.get('ms', float('nan')) if isinstance(default, dict) else default}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256, 4096])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="skip the remaining variants after this many seconds")
    parser.add_argument("--quick", action="store_true",
                        help="fewer configurations (about 90 s on an H200)")
    args = parser.parse_args()
    run(args.tokens, args.out, args.budget_s if not args.quick else min(args.budget_s, 85.0),
        args.quick)


if __name__ == "__main__":
    main()
