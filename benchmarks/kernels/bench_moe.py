"""Routed MXFP4 experts (latent MoE) on the proxy shapes: atomk31's Triton GEMVs / grouped GEMMs.

Proxy shapes (MODEL_SPEC §2.3 widths, 64 experts): latent Dl = 3584, intermediate F = 3072,
top-16, tokens 1 to 4096, BF16 activations, random MXFP4 weights and random routing.
Each variant is checked against the torch op (max-abs error / max-abs value, BF16 products:
about 1e-3 expected) and timed. Figures: weight bytes of the experts in use (packed + scales)
/ time against the measured copy bandwidth (what bounds small batches), FLOP/s (6 F Dl per
(token, expert) pair) against the measured BF16 matrix rate (large batches), and the peer
measured side by side: torch._grouped_mm on the same routing with BF16 weights (4x the weight
bytes). Routing (router GEMM + top-k kernel) is timed alone and with the default experts path.

Routing is timed both ways (logits in the kernel, the default up to 64 tokens, and cuBLAS).

Run: python -m benchmarks.kernels.bench_moe [--out DIR] [--tokens 1 16 4096] [--budget-s 75]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

NUM_EXPERTS, TOP_K, LATENT, INTERMEDIATE = 64, 16, 3584, 3072
TOLERANCE = 1e-2

GEMV = "gemv"        # atomk31/triton_kernels/moe_gemv.py, called directly with these knobs
GROUPED = "grouped"  # moe_experts_mxfp4_triton(small_batch=False, ...knobs)
DEFAULT = "default"  # moe_experts_mxfp4_triton as the engine calls it


def gemv(mode: str, block_n: int, block_k: int, num_warps: int = 4, num_stages: int = 3,
         loop_stages: int = 0) -> tuple[str, dict]:
    return GEMV, dict(mode=mode, block_n=block_n, block_k=block_k, num_warps=num_warps,
                      num_stages=num_stages, loop_stages=loop_stages)


def variants(num_tokens: int) -> dict[str, tuple[str, dict]]:
    """The designs / configurations timed side by side at this batch size (round 2: the
    defaults are round 1's winners; "ls" = K loop pipelined explicitly, "s" = num_stages,
    dot_t = weights as the dot's first operand)."""
    cases: dict[str, tuple[str, dict]] = {"default": (DEFAULT, {})}
    if num_tokens == 1:
        cases |= {
            "gemv fma n32 k128 w4 ls3": gemv("fma", 32, 128, loop_stages=3),
            "gemv fma_f32 n32 k128 w4": gemv("fma_f32", 32, 128),
            "gemv fma_f32 n64 k128 w4": gemv("fma_f32", 64, 128),
            "gemv fma_f32 n64 k128 w8 ls3": gemv("fma_f32", 64, 128, num_warps=8,
                                                 loop_stages=3),
            "gemv fma_f32 n32 k256 w4 ls2": gemv("fma_f32", 32, 256, loop_stages=2),
            "gemv fma_words n32 k128 w4": gemv("fma_words", 32, 128),
            "gemv dot n32 k128 w4": gemv("dot", 32, 128),
            "gemv dot_t n64 k128 w4": gemv("dot_t", 64, 128),
            "gemv dot_t n128 k128 w8": gemv("dot_t", 128, 128, num_warps=8),
            "gemv dot_t n64 k256 w4": gemv("dot_t", 64, 256),
            "grouped bm16 (old design)": (GROUPED, dict(block_n=64, block_k=128)),
        }
    elif num_tokens <= 4:
        cases |= {
            "gemv dot n64 k128 w4": gemv("dot", 64, 128),
            "gemv dot n32 k128 w4 s4": gemv("dot", 32, 128, num_stages=4),
            "gemv dot_t n64 k128 w4": gemv("dot_t", 64, 128),
            "gemv dot_t n128 k128 w8": gemv("dot_t", 128, 128, num_warps=8),
            "gemv fma_f32 n64 k128 w4": gemv("fma_f32", 64, 128),
        }
    elif num_tokens <= 16:
        cases |= {
            "gemv dot n32 k128 w4": gemv("dot", 32, 128),
            "gemv dot n64 k128 w4 s4": gemv("dot", 64, 128, num_stages=4),
            "gemv dot n128 k128 w8": gemv("dot", 128, 128, num_warps=8),
            "gemv dot_t n64 k128 w4": gemv("dot_t", 64, 128),
            "gemv dot_t n128 k128 w8": gemv("dot_t", 128, 128, num_warps=8),
        }
    elif num_tokens <= 64:
        cases |= {"gemv dot n32 k128 w4": gemv("dot", 32, 128),
                  "gemv dot_t n64 k128 w4": gemv("dot_t", 64, 128),
                  "gemv dot_t n128 k128 w8": gemv("dot_t", 128, 128, num_warps=8),
                  "grouped bm16 n64 k128": (GROUPED, dict(block_m=16, block_n=64,
                                                            block_k=128))}
    elif num_tokens <= 256:
        cases |= {"grouped bm64 n64 k128 r1": (GROUPED, dict(block_m=64, block_n=64,
                                                                      block_k=128))}
    return cases


def random_mxfp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (NUM_EXPERTS, rows, cols // 2), dtype=torch.uint8, device="cuda")
    scales = torch.randint(118, 124, (NUM_EXPERTS, rows, cols // 32), dtype=torch.uint8,
                           device="cuda")
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


def run(token_counts: list[int], out_dir: Path | None, budget_s: float) -> dict:
    from atomk31.ops.moe import moe_experts_mxfp4_torch
    from atomk31.triton_kernels.moe_gemv import moe_experts_mxfp4_gemv_triton
    from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_triton
    from atomk31.triton_kernels.moe_routing import moe_route_triton

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    w13_packed, w13_scales = random_mxfp4(2 * INTERMEDIATE, LATENT)
    w2_packed, w2_scales = random_mxfp4(LATENT, INTERMEDIATE)
    weights_mx = (w13_packed, w13_scales, w2_packed, w2_scales)
    w13_bf16 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, LATENT, device="cuda",
                           dtype=torch.bfloat16) * 0.02
    w2_bf16 = torch.randn(NUM_EXPERTS, LATENT, INTERMEDIATE, device="cuda",
                          dtype=torch.bfloat16) * 0.02
    router = torch.randn(NUM_EXPERTS, LATENT, device="cuda") * 0.05
    bias = torch.zeros(NUM_EXPERTS, device="cuda")
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
        z = torch.randn(num_tokens, LATENT, device="cuda", dtype=torch.bfloat16)
        weights, ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0)
        expected = moe_experts_mxfp4_torch(z, weights, ids, *weights_mx, 4.0, 25.0)
        used = int(torch.unique(ids).numel())
        weight_bytes = used * expert_bytes()
        flops = 6 * num_tokens * TOP_K * INTERMEDIATE * LATENT
        row = {"tokens": num_tokens, "experts_used": used, "weight_bytes": weight_bytes,
               "floor_bytes_us": weight_bytes / copy_bw * 1e6,
               "floor_flops_us": flops / matmul_rate * 1e6}
        peer = grouped_mm_peer(z, ids, w13_bf16, w2_bf16)
        peer_ms = time_ms(peer) if peer is not None else float("nan")
        peer_bytes = used * 2 * 3 * INTERMEDIATE * LATENT              # BF16 weights in use
        row["torch._grouped_mm bf16"] = {
            "ms": peer_ms, "fraction_of_copy_bw": peer_bytes / (peer_ms * 1e-3) / copy_bw,
            "fraction_of_matmul_rate": flops / (peer_ms * 1e-3) / matmul_rate}
        for name, (kind, knobs) in variants(num_tokens).items():
            if time.monotonic() > deadline:  # compiles are most of the time: stay in budget
                row[name] = "skipped: over the --budget-s time budget"
                continue
            step = lambda: launchers[kind](z, weights, ids, knobs)  # noqa: E731
            try:
                error = relative_error(step(), expected)
                ms = time_ms(step)
            except Exception as failure:  # a variant that does not compile is reported
                row[name] = f"failed: {type(failure).__name__}: {str(failure)[:200]}"
                continue
            row[name] = {"ms": ms, "relative_error": error, "correct": error <= TOLERANCE,
                         "fraction_of_copy_bw": weight_bytes / (ms * 1e-3) / copy_bw,
                         "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate,
                         "speedup_vs_peer": peer_ms / ms}
        row["routing_ms"] = time_ms(lambda: moe_route_triton(z, router, bias, TOP_K, True, 1.0))
        row["routing_gemm_ms"] = time_ms(lambda: moe_route_triton(z, router, bias, TOP_K, True,
                                                                  1.0, fuse_router=False))
        fused_ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0, fuse_router=True)[1]
        row["routing_fused_ids_match"] = bool(torch.equal(fused_ids, ids))

        def routed_step():
            w, i = moe_route_triton(z, router, bias, TOP_K, True, 1.0)
            return moe_experts_mxfp4_triton(z, w, i, *weights_mx, 4.0, 25.0)
        ms = time_ms(routed_step)
        row["default + routing"] = {"ms": ms,
                                    "fraction_of_copy_bw": weight_bytes / (ms * 1e-3) / copy_bw,
                                    "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate,
                                    "speedup_vs_peer": peer_ms / ms}
        rows.append(row)
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "experts": NUM_EXPERTS, "top_k": TOP_K, "latent": LATENT,
               "intermediate": INTERMEDIATE, "rows": rows}
    path = write_result("moe_mxfp4", payload, out_dir)
    print_table(rows)
    print(f"wrote {path}")
    print_best(rows)
    return payload


def print_table(rows: list[dict]) -> None:
    print(f"{'tokens':>6} {'variant':>28} {'ms':>8} {'of copy bw':>10} {'of matmul':>10} "
          f"{'vs peer':>8} {'rel err':>9}")
    for row in rows:
        print(f"{row['tokens']:>6} floors: bytes {row['floor_bytes_us'] / 1e3:.3f} ms, "
              f"flops {row['floor_flops_us'] / 1e3:.3f} ms; {row['experts_used']} experts; "
              f"routing alone {row['routing_ms']:.3f} ms (cuBLAS logits "
              f"{row['routing_gemm_ms']:.3f} ms; fused ids match: "
              f"{row['routing_fused_ids_match']})")
        for name, value in row.items():
            if isinstance(value, dict):
                print(f"{row['tokens']:>6} {name:>28} {value['ms']:8.3f} "
                      f"{value['fraction_of_copy_bw']:10.3f} "
                      f"{value['fraction_of_matmul_rate']:10.4f} "
                      f"{value.get('speedup_vs_peer', 1.0):8.2f} "
                      f"{value.get('relative_error', float('nan')):9.2e}"
                      f"{'' if value.get('correct', True) else '  WRONG'}")
            elif isinstance(value, str):
                print(f"{row['tokens']:>6} {name:>28} {value}")


def print_best(rows: list[dict]) -> None:
    """Last lines (what a log tail shows): the fastest correct variant per batch size."""
    print("best correct variant per batch (ms, of copy bw, of matmul, x peer; default ms):")
    for row in rows:
        timed = {name: value for name, value in row.items() if isinstance(value, dict)
                 and value.get("correct") and "relative_error" in value}
        if not timed:
            print(f"T={row['tokens']}: none")
            continue
        name, best = min(timed.items(), key=lambda item: item[1]["ms"])
        default = row.get("default", {})
        print(f"T={row['tokens']}: {name} {best['ms']:.3f} {best['fraction_of_copy_bw']:.3f} "
              f"{best['fraction_of_matmul_rate']:.4f} x{best['speedup_vs_peer']:.2f}; default "
              f"{default.get('ms', float('nan')) if isinstance(default, dict) else default}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256, 4096])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=75.0,
                        help="skip the remaining variants after this many seconds")
    args = parser.parse_args()
    run(args.tokens, args.out, args.budget_s)


if __name__ == "__main__":
    main()
