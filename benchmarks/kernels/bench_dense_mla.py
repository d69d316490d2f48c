"""Triton dense MLA decode over the paged FP8 latent cache: 16 requests, H = 96, 16K to 1M.

Figures: bytes per second (each request's latent rows read once, 576 B per token) against
the copy bandwidth measured in the same run, and FLOP/s (2 * H * (576 + 512) per row and
causal key) against the BF16 GEMM rate, for plain decode (1 row per request) and for
verification (4 rows per request). With 96 heads on an FP8 cache one row already does
363 FLOP per byte, past the H200's ridge (~180), so both limits are reported.
Peer: the op's torch implementation at the shortest context.

Usage: python -m benchmarks.kernels.bench_dense_mla [--out DIR] [--contexts 16384 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.dense_mla import dense_mla_torch
from atomk31.triton_kernels.dense_mla import dense_mla_triton
from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result
from benchmarks.kernels.bench_indexer_score import make_block_table

NUM_REQUESTS = 16
NUM_HEADS = 96
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
SOFTMAX_SCALE = 192**-0.5
CONTEXTS = [16384, 32768, 65536, 131072, 262144, 524288, 1048576]
ROWS_PER_REQUEST = [1, 4]


def make_latent_cache(num_blocks: int, device: str) -> torch.Tensor:
    latent = torch.empty(num_blocks, BLOCK_SIZE, 576, dtype=torch.float8_e4m3fn, device=device)
    for start in range(0, num_blocks, 4096):  # in slices: the fp32 draw stays small
        rows = torch.randn(min(4096, num_blocks - start), BLOCK_SIZE, 576, device=device)
        latent[start:start + rows.shape[0]] = (rows * 4).to(torch.float8_e4m3fn)
    return latent


def dense_inputs(context: int, rows_per_request: int, latent: torch.Tensor, device: str):
    block_table = make_block_table(NUM_REQUESTS, context, device)
    request = torch.arange(NUM_REQUESTS, device=device).repeat_interleave(rows_per_request)
    offset = torch.arange(rows_per_request, device=device).repeat(NUM_REQUESTS)
    row_position = (context - rows_per_request + offset).to(torch.int64)
    q = torch.randn(request.shape[0], NUM_HEADS, 576, device=device).to(torch.bfloat16)
    return (q, latent, 1.0, block_table, request.to(torch.int32), row_position, BLOCK_SIZE,
            SOFTMAX_SCALE)


def bench_case(context: int, rows_per_request: int, latent: torch.Tensor, copy_bw: float,
               matmul_rate: float) -> dict:
    args = dense_inputs(context, rows_per_request, latent, DEVICE)
    num_rows = NUM_REQUESTS * rows_per_request
    num_bytes = NUM_REQUESTS * context * 576
    flops = 2 * NUM_HEADS * (576 + 512) * num_rows * context
    result = {"context": context, "rows_per_request": rows_per_request, "bytes": num_bytes,
              "flops": flops}
    variants = {"triton": lambda: dense_mla_triton(*args)}
    if context == min(CONTEXTS):
        variants["torch"] = lambda: dense_mla_torch(*args)
        want, _ = dense_mla_torch(args[0].float(), *args[1:])
        got, _ = dense_mla_triton(*args)
        result["relative_error_vs_torch_fp32"] = ((got - want).norm() / want.norm()).item()
    for name, fn in variants.items():
        ms = time_ms(fn)
        result[name] = {"ms": ms, "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                        "matmul_fraction": flops / (ms * 1e-3) / matmul_rate}
    return result


def run(contexts: list[int], copy_bw: float, matmul_rate: float) -> list[dict]:
    torch.manual_seed(0)
    latent = make_latent_cache(NUM_REQUESTS * -(-max(contexts) // BLOCK_SIZE), DEVICE)
    return [bench_case(c, n, latent, copy_bw, matmul_rate)
            for n in ROWS_PER_REQUEST for c in contexts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    args = parser.parse_args()
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    results = run(args.contexts, copy_bw, matmul_rate)
    path = write_result("triton_dense_mla", {
        "shape": f"{NUM_REQUESTS} requests, H {NUM_HEADS}, fp8 latent, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print(f"{'rows/req':>8} {'context':>8} {'ms':>9} {'of BW':>6} {'of GEMM':>8}")
    for r in results:
        print(f"{r['rows_per_request']:>8} {r['context']:>8} {r['triton']['ms']:9.3f} "
              f"{r['triton']['bandwidth_fraction']:6.1%} {r['triton']['matmul_fraction']:8.1%}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
