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
launch overhead) and eagerly (``eager_ms``); the ratios use the graph figure. ``default`` is
what the engine runs: ``moe_experts_mxfp4`` of the engine's graph table (replayed) and eager
table (eager), `engine_kernels`. Without --quick, the MXFP8 down activations
(variants/moe_fp8_down.py) are timed at 16 and 4096 tokens against their own torch
definition. Each variant's line is printed as soon as it is measured, and the JSON is
rewritten after each batch size.

Run: python -m benchmarks.kernels.bench_moe [--out DIR] [--tokens 1 16 4096] [--quick]
(--quick: ~90 s on an H200, compiles included)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import (engine_kernels, measure_copy_bandwidth, measure_matmul_rate,
                               time_graph_ms, time_ms, write_result)

NUM_EXPERTS, TOP_K, LATENT, INTERMEDIATE = 64, 16, 3584, 3072
DEVICE = "cuda"
TOLERANCE = 1e-2

GEMV = "gemv"        # moe_gemv.moe_experts_mxfp4_gemv_words_triton with a GemvConfig
WORDS = "words"      # moe_grouped_words.moe_experts_mxfp4_grouped_words_triton, GroupedConfig
BYTES = "bytes"      # moe_grouped_gemm.moe_experts_mxfp4_grouped_triton, GroupedConfig
DEFAULT = "default"  # the engine's tables
FP8_DOWN = "fp8 down"  # variants/moe_fp8_down.py


def gemv(block_n: int, block_k: int, num_warps: int = 4, num_stages: int = 3,
         gather_rows: bool | None = None, block_m: int | None = None,
         max_registers: int | None = None) -> tuple[str, dict]:
    """A config of the word-decode GEMV ("dot_t_words")."""
    from atomk31.triton_kernels.moe_gemv import GemvConfig

    return GEMV, {"config": GemvConfig(block_n=block_n, block_k=block_k, num_warps=num_warps,
                                       num_stages=num_stages, gather_rows=gather_rows,
                                       block_m=block_m, max_registers=max_registers)}


def grouped(kind: str, block_m: int | None = None, block_n: int = 128, block_k: int = 128,
            num_warps: int = 8, num_stages: int = 3) -> tuple[str, dict]:
    """The word- (WORDS) or byte-decode (BYTES) grouped GEMMs, their own tiles without
    block_m."""
    from atomk31.triton_kernels.moe_grouped_gemm import GroupedConfig

    if block_m is None:
        return kind, {}
    return kind, {"config": GroupedConfig(block_m, block_n, block_k, num_warps, num_stages)}


TWO_FACTORS = {"one_factor_exact": False}


def variants(num_tokens: int, quick: bool) -> dict[str, tuple[str, dict]]:
    """The designs / configurations timed side by side at this batch size. Every launcher
    gets the weights' one_factor_exact flag (computed once, as the engine's layer does; these
    weights' scale bytes are in range), unless a variant sets it: "default" = the registered
    engine's tables (BF16 on NVIDIA: the word-decode GEMV, 64 x 256 with the one-multiply
    decode up to 64 tokens: token rows up to 16, gathered rows at 17-64; above, at 128 pairs
    per block, "grouped words" = the grouped GEMMs with the word decode,
    moe_grouped_words.py), "default 2f" the same with the two-multiply decode (the decode of
    weights outside the range), "grouped bytes" the byte-decode grouped GEMMs. "words" =
    dot_t_words (weights decoded two per op into tensor-core registers), "gather" = a
    program's rows are its expert's own tokens (32 per chunk); bm / n / k = rows (tokens) /
    weight rows / inputs per program, w = num_warps, s = num_stages, r = max_registers.
    --quick keeps each batch's main questions."""
    cases: dict[str, tuple[str, dict]] = {"default": (DEFAULT, {})}
    if num_tokens <= 64:
        cases["default 2f"] = (DEFAULT, TWO_FACTORS)
    if num_tokens <= 16:
        # 128 weight rows on 8 warps (two warpgroups sharing one activation tile) and the
        # other measured losers (benchmarks/NOTES.md): full bench only.
        if not quick:
            cases |= {"words n128 k256 w8": gemv(128, 256, num_warps=8),
                      "words n64 k512 s2": gemv(64, 512, num_stages=2),
                      "words n64 k256 s2 r80": gemv(64, 256, num_stages=2, max_registers=80)}
    elif num_tokens <= 64:
        # Default: gathered rows, 32 per chunk, 64 x 256 tiles, 2 stages, 128 registers.
        # 128 rows on 8 warps: within run-to-run spread of the default (NOTES.md): again.
        cases["gather n128 k256 w8 s2"] = gemv(128, 256, num_warps=8, num_stages=2,
                                               gather_rows=True, block_m=32)
        if not quick:
            cases |= {"token rows n128 k128": gemv(128, 128, gather_rows=False),
                      "gather bm16 k256 s2 r128": gemv(64, 256, num_stages=2, gather_rows=True,
                                                       block_m=16, max_registers=128),
                      "grouped bm16 n64 k128": grouped(BYTES, 16, 64, 128, num_warps=4)}
    elif num_tokens >= 4096:
        # Default: the word-decode grouped GEMMs, 128 x 128 tiles on 8 warps, each K step's
        # scale bytes loaded a step early and carried in registers (moe_grouped_words.py).
        # k256 (the scales through cp.async), the byte decode and n64: full bench only.
        cases["grouped bytes"] = grouped(BYTES)
        if not quick:
            cases |= {"grouped words n128 k256 s2": grouped(WORDS, 128, 128, 256, 8, 2),
                      "grouped words n64 k128 s2": grouped(WORDS, 128, 64, 128, 4, 2)}
    return cases


FP8_DOWN_VARIANTS = {"fp8 down": dict(use_dot_scaled=False),
                     "fp8 down dot_scaled": dict(use_dot_scaled=True)}


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
           peer_ms: float, graph: bool, graph_step=None) -> dict:
    """Eager and (small batches) CUDA-graph milliseconds of `step` (the replayed one
    ``graph_step`` where given); the ratios use the graph figure where there is one (what the
    engine pays once it captures decode)."""
    eager = time_ms(step)
    replayed = float("nan")
    if graph:
        try:
            replayed = time_graph_ms(graph_step or step)
        except Exception:  # a path with a host sync cannot be captured: eager only
            pass
    ms = eager if replayed != replayed else replayed
    return {"ms": ms, "eager_ms": eager, "graph_ms": replayed,
            "fraction_of_copy_bw": weight_bytes / (ms * 1e-3) / copy_bw,
            "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate,
            "speedup_vs_peer": peer_ms / ms}


def run(token_counts: list[int], out_dir: Path | None, budget_s: float, quick: bool) -> dict:
    from atomk31.ops.moe import moe_experts_mxfp4_torch, mxfp4_scales_allow_one_factor
    from atomk31.triton_kernels.moe_gemv import moe_experts_mxfp4_gemv_words_triton
    from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_grouped_triton
    from atomk31.triton_kernels.moe_grouped_words import moe_experts_mxfp4_grouped_words_triton
    from atomk31.triton_kernels.moe_routing import RouteConfig, moe_route_triton
    from benchmarks.kernels.variants.moe_fp8_down import (moe_experts_mxfp4_fp8_down,
                                                          moe_experts_mxfp4_fp8_down_torch)

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    w13_packed, w13_scales = random_mxfp4(2 * INTERMEDIATE, LATENT)
    w2_packed, w2_scales = random_mxfp4(LATENT, INTERMEDIATE)
    weights_mx = (w13_packed, w13_scales, w2_packed, w2_scales)
    # Once, as the engine's MoE layer does at load.
    flag = {"one_factor_exact": mxfp4_scales_allow_one_factor(w13_scales, w2_scales)}
    print(f"one_factor_exact (scale bytes 0 or 59..192): {flag['one_factor_exact']}", flush=True)
    w13_bf16 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, LATENT, device=DEVICE,
                           dtype=torch.bfloat16) * 0.02
    w2_bf16 = torch.randn(NUM_EXPERTS, LATENT, INTERMEDIATE, device=DEVICE,
                          dtype=torch.bfloat16) * 0.02
    router = torch.randn(NUM_EXPERTS, LATENT, device=DEVICE) * 0.05
    bias = torch.zeros(NUM_EXPERTS, device=DEVICE)
    kernels = engine_kernels(DEVICE)
    launchers = {
        GEMV: lambda z, w, i, knobs: moe_experts_mxfp4_gemv_words_triton(
            z, w, i, *weights_mx, 4.0, 25.0, **(flag | knobs)),
        WORDS: lambda z, w, i, knobs: moe_experts_mxfp4_grouped_words_triton(
            z, w, i, *weights_mx, 4.0, 25.0, **(flag | knobs)),
        BYTES: lambda z, w, i, knobs: moe_experts_mxfp4_grouped_triton(
            z, w, i, *weights_mx, 4.0, 25.0, **knobs),
        DEFAULT: lambda z, w, i, knobs: kernels.eager.moe_experts_mxfp4(
            z, w, i, *weights_mx, 4.0, 25.0, **(flag | knobs)),
        FP8_DOWN: lambda z, w, i, knobs: moe_experts_mxfp4_fp8_down(
            z, w, i, *weights_mx, 4.0, 25.0, **knobs),
    }
    replayed = {DEFAULT: lambda z, w, i, knobs: kernels.graph.moe_experts_mxfp4(
        z, w, i, *weights_mx, 4.0, 25.0, **(flag | knobs))}
    rows = []
    deadline = time.monotonic() + budget_s
    print_header()
    for num_tokens in token_counts:
        if time.monotonic() > deadline:
            print(f"{num_tokens:>4} skipped: over the --budget-s time budget", flush=True)
            continue
        graph = num_tokens <= 64
        z = torch.randn(num_tokens, LATENT, device=DEVICE, dtype=torch.bfloat16)
        weights, ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0)
        expected = moe_experts_mxfp4_torch(z, weights, ids, *weights_mx, 4.0, 25.0)
        used = int(torch.unique(ids).numel())
        weight_bytes = used * expert_bytes()
        flops = 6 * num_tokens * TOP_K * INTERMEDIATE * LATENT
        row = {"tokens": num_tokens, "experts_used": used, "weight_bytes": weight_bytes,
               "floor_bytes_us": weight_bytes / copy_bw * 1e6,
               "floor_flops_us": flops / matmul_rate * 1e6,
               "routing_ms": time_ms(lambda: moe_route_triton(z, router, bias, TOP_K, True,
                                                              1.0))}
        rows.append(row)
        print_floors(row)
        peer = grouped_mm_peer(z, ids, w13_bf16, w2_bf16)
        peer_bytes = used * 2 * 3 * INTERMEDIATE * LATENT              # BF16 weights in use
        if peer is not None:
            row["peer grouped_mm bf16"] = _timed(peer, peer_bytes, flops, copy_bw, matmul_rate,
                                                 float("nan"), graph)
            print_variant(row, "peer grouped_mm bf16")
        peer_ms = row.get("peer grouped_mm bf16", {}).get("ms", float("nan"))
        cases = {name: (kind, knobs, expected)
                 for name, (kind, knobs) in variants(num_tokens, quick).items()}
        if num_tokens in (16, 4096) and not quick:        # a variant: no default selects it
            expected_fp8 = moe_experts_mxfp4_fp8_down_torch(z, weights, ids, *weights_mx, 4.0,
                                                            25.0)
            cases |= {name: (FP8_DOWN, knobs, expected_fp8)
                      for name, knobs in FP8_DOWN_VARIANTS.items()}
        for name, (kind, knobs, reference) in cases.items():
            if time.monotonic() > deadline:  # compiles are most of the time: stay in budget
                row[name] = "skipped: over the --budget-s time budget"
                print_variant(row, name)
                continue
            step = lambda kind=kind, knobs=knobs: launchers[kind](z, weights, ids, knobs)  # noqa
            graph_step = (lambda kind=kind, knobs=knobs: replayed[kind](z, weights, ids, knobs)) \
                if kind in replayed else None
            try:
                error = relative_error(step(), reference)
                timing = _timed(step, weight_bytes, flops, copy_bw, matmul_rate, peer_ms, graph,
                                graph_step)
            except Exception as failure:  # a variant that does not compile is reported
                row[name] = f"failed: {type(failure).__name__}: {str(failure)[:200]}"
                print_variant(row, name)
                continue
            row[name] = {**timing, "relative_error": error, "correct": error <= TOLERANCE}
            print_variant(row, name)

        def routed_step(logits: str | None, table):
            w, i = moe_route_triton(z, router, bias, TOP_K, True, 1.0, RouteConfig(logits))
            return table.moe_experts_mxfp4(z, w, i, *weights_mx, 4.0, 25.0, **flag)
        routed = {"default + routing": None}
        if not quick and num_tokens <= 64:  # both routers
            fused_ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0,
                                         RouteConfig("fused"))[1]
            split_ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0,
                                         RouteConfig("split"))[1]
            row["routing_split_ids_match"] = bool(torch.equal(split_ids, fused_ids))
            print(f"{num_tokens:>4} split router ids match the fused router's: "
                  f"{row['routing_split_ids_match']}", flush=True)
            routed["default + fused routing"] = "fused"
            routed["default + split routing"] = "split"
        for name, logits in routed.items():
            row[name] = _timed(lambda lg=logits: routed_step(lg, kernels.eager), weight_bytes,
                               flops, copy_bw, matmul_rate, peer_ms, graph,
                               lambda lg=logits: routed_step(lg, kernels.graph))
            print_variant(row, name)
        # Written after every batch size: a run stopped at its time limit keeps its rows.
        write_result("moe_mxfp4", payload(rows, copy_bw, matmul_rate), out_dir)
    path = write_result("moe_mxfp4", payload(rows, copy_bw, matmul_rate), out_dir)
    print(f"wrote {path}")
    print_best(rows)
    return payload(rows, copy_bw, matmul_rate)


def payload(rows: list[dict], copy_bw: float, matmul_rate: float) -> dict:
    return {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
            "experts": NUM_EXPERTS, "top_k": TOP_K, "latent": LATENT,
            "intermediate": INTERMEDIATE,
            "timing": "ms = CUDA graph replay median up to 64 tokens (eager_ms beside it), "
                      "eager (do_bench) above", "rows": rows}


def print_header() -> None:
    print(f"{'T':>4} {'variant':>26} {'graph ms':>8} {'eager ms':>8} {'of copy':>7} "
          f"{'of mma':>7} {'x peer':>6} {'x dflt':>6} {'err/bound':>9}", flush=True)


def print_floors(row: dict) -> None:
    print(f"{row['tokens']:>4} floors: bytes {row['floor_bytes_us']:.1f} us, flops "
          f"{row['floor_flops_us']:.1f} us; {row['experts_used']} experts; routing "
          f"{row['routing_ms'] * 1e3:.1f} us eager", flush=True)


def print_variant(row: dict, name: str) -> None:
    """One line per variant as soon as it is measured (x dflt: default ms / this ms)."""
    value = row[name]
    if isinstance(value, str):
        print(f"{row['tokens']:>4} {name[:26]:>26} {value[:90]}", flush=True)
        return
    default = row.get("default")
    speedup = default["ms"] / value["ms"] if isinstance(default, dict) else float("nan")
    error = value.get("relative_error", float("nan")) / TOLERANCE
    print(f"{row['tokens']:>4} {name[:26]:>26} {value['graph_ms']:8.4f} "
          f"{value['eager_ms']:8.4f} {value['fraction_of_copy_bw']:7.3f} "
          f"{value['fraction_of_matmul_rate']:7.4f} {value['speedup_vs_peer']:6.2f} "
          f"{speedup:6.2f} {error:9.2e}{'' if value.get('correct', True) else '  WRONG'}",
          flush=True)


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
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="batch sizes (default 1 4 16 64 256 4096; --quick: 1 16 64 4096 4, "
                             "4 last as it shares 16's compiles)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="skip the remaining variants after this many seconds")
    parser.add_argument("--quick", action="store_true",
                        help="fewer configurations (about 90 s on an H200)")
    args = parser.parse_args()
    tokens = args.tokens or ([1, 16, 64, 4096, 4] if args.quick else [1, 4, 16, 64, 256, 4096])
    # --quick: the whole command in ~90 s, of which ~10 s go to start-up and the two limits.
    run(tokens, args.out, args.budget_s if not args.quick else min(args.budget_s, 68.0),
        args.quick)


if __name__ == "__main__":
    main()
