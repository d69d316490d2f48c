"""The headline: one DSA layer's decode attention against one dense MLA layer, both ours.

16 requests x 4 verification rows (H = 96, H_I = 32, k = 2048, FP8 latent and FP8 index keys,
128-token blocks), contexts 16K to 1M. DSA = kv_write + indexer_score + topk_slots +
sparse_mla; dense = kv_write + dense_mla (what the layer runs without an indexer). Both
read the same paged caches. Figure: the dense time over the DSA time, with each DSA stage
timed alone; also each path's time as a ratio to its own roofline floor in the same run
(bytes over the copy bandwidth, FLOPs over the BF16 GEMM rate, whichever is larger).

Two timings of each, through the engine's own kernel tables (`engine_kernels`): eager launches
of the eager table (`time_ms`), and the graph table's kernels replayed from a CUDA graph
(`time_graph_ms`: e.g. the Gluon indexer on Hopper), which is what a captured decode step pays;
up to ~128K the DSA layer's eager time is mostly host launch overhead (several kernels of a few
microseconds each). `atomk31 info` lists which kernel each table runs.

Usage: python -m benchmarks.kernels.bench_dsa_layer [--out DIR] [--contexts 16384 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import (engine_kernels, measure_copy_bandwidth, measure_matmul_rate,
                               time_graph_ms, time_ms, write_result)
from benchmarks.kernels.bench_dense_mla import make_block_table, make_latent_cache
from benchmarks.kernels.bench_indexer_score import make_index_cache

NUM_REQUESTS = 16
ROWS_PER_REQUEST = 4
NUM_HEADS = 96
NUM_INDEX_HEADS = 32
TOP_K = 2048
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
SOFTMAX_SCALE = 192**-0.5
CONTEXTS = [16384, 32768, 65536, 131072, 262144, 524288, 1048576]


def layer_steps(context: int, latent: torch.Tensor, values: torch.Tensor,
                scales: torch.Tensor, ops) -> dict:
    """Closures for each stage of one decode step at `context` (inputs built once) through
    the op table ``ops`` (the engine's eager or graph table: the kernels the engine runs),
    given the host-side hints the engine gives (largest position, 4 rows per request)."""
    device = DEVICE
    block_table = make_block_table(NUM_REQUESTS, context, device)
    row_request = torch.arange(NUM_REQUESTS, device=device, dtype=torch.int32)
    row_request = row_request.repeat_interleave(ROWS_PER_REQUEST)
    offset = torch.arange(ROWS_PER_REQUEST, device=device).repeat(NUM_REQUESTS)
    row_position = (context - ROWS_PER_REQUEST + offset).to(torch.int64)
    num_rows = row_request.shape[0]
    slot_mapping = (block_table[row_request.long(), row_position // BLOCK_SIZE].long()
                    * BLOCK_SIZE + row_position % BLOCK_SIZE)
    new_latent = torch.randn(num_rows, 576, device=device).to(torch.bfloat16)
    new_key = torch.randn(num_rows, 128, device=device).to(torch.bfloat16)
    q_index = torch.randn(num_rows, NUM_INDEX_HEADS, 128, device=device).to(torch.bfloat16)
    head_weights = torch.randn(num_rows, NUM_INDEX_HEADS, device=device) * 0.02
    q = torch.randn(num_rows, NUM_HEADS, 576, device=device).to(torch.bfloat16)
    lengths = row_position + 1
    k = min(TOP_K, context)

    def write() -> None:
        ops.kv_write(new_latent, new_key, slot_mapping, latent, 1.0, values, scales, "fp8",
                     "e4m3fn")

    def score() -> torch.Tensor:
        return ops.indexer_score(q_index, head_weights, values, scales, "fp8", "e4m3fn",
                                 block_table, row_request, row_position, BLOCK_SIZE,
                                 num_positions=context)

    scores = score()

    def select() -> torch.Tensor:
        return ops.topk_slots(scores, k, lengths, block_table, row_request, BLOCK_SIZE)

    slots = select()

    def attend_sparse() -> tuple[torch.Tensor, torch.Tensor]:
        return ops.sparse_mla(q, latent, 1.0, slots, SOFTMAX_SCALE)

    def attend_dense() -> tuple[torch.Tensor, torch.Tensor]:
        return ops.dense_mla(q, latent, 1.0, block_table, row_request, row_position,
                             BLOCK_SIZE, SOFTMAX_SCALE, max_position=context - 1,
                             rows_per_request=ROWS_PER_REQUEST)

    def dsa() -> None:
        write()
        sel = ops.topk_slots(score(), k, lengths, block_table, row_request, BLOCK_SIZE)
        ops.sparse_mla(q, latent, 1.0, sel, SOFTMAX_SCALE)

    def dense() -> None:
        write()
        attend_dense()

    return {"kv_write": write, "indexer_score": score, "topk_slots": select,
            "sparse_mla": attend_sparse, "dsa_layer": dsa, "dense_layer": dense}


def floors(context: int, copy_bw: float, matmul_rate: float) -> dict:
    """Roofline floor (ms) of each path: max(bytes / copy bandwidth, FLOPs / GEMM rate)."""
    num_rows = NUM_REQUESTS * 4
    index_bytes = NUM_REQUESTS * context * 132 + num_rows * context * 4 * 3  # keys; scores w+2r
    index_flops = 2 * NUM_INDEX_HEADS * 128 * num_rows * context
    sparse_bytes = num_rows * min(TOP_K, context) * 576
    sparse_flops = 2 * NUM_HEADS * (576 + 512) * num_rows * min(TOP_K, context)
    dense_bytes = NUM_REQUESTS * context * 576
    dense_flops = 2 * NUM_HEADS * (576 + 512) * num_rows * context
    dsa_ms = (max((index_bytes + sparse_bytes) / copy_bw, (index_flops + sparse_flops)
                  / matmul_rate)) * 1e3
    dense_ms = max(dense_bytes / copy_bw, dense_flops / matmul_rate) * 1e3
    return {"dsa_layer": dsa_ms, "dense_layer": dense_ms}


def run(contexts: list[int], copy_bw: float, matmul_rate: float) -> list[dict]:
    torch.manual_seed(0)
    num_blocks = NUM_REQUESTS * -(-max(contexts) // BLOCK_SIZE)
    latent = make_latent_cache(num_blocks, DEVICE)
    values, scales = make_index_cache(num_blocks, "fp8", DEVICE)
    results = []
    kernels = engine_kernels(DEVICE)
    for context in contexts:
        eager_steps = layer_steps(context, latent, values, scales, kernels.eager)
        graph_steps = layer_steps(context, latent, values, scales, kernels.graph)
        result = {"context": context}
        for name, fn in eager_steps.items():
            result[f"{name}_ms"] = time_ms(fn)
            result[f"{name}_graph_ms"] = time_graph_ms(graph_steps[name])
        result["speedup_dsa_vs_dense"] = result["dense_layer_ms"] / result["dsa_layer_ms"]
        result["speedup_dsa_vs_dense_graph"] = (result["dense_layer_graph_ms"]
                                                / result["dsa_layer_graph_ms"])
        for path, floor_ms in floors(context, copy_bw, matmul_rate).items():
            result[f"{path}_floor_ms"] = floor_ms
            result[f"{path}_fraction_of_floor"] = floor_ms / result[f"{path}_graph_ms"]
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    args = parser.parse_args()
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    results = run(args.contexts, copy_bw, matmul_rate)
    path = write_result("triton_dsa_layer", {
        "shape": f"{NUM_REQUESTS} requests x 4 verification rows, H {NUM_HEADS}, H_I "
                 f"{NUM_INDEX_HEADS}, k {TOP_K}, fp8 latent + fp8 keys, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print("CUDA graph (eager) milliseconds")
    print("| context | DSA layer | dense MLA layer | dense / DSA | indexer | top-k | sparse MLA "
          "| kv_write | DSA of floor |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def both(r: dict, name: str) -> str:
        return f"{r[name + '_graph_ms']:.3f} ({r[name + '_ms']:.3f})"

    for r in results:
        print(f"| {r['context'] // 1024}K | {both(r, 'dsa_layer')} | {both(r, 'dense_layer')} "
              f"| {r['speedup_dsa_vs_dense_graph']:.1f}x ({r['speedup_dsa_vs_dense']:.1f}x) "
              f"| {both(r, 'indexer_score')} | {both(r, 'topk_slots')} "
              f"| {both(r, 'sparse_mla')} | {both(r, 'kv_write')} "
              f"| {r['dsa_layer_fraction_of_floor']:.0%} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
