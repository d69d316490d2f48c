"""Gluon indexer scoring and radix top-k against their peers, at K3.1 sizes, on one GPU.

Figures (each also as a ratio to the limit measured in the same run, benchmarks/common.py):
* indexer_score, verify step (8 rows of one request over L keys, H_I = 32), decode batch
  (64 requests x 1 row) and a prefill chunk (2048 rows): bytes of keys and scores moved per
  second against the copy bandwidth, and FLOP/s against the BF16 GEMM rate; peers are the
  op's torch implementation and the Triton kernel when atomk31/triton_kernels has one.
* topk_positions over [8, 131072] with k = 2048: Gluon radix select against the torch
  implementation (stable sort) and torch.topk (no tie rule, for scale).

Usage: python -m benchmarks.kernels.bench_gluon_indexer [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.ops.topk import topk_positions_torch
from benchmarks.common import (
    measure_copy_bandwidth,
    measure_matmul_rate,
    time_ms,
    write_result,
)
from gluon_kernels.amd.indexer_score import indexer_score_gluon
from gluon_kernels.amd.radix_topk import topk_positions_gluon

NUM_HEADS = 32
BLOCK_SIZE = 128
KEY_BYTES = {"fp8": 132, "mxfp4": 68}


def optional_peer(module: str, name: str) -> Callable | None:
    """A Triton peer if the module exists yet (it is written in parallel with this one)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def make_index_cache(num_keys_per_request: list[int], index_format: str, device: str):
    """A paged index cache filled with random keys (values drawn directly in the format)."""
    blocks = [-(-n // BLOCK_SIZE) for n in num_keys_per_request]
    num_blocks = sum(blocks)
    order = torch.randperm(num_blocks, device=device).to(torch.int32)
    block_table = torch.full((len(blocks), max(blocks)), -1, dtype=torch.int32, device=device)
    start = 0
    for request, count in enumerate(blocks):
        block_table[request, :count] = order[start:start + count]
        start += count
    if index_format == "fp8":
        values = (torch.randn(num_blocks, BLOCK_SIZE, 128, device=device) * 64).to(
            torch.float8_e4m3fn)
        scales = torch.rand(num_blocks, BLOCK_SIZE, device=device) * 0.01 + 1e-3
    else:
        values = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, 64), dtype=torch.uint8,
                               device=device)
        scales = torch.randint(118, 130, (num_blocks, BLOCK_SIZE, 4), dtype=torch.uint8,
                               device=device)
    return block_table, values, scales


def indexer_case(name: str, rows: list[tuple[int, int]], lengths: list[int], index_format: str,
                 copy_bw: float, matmul_rate: float, peers: dict[str, Callable]) -> dict:
    device = "cuda"
    block_table, values, scales = make_index_cache(lengths, index_format, device)
    row_request = torch.tensor([r for r, _ in rows], dtype=torch.int32, device=device)
    row_position = torch.tensor([p for _, p in rows], dtype=torch.int64, device=device)
    q = torch.randn(len(rows), NUM_HEADS, 128, device=device)
    head_weights = torch.randn(len(rows), NUM_HEADS, device=device) * 0.05
    args = (q, head_weights, values, scales, index_format, "e4m3fn", block_table, row_request,
            row_position, BLOCK_SIZE)
    # Fewest bytes: every key of every request once (verify groups read each key once), plus
    # the scores; FLOPs: 2 * H_I * 128 per (row, causal key).
    keys_read = sum(lengths)
    causal_pairs = sum(p + 1 for _, p in rows)
    num_bytes = keys_read * KEY_BYTES[index_format] + 4 * causal_pairs
    flops = 2 * NUM_HEADS * 128 * causal_pairs
    result = {"case": name, "index_format": index_format, "rows": len(rows),
              "keys": keys_read, "bytes": num_bytes, "flops": flops}
    reference = indexer_score_torch(*args)
    for peer, fn in {"gluon": indexer_score_gluon, **peers}.items():
        out = fn(*args)
        finite = torch.isfinite(reference)
        error = float((out - reference).abs().masked_fill(~finite, 0).max())
        ms = time_ms(lambda: fn(*args))
        result[peer] = {"ms": ms, "max_abs_error_vs_torch": error,
                        "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                        "matmul_fraction": flops / (ms * 1e-3) / matmul_rate}
    for peer in peers:
        result[f"gluon_speedup_vs_{peer}"] = result[peer]["ms"] / result["gluon"]["ms"]
    # The kernel alone (inputs already quantized and grouped): separates the launch from
    # the host-side preparation that the op entry point does on every call.
    launch = prepared_launch(args)
    ms = time_ms(launch)
    result["gluon_kernel_only"] = {
        "ms": ms, "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
        "matmul_fraction": flops / (ms * 1e-3) / matmul_rate}
    return result


def prepared_launch(args: tuple) -> Callable[[], None]:
    """A closure that only launches the Gluon indexer kernel on pre-built inputs."""
    from atomk31.quant.index_keys import quantize_index_keys
    from gluon_kernels.amd.indexer_score import (
        group_query_rows, launch_indexer_score, max_row_groups,
    )
    from gluon_kernels.targets import active_target

    (q, head_weights, values, scales, index_format, fp8_variant, block_table, row_request,
     row_position, block_size) = args
    q_values, q_scales = quantize_index_keys(q, index_format, fp8_variant)
    group_rows, group_max_position = group_query_rows(
        row_request, row_position, max_row_groups(q.shape[0], block_table.shape[0]))
    scores = torch.empty(q.shape[0], int(row_position.max()) + 1, device=q.device)
    prepared = dict(
        target=active_target(), index_format=index_format,
        q_values=q_values.contiguous().view(torch.uint8), q_scales=q_scales.contiguous(),
        head_weights=head_weights.float().contiguous(), key_values=values.view(torch.uint8),
        key_scales=scales, block_table=block_table, group_rows=group_rows,
        group_max_position=group_max_position, row_request=row_request,
        row_position=row_position.to(torch.int32), scores=scores, block_size=block_size)
    return lambda: launch_indexer_score(**prepared)


def topk_case(num_rows: int, length: int, k: int) -> dict:
    scores = torch.randn(num_rows, length, device="cuda")
    lengths = torch.full((num_rows,), length, device="cuda")
    result = {"case": f"topk N{num_rows} L{length} k{k}", "rows": num_rows, "length": length,
              "k": k}
    exact = topk_positions_gluon(scores, k, lengths)
    expected = topk_positions_torch(scores, k, lengths)
    result["gluon_equals_torch"] = bool(torch.equal(exact, expected))
    peers = {"gluon": lambda: topk_positions_gluon(scores, k, lengths),
             "torch": lambda: topk_positions_torch(scores, k, lengths),
             "torch.topk (no tie rule)": lambda: torch.topk(scores, k, dim=1)}
    triton_topk = optional_peer("atomk31.triton_kernels.topk", "topk_triton")
    if triton_topk is not None:
        peers["triton"] = lambda: triton_topk(scores, k, lengths)
    for peer, fn in peers.items():
        result[peer] = {"ms": time_ms(fn)}
    result["gluon_speedup_vs_torch"] = result["torch"]["ms"] / result["gluon"]["ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    peers = {"torch": indexer_score_torch}
    triton_peer = optional_peer("atomk31.triton_kernels.indexer_score", "indexer_score_triton")
    if triton_peer is not None:
        peers["triton"] = triton_peer
    long = 65536
    cases = [
        ("verify: 8 rows x 64K keys", [(0, long - 8 + i) for i in range(8)], [long]),
        ("decode: 64 requests x 16K keys", [(r, 16383) for r in range(64)], [16384] * 64),
        ("prefill: 2048 rows over 8K keys", [(0, 6144 + i) for i in range(2048)], [8192]),
    ]
    results = []
    for index_format in ("fp8", "mxfp4"):
        for name, rows, lengths in cases:
            results.append(indexer_case(name, rows, lengths, index_format, copy_bw,
                                        matmul_rate, peers))
    results.append(topk_case(8, 131072, 2048))
    results.append(topk_case(64, 16384, 2048))
    path = write_result("gluon_indexer", {"copy_bandwidth_Bps": copy_bw,
                                          "bf16_matmul_flops": matmul_rate,
                                          "triton_peer": triton_peer is not None,
                                          "results": results}, out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    for r in results:
        cells = [f"{peer} {r[peer]['ms']:.3f} ms" for peer in r if isinstance(r[peer], dict)]
        extra = (f" bw {r['gluon']['bandwidth_fraction']:.2f}" if "bandwidth_fraction"
                 in r.get("gluon", {}) else "")
        print(f"{r['case']:<36} {r.get('index_format', ''):<6} " + " | ".join(cells) + extra)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
