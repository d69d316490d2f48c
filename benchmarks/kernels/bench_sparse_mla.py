"""Triton sparse MLA decode: H = 96 heads per row over k = 2048 selected FP8 latent rows.

Figure: FLOP/s (2 * H * k * (576 + 512) per row: scores and values) against the BF16 GEMM
rate measured in the same run (anchor: FlashMLA's sparse decode, about 410 TFLOP/s on an
H800), for plain decode (16 rows) and verification (16 requests x 4 rows), per tile
configuration (heads x keys per step x pipeline stages); bytes per second (the selected
rows read once per row) against the copy bandwidth.
Peer: the op's torch implementation.

Usage: python -m benchmarks.kernels.bench_sparse_mla [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.triton_kernels.sparse_mla import sparse_mla_triton
from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

NUM_HEADS = 96
TOP_K = 2048
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
SOFTMAX_SCALE = 192**-0.5
CONTEXT = 131072  # tokens per request the selections are drawn from
ROW_COUNTS = [16, 64]
CONFIGS = [(64, 64, 2), (64, 32, 2)]  # heads, keys per step, stages (32x3, 16x3: slower)


def make_latent_cache(num_blocks: int, device: str) -> torch.Tensor:
    rows = torch.randn(num_blocks, BLOCK_SIZE, 576, device=device) * 4
    return rows.to(torch.float8_e4m3fn)


def random_selection(num_rows: int, num_slots: int, device: str) -> torch.Tensor:
    """k distinct slots per row, in no order (what topk_slots hands attention)."""
    keys = torch.rand(num_rows, num_slots, device=device)
    return keys.topk(TOP_K, dim=1).indices.to(torch.int32)


def bench_rows(num_rows: int, cache: torch.Tensor, copy_bw: float, matmul_rate: float) -> dict:
    slots = random_selection(num_rows, min(cache.shape[0] * BLOCK_SIZE, CONTEXT), DEVICE)
    q = torch.randn(num_rows, NUM_HEADS, 576, device=DEVICE).to(torch.bfloat16)
    flops = 2 * num_rows * NUM_HEADS * TOP_K * (576 + 512)
    num_bytes = num_rows * TOP_K * 576
    want_out, _ = sparse_mla_torch(q.float(), cache, 1.0, slots, SOFTMAX_SCALE)
    result = {"rows": num_rows, "heads": NUM_HEADS, "k": TOP_K, "flops": flops,
              "bytes": num_bytes}
    variants = {f"triton_bh{h}_bn{n}_s{st}": (
        lambda h=h, n=n, st=st: sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE,
                                                  block_h=h, block_n=n, num_stages=st))
        for h, n, st in CONFIGS}
    variants["torch"] = lambda: sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    for name, fn in variants.items():
        out, _ = fn()
        error = ((out - want_out).norm() / want_out.norm()).item()
        ms = time_ms(fn)
        result[name] = {"ms": ms, "matmul_fraction": flops / (ms * 1e-3) / matmul_rate,
                        "tflops": flops / (ms * 1e-3) / 1e12,
                        "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                        "relative_error_vs_torch_fp32": error}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    cache = make_latent_cache(CONTEXT // BLOCK_SIZE, DEVICE)
    results = [bench_rows(n, cache, copy_bw, matmul_rate) for n in ROW_COUNTS]
    path = write_result("triton_sparse_mla", {
        "shape": f"H {NUM_HEADS}, k {TOP_K}, fp8 latent, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    for r in results:
        cells = [f"{name} {v['ms']:.3f} ms {v['tflops']:.0f} TF ({v['matmul_fraction']:.0%}) "
                 f"err {v['relative_error_vs_torch_fp32']:.1e}"
                 for name, v in r.items() if isinstance(v, dict)]
        print(f"rows {r['rows']:>3}: " + " | ".join(cells))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
