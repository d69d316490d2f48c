"""Routed MXFP4 experts (latent MoE) on the proxy shapes: atomk31's Triton grouped GEMMs.

Proxy shapes (MODEL_SPEC §2.3 widths, 64 experts): latent Dl = 3584, intermediate F = 3072,
top-16, tokens 1 to 4096, BF16 activations, random MXFP4 weights and random routing.
Figures: weight bytes of the experts in use (packed + scales) / time against the measured
copy bandwidth (what bounds small batches), FLOP/s (6 F Dl per (token, expert) pair)
against the measured BF16 matrix rate (large batches), and a peer measured side by side:
torch._grouped_mm on the same routing with BF16 weights (4x the weight bytes).

Run: python -m benchmarks.kernels.bench_moe [--out DIR] [--tokens 1 16 4096]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

NUM_EXPERTS, TOP_K, LATENT, INTERMEDIATE = 64, 16, 3584, 3072


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


def run(token_counts: list[int], out_dir: Path | None) -> dict:
    from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_triton
    from atomk31.triton_kernels.moe_routing import moe_route_triton

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    w13_packed, w13_scales = random_mxfp4(2 * INTERMEDIATE, LATENT)
    w2_packed, w2_scales = random_mxfp4(LATENT, INTERMEDIATE)
    w13_bf16 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, LATENT, device="cuda",
                           dtype=torch.bfloat16) * 0.02
    w2_bf16 = torch.randn(NUM_EXPERTS, LATENT, INTERMEDIATE, device="cuda",
                          dtype=torch.bfloat16) * 0.02
    router = torch.randn(NUM_EXPERTS, LATENT, device="cuda") * 0.05
    bias = torch.zeros(NUM_EXPERTS, device="cuda")
    rows = []
    for num_tokens in token_counts:
        z = torch.randn(num_tokens, LATENT, device="cuda", dtype=torch.bfloat16)
        weights, ids = moe_route_triton(z, router, bias, TOP_K, True, 1.0)
        used = int(torch.unique(ids).numel())
        weight_bytes = used * expert_bytes()
        flops = 6 * num_tokens * TOP_K * INTERMEDIATE * LATENT
        row = {"tokens": num_tokens, "experts_used": used, "weight_bytes": weight_bytes}
        variants = {"atomk31": {}}
        if num_tokens >= 256:
            variants["atomk31 bm64"] = {"block_m": 64}
            variants["atomk31 bm128 bn128"] = {"block_m": 128, "block_n": 128, "block_k": 64}
        else:
            variants["atomk31 bn32"] = {"block_n": 32}
        if num_tokens in (16, 1024):
            variants["atomk31 dot_scaled"] = {"use_dot_scaled": True}
        for name, knobs in variants.items():
            try:
                ms = time_ms(lambda: moe_experts_mxfp4_triton(
                    z, weights, ids, w13_packed, w13_scales, w2_packed, w2_scales, 4.0, 25.0,
                    **knobs))
            except Exception as error:  # a variant that does not compile is reported
                row[name] = f"failed: {type(error).__name__}: {str(error)[:200]}"
                continue
            row[name] = {"ms": ms, "fraction_of_copy_bw": weight_bytes / (ms * 1e-3) / copy_bw,
                         "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate}
        route_ms = time_ms(lambda: moe_route_triton(z, router, bias, TOP_K, True, 1.0))
        row["routing_ms"] = route_ms
        peer = grouped_mm_peer(z, ids, w13_bf16, w2_bf16)
        if peer is not None:
            try:
                ms = time_ms(peer)
                row["torch._grouped_mm bf16"] = {
                    "ms": ms, "fraction_of_matmul_rate": flops / (ms * 1e-3) / matmul_rate}
            except Exception as error:
                row["torch._grouped_mm bf16"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
        rows.append(row)
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "experts": NUM_EXPERTS, "top_k": TOP_K, "latent": LATENT,
               "intermediate": INTERMEDIATE, "rows": rows}
    path = write_result("moe_mxfp4", payload, out_dir)
    print(f"{'tokens':>6} {'variant':>24} {'ms':>8} {'of copy bw':>10} {'of matmul':>10}")
    for row in rows:
        for name, value in row.items():
            if isinstance(value, dict):
                print(f"{row['tokens']:>6} {name:>24} {value['ms']:8.3f} "
                      f"{value.get('fraction_of_copy_bw', float('nan')):10.3f} "
                      f"{value['fraction_of_matmul_rate']:10.3f}")
            elif isinstance(value, str):
                print(f"{row['tokens']:>6} {name:>24} {value}")
    print(f"wrote {path}")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024, 4096])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.tokens, args.out)


if __name__ == "__main__":
    main()
