"""Triton indexer scoring over a paged FP8 key cache, 16 requests x 4 verification rows.

Figure: bytes moved per second (every key of every request read once, 132 B, plus the
[64, L] fp32 scores written) against the device copy bandwidth measured in the same run,
for contexts 16K to 1M; also FLOP/s (2 * H_I * 128 per row and causal key) against the BF16
GEMM rate, since 4 rows x 32 heads = 248 FLOP per key byte puts this shape near the ridge.
Peers: the op's torch implementation (up to 64K) and the same kernel on the fp8 tensor cores
(`use_fp8_dot`, outside the op's tolerance: reported for scale only).

Usage: python -m benchmarks.kernels.bench_indexer_score [--out DIR] [--contexts 16384 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.triton_kernels.indexer_score import indexer_score_triton
from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

NUM_REQUESTS = 16
ROWS_PER_REQUEST = 4  # verification rows
NUM_INDEX_HEADS = 32  # H_I
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
CONTEXTS = [16384, 32768, 65536, 131072, 262144, 524288, 1048576]
MAX_TORCH_CONTEXT = 65536


def make_block_table(num_requests: int, context: int, device: str) -> torch.Tensor:
    """Each request owns ceil(context / 128) blocks, handed out in a shuffled order."""
    blocks_per_request = -(-context // BLOCK_SIZE)
    order = torch.randperm(num_requests * blocks_per_request, device=device)
    return order.view(num_requests, blocks_per_request).to(torch.int32)


def make_index_cache(num_blocks: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 keys as the cache stores them: e4m3 values and one fp32 scale per key."""
    values = (torch.randn(num_blocks, BLOCK_SIZE, 128, device=device) * 64).to(
        torch.float8_e4m3fn)
    scales = torch.rand(num_blocks, BLOCK_SIZE, device=device) * 0.01 + 1e-3
    return values, scales


def verification_rows(num_requests: int, context: int, device: str):
    """(row_request, row_position): 4 rows per request at positions context-4 .. context-1."""
    request = torch.arange(num_requests, device=device).repeat_interleave(ROWS_PER_REQUEST)
    offset = torch.arange(ROWS_PER_REQUEST, device=device).repeat(num_requests)
    return request.to(torch.int32), (context - ROWS_PER_REQUEST + offset).to(torch.int64)


def indexer_inputs(context: int, values: torch.Tensor, scales: torch.Tensor, device: str):
    """The indexer_score arguments for 16 requests x 4 rows at `context` keys each."""
    block_table = make_block_table(NUM_REQUESTS, context, device)
    row_request, row_position = verification_rows(NUM_REQUESTS, context, device)
    num_rows = row_request.shape[0]
    q = torch.randn(num_rows, NUM_INDEX_HEADS, 128, device=device).to(torch.bfloat16)
    head_weights = torch.randn(num_rows, NUM_INDEX_HEADS, device=device) * 0.02
    return (q, head_weights, values, scales, "fp8", "e4m3fn", block_table, row_request,
            row_position, BLOCK_SIZE)


def cpu_reference(args: tuple) -> torch.Tensor:
    """The torch implementation on the CPU (IEEE fp32, as the tests use it) over a compact
    copy of the blocks the rows read."""
    (q, head_weights, values, scales, index_format, fp8_variant, block_table, row_request,
     row_position, block_size) = args
    used = block_table.flatten().long()
    compact_table = torch.arange(used.numel(), dtype=torch.int32).view(block_table.shape)
    return indexer_score_torch(q.cpu(), head_weights.cpu(), values[used].cpu(),
                               scales[used].cpu(), index_format, fp8_variant, compact_table,
                               row_request.cpu(), row_position.cpu(), block_size)


def bench_context(context: int, values: torch.Tensor, scales: torch.Tensor, copy_bw: float,
                  matmul_rate: float) -> dict:
    args = indexer_inputs(context, values, scales, DEVICE)
    num_rows = NUM_REQUESTS * ROWS_PER_REQUEST
    num_bytes = NUM_REQUESTS * context * 132 + num_rows * context * 4
    flops = 2 * NUM_INDEX_HEADS * 128 * num_rows * context
    result = {"context": context, "bytes": num_bytes, "flops": flops}
    variants = {"triton": lambda: indexer_score_triton(*args),
                "triton_fp8_dot": lambda: indexer_score_triton(*args, use_fp8_dot=True)}
    if context <= MAX_TORCH_CONTEXT:
        variants["torch"] = lambda: indexer_score_torch(*args)
    reference = cpu_reference(args) if context <= 32768 else None
    for name, fn in variants.items():
        ms = time_ms(fn)
        entry = {"ms": ms, "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                 "matmul_fraction": flops / (ms * 1e-3) / matmul_rate}
        if reference is not None:
            finite = torch.isfinite(reference)
            error = (fn().cpu() - reference).abs().masked_fill(~finite, 0).max().item()
            entry["max_abs_error_vs_torch_cpu"] = error
            entry["max_abs_score"] = reference.abs().masked_fill(~finite, 0).max().item()
        result[name] = entry
    if "torch" in result:
        result["speedup_vs_torch"] = result["torch"]["ms"] / result["triton"]["ms"]
    return result


def run(contexts: list[int], copy_bw: float, matmul_rate: float) -> list[dict]:
    torch.manual_seed(0)
    num_blocks = NUM_REQUESTS * -(-max(contexts) // BLOCK_SIZE)
    values, scales = make_index_cache(num_blocks, DEVICE)
    return [bench_context(c, values, scales, copy_bw, matmul_rate) for c in contexts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    args = parser.parse_args()
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    results = run(args.contexts, copy_bw, matmul_rate)
    path = write_result("triton_indexer_score", {
        "shape": f"{NUM_REQUESTS} requests x {ROWS_PER_REQUEST} rows, H_I {NUM_INDEX_HEADS}, "
                 f"fp8 keys, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print(f"{'context':>8} {'triton ms':>10} {'of BW':>6} {'of GEMM':>8} {'fp8dot ms':>10} "
          f"{'of BW':>6} {'torch ms':>9}")
    for r in results:
        torch_ms = f"{r['torch']['ms']:9.3f}" if "torch" in r else f"{'-':>9}"
        print(f"{r['context']:>8} {r['triton']['ms']:10.3f} "
              f"{r['triton']['bandwidth_fraction']:6.1%} {r['triton']['matmul_fraction']:8.1%} "
              f"{r['triton_fp8_dot']['ms']:10.3f} "
              f"{r['triton_fp8_dot']['bandwidth_fraction']:6.1%} {torch_ms}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
