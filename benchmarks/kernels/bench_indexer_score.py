"""Triton indexer scoring over a paged index-key cache, 16 requests x 4 verification rows:
kernel variants side by side (product type, tiling, pipelining), errors and speed.

Figure: bytes moved per second (every key of every request read once, 132 B for FP8, 68 B
for MXFP4, plus the [64, L] fp32 scores written) against the device copy bandwidth measured
in the same run; also FLOP/s (2 * H_I * 128 per row and causal key) against the BF16 GEMM
rate (the fp8 tensor cores run about twice that). Peer: the op's torch implementation, at
16K only (it is slow). Times: `ms` replays the launch from a CUDA graph (what a captured
decode step pays; no L2 flush, and the 16K cache, 35 MB, fits the H200's 50 MB L2), `eager`
is do_bench's (launch included, L2 flushed).

Errors: each variant's scores against the op's torch implementation on the CPU (the contract,
IEEE fp32) at 16K, and against a float64 evaluation on the GPU at 128K and 1M of the queries
quantized on the CPU (torch's GPU quantizer divides by 448 as a multiply by its rounded
reciprocal: some scales and codes differ from the contract's, which made round 1's 128K
check read ~680 for every variant); `worst` is the largest error over the GPU test's bound
1e-5 |score| + 1e-5 max |score| (<= 1 passes). The number of query codes on which torch's GPU
and CPU quantizers differ is printed too.

"gluon fp16" runs the Hopper Gluon kernel (gluon_kernels/hopper/indexer_score.py, what graph
steps run on sm_90) beside the Triton configurations. The FP8 tensor-core variants (Triton's
fp8 dots, Gluon's fp8 / fp8_acc32 / fp16_ss products) left the package after they were
measured: their figures are in benchmarks/NOTES.md.

Usage: python -m benchmarks.kernels.bench_indexer_score [--quick] [--out DIR]
           [--variants NAME ...] [--contexts N ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.indexer_score import indexer_score_torch
from atomk31.quant.index_keys import dequantize_index_keys, quantize_index_keys
from atomk31.triton_kernels.indexer_score import IndexerScoreConfig, indexer_score_triton
from benchmarks.common import (
    measure_copy_bandwidth,
    measure_matmul_rate,
    time_graph_ms,
    time_ms,
    write_result,
)

NUM_REQUESTS = 16
ROWS_PER_REQUEST = 4  # verification rows
NUM_INDEX_HEADS = 32  # H_I
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
CONTEXTS = [16384, 131072, 1048576]
CPU_REFERENCE_CONTEXT = 16384  # longer contexts: the float64 reference on the GPU
KEY_BYTES = {"fp8": 132, "mxfp4": 68}

# name -> (key format, config). "default" is the launcher's choice (for FP8 keys fp16 n64 w4
# s6 pps2 tg32, for MXFP4 keys bf16 n128 s4). "fp16": e4m3 codes -> fp16 operands, one
# conversion instruction per two values (exact; the queries' e4m3 codes too). "nN wW sS":
# BLOCK_N keys a tile, warps, pipeline stages; "ppsN" programs launched per multiprocessor
# (n64 w4 fits two at a time: pps2 is one wave); "tgN": pages of N tiles read at once (32:
# picking a tile's page stays in a warp; 0: one block-table read per tile).
BF16 = dict(dot="bf16")
N64_W4 = dict(dot="bf16", block_n=64, num_warps=4, num_stages=6)
FP16 = dict(dot="fp16", tile_group=32)
FP16_N64_W4 = dict(dot="fp16", tile_group=32, block_n=64, num_warps=4)
VARIANTS: dict[str, tuple[str, IndexerScoreConfig | None]] = {
    "default": ("fp8", None),
    "bf16 n128 s4": ("fp8", IndexerScoreConfig(**BF16, num_stages=4)),
    "bf16 n64 w4 s6": ("fp8", IndexerScoreConfig(**N64_W4)),
    "fp16 n128 s4": ("fp8", IndexerScoreConfig(**FP16, num_stages=4)),
    "fp16 n128 s3": ("fp8", IndexerScoreConfig(**FP16, num_stages=3)),
    "fp16 n128 s4 tg64": ("fp8", IndexerScoreConfig(**FP16 | dict(tile_group=64),
                                                    num_stages=4)),
    "fp16 n64 w4 s6": ("fp8", IndexerScoreConfig(**FP16_N64_W4, num_stages=6)),
    "fp16 n64 w4 s4": ("fp8", IndexerScoreConfig(**FP16_N64_W4, num_stages=4)),
    "fp16 n64 w4 s4 pps2": ("fp8", IndexerScoreConfig(**FP16_N64_W4, num_stages=4,
                                                      programs_per_sm=2)),
    "fp16 n64 w4 s6 pps2 tg0": ("fp8", IndexerScoreConfig(**FP16_N64_W4 | dict(tile_group=0),
                                                          num_stages=6, programs_per_sm=2)),
    "mxfp4 default": ("mxfp4", None),
}
GLUON_VARIANTS = ("gluon fp16",)  # the Hopper Gluon kernel (FP8 keys)
TOP_K = 2048  # the indexer's selection (§4.6)
QUICK_VARIANTS = ["default", "fp16 n128 s3", "fp16 n64 w4 s4 pps2", "mxfp4 default"]


def make_index_cache(num_blocks: int, index_format: str, device: str):
    """Keys quantized as kv_write stores them (randn keys; FP8 codes reach +-448)."""
    values, scales = [], []
    for start in range(0, num_blocks, 8192):  # 1M keys at a time
        count = min(8192, num_blocks - start)
        keys = torch.randn(count, BLOCK_SIZE, 128, device=device) * 2.0
        v, s = quantize_index_keys(keys, index_format, "e4m3fn")
        values.append(v)
        scales.append(s)
    return torch.cat(values), torch.cat(scales)


def indexer_inputs(context: int, values: torch.Tensor, scales: torch.Tensor,
                   index_format: str, device: str) -> tuple:
    """The indexer_score arguments: 16 requests x 4 rows at positions context-4 .. context-1,
    each request's pages shuffled over the cache."""
    blocks_per_request = -(-context // BLOCK_SIZE)
    order = torch.randperm(values.shape[0], device=device)[:NUM_REQUESTS * blocks_per_request]
    block_table = order.view(NUM_REQUESTS, blocks_per_request).to(torch.int32)
    request = torch.arange(NUM_REQUESTS, device=device).repeat_interleave(ROWS_PER_REQUEST)
    offset = torch.arange(ROWS_PER_REQUEST, device=device).repeat(NUM_REQUESTS)
    row_position = (context - ROWS_PER_REQUEST + offset).to(torch.int64)
    num_rows = request.shape[0]
    q = torch.randn(num_rows, NUM_INDEX_HEADS, 128, device=device).to(torch.bfloat16)
    head_weights = torch.randn(num_rows, NUM_INDEX_HEADS, device=device)
    head_weights *= NUM_INDEX_HEADS**-0.5 * 128**-0.5  # mixed signs, as the model's
    return (q, head_weights, values, scales, index_format, "e4m3fn", block_table,
            request.to(torch.int32), row_position, BLOCK_SIZE)


def cpu_reference(args: tuple) -> torch.Tensor:
    """The torch implementation on the CPU (IEEE fp32, the contract) over a compact copy of
    the blocks the rows read."""
    (q, head_weights, values, scales, index_format, fp8_variant, block_table, row_request,
     row_position, block_size) = args
    used = block_table.flatten().long()
    compact_table = torch.arange(used.numel(), dtype=torch.int32).view(block_table.shape)
    return indexer_score_torch(q.cpu(), head_weights.cpu(), values[used].cpu(),
                               scales[used].cpu(), index_format, fp8_variant, compact_table,
                               row_request.cpu(), row_position.cpu(), block_size)


def float64_reference(args: tuple) -> torch.Tensor:
    """The contract's formula in float64 on the GPU (all rows of a request share L here), the
    queries quantized on the CPU (the contract's quantizer, IEEE division)."""
    (q, head_weights, values, scales, index_format, fp8_variant, block_table, row_request,
     row_position, block_size) = args
    q_values, q_scales = quantize_index_keys(q.cpu(), index_format, fp8_variant)
    q_hat = dequantize_index_keys(q_values, q_scales, index_format).to(q.device).double()
    length = int(row_position.max()) + 1
    scores = torch.full((q.shape[0], length), -torch.inf, dtype=torch.float64, device=q.device)
    positions = torch.arange(length, device=q.device)
    for request in range(block_table.shape[0]):
        rows = (row_request == request).nonzero().flatten()
        pages = block_table[request].long()
        keys = dequantize_index_keys(values[pages], scales[pages], index_format)
        keys = keys.reshape(-1, 128)[:length].double()
        logits = torch.relu(torch.einsum("rhd,sd->rhs", q_hat[rows], keys))
        row_scores = torch.einsum("rh,rhs->rs", head_weights[rows].double(), logits)
        is_future = positions[None, :] > row_position[rows, None]
        scores[rows] = row_scores.masked_fill(is_future, -torch.inf)
        del keys, logits, row_scores
    return scores


def gpu_quantizer_mismatches(q: torch.Tensor, index_format: str) -> int:
    """Query codes on which torch's quantizer on the GPU and on the CPU disagree."""
    gpu_values, _ = quantize_index_keys(q, index_format, "e4m3fn")
    cpu_values, _ = quantize_index_keys(q.cpu(), index_format, "e4m3fn")
    as_bytes = gpu_values.cpu().view(torch.uint8) != cpu_values.view(torch.uint8)
    return int(as_bytes.sum())


def error_summary(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Max abs error and its worst ratio to the GPU test's bound (<= 1 passes)."""
    got, want = got.double().to(want.device), want.double()
    if not torch.equal(torch.isinf(got), torch.isinf(want)) or torch.isnan(got).any():
        return {"max_abs_error": float("inf"), "worst": float("inf"), "mask_ok": False}
    finite = torch.isfinite(want)
    magnitude = torch.where(finite, want.abs(), 0.0)
    error = torch.where(finite, (got - want).abs(), 0.0)
    bound_batch = 1e-5 * magnitude + 1e-5 * magnitude.max()
    bound_row = 1e-5 * magnitude + 1e-5 * magnitude.amax(dim=1, keepdim=True)
    return {"max_abs_error": error.max().item(), "max_abs_score": magnitude.max().item(),
            "worst": (error / bound_batch).max().item(),
            "worst_row_bound": (error / bound_row).max().item(), "mask_ok": True}


def top_k_overlap(got: torch.Tensor, want: torch.Tensor, k: int) -> float:
    """Mean over rows of |top-k(got) & top-k(want)| / k (rows with fewer keys: all of them)."""
    k = min(k, got.shape[1])
    got_top = torch.topk(got.to(want.device).double(), k, dim=1).indices
    want_top = torch.topk(want, k, dim=1).indices
    hits = torch.zeros(got.shape[0], want.shape[1], dtype=torch.bool, device=want.device)
    hits.scatter_(1, want_top, True)
    return hits.gather(1, got_top).double().mean().item()


def bench_context(context: int, caches: dict, variants: list[str], copy_bw: float,
                  matmul_rate: float) -> dict:
    num_rows = NUM_REQUESTS * ROWS_PER_REQUEST
    flops = 2 * NUM_INDEX_HEADS * 128 * num_rows * context
    inputs = {f: indexer_inputs(context, *caches[f], f, DEVICE) for f in caches}
    result = {"context": context, "flops": flops, "variants": {},
              "gpu_quantizer_mismatches": {f: gpu_quantizer_mismatches(a[0], f)
                                           for f, a in inputs.items()}}
    references = {}
    for f, args in inputs.items():
        if context == CPU_REFERENCE_CONTEXT:
            references[f] = ("torch_cpu", cpu_reference(args))
        else:
            references[f] = ("float64_gpu", float64_reference(args))
    calls = {}
    for name in variants:
        if name in GLUON_VARIANTS:
            from gluon_kernels.hopper.indexer_score import indexer_score_hopper

            calls[name] = ("fp8", lambda a=inputs["fp8"]:
                           indexer_score_hopper(*a, num_positions=context))
            continue
        index_format, config = VARIANTS[name]
        args = inputs[index_format]
        calls[name] = (index_format, lambda a=args, c=config: indexer_score_triton(
            *a, num_positions=context, config=c))
    if context == CPU_REFERENCE_CONTEXT:
        calls["torch (peer)"] = ("fp8", lambda a=inputs["fp8"]: indexer_score_torch(*a))
    for name, (index_format, fn) in calls.items():
        num_bytes = NUM_REQUESTS * context * KEY_BYTES[index_format] + num_rows * context * 4
        entry = {"bytes": num_bytes}
        try:
            out = fn()
            if index_format in references:
                kind, reference = references[index_format]
                entry["error_vs_" + kind] = error_summary(out, reference)
                entry["topk_overlap"] = top_k_overlap(out, reference, TOP_K)
            del out
            eager_ms = time_ms(fn)
            ms = time_graph_ms(fn) if name != "torch (peer)" else eager_ms
        except Exception as error:  # one failing variant must not hide the others
            entry["failed"] = f"{type(error).__name__}: {str(error)[:300]}"
            result["variants"][name] = entry
            continue
        entry.update(ms=ms, eager_ms=eager_ms,
                     bandwidth_fraction=num_bytes / (ms * 1e-3) / copy_bw,
                     matmul_fraction=flops / (ms * 1e-3) / matmul_rate)
        result["variants"][name] = entry
        errors = [v["worst"] for k, v in entry.items() if k.startswith("error_vs_")]
        overlap = f", top-{TOP_K} overlap {entry['topk_overlap']:.4f}" \
            if "topk_overlap" in entry else ""
        print(f"  measured {context} {name}: {ms:.3f} ms, err/bound "
              f"{errors[0] if errors else float('nan'):.3f}{overlap}", flush=True)
    peer = result["variants"].get("torch (peer)", {}).get("ms")
    if peer:
        for entry in result["variants"].values():
            if "ms" in entry:
                entry["speedup_vs_torch"] = peer / entry["ms"]
    return result


def print_table(results: list[dict], copy_bw: float, matmul_rate: float) -> None:
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print(f"{'context':>8} {'variant':<24} {'ms':>8} {'eager':>8} {'of BW':>6} {'of GEMM':>8} "
          f"{'x torch':>8} {'err/bound':>10} {'topk':>7}")
    for r in results:
        print(f"{r['context']:>8} query codes torch's GPU quantizer gets wrong: "
              f"{r['gpu_quantizer_mismatches']}")
        for name, e in r["variants"].items():
            if "failed" in e:
                print(f"{r['context']:>8} {name:<24} FAILED {e['failed'][:60]}")
                continue
            errors = [v for k, v in e.items() if k.startswith("error_vs_")]
            worst = f"{errors[0]['worst']:10.3f}" if errors else f"{'-':>10}"
            speedup = f"{e['speedup_vs_torch']:8.1f}" if "speedup_vs_torch" in e else f"{'-':>8}"
            overlap = f"{e['topk_overlap']:7.4f}" if "topk_overlap" in e else f"{'-':>7}"
            print(f"{r['context']:>8} {name:<24} {e['ms']:8.3f} {e['eager_ms']:8.3f} "
                  f"{e['bandwidth_fraction']:6.1%} "
                  f"{e['matmul_fraction']:8.1%} {speedup} {worst} {overlap}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--quick", action="store_true", help="the QUICK_VARIANTS only")
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    parser.add_argument("--variants", nargs="+", default=None,
                        choices=[*VARIANTS, *GLUON_VARIANTS])
    args = parser.parse_args()
    variants = args.variants or (QUICK_VARIANTS if args.quick else [*VARIANTS, *GLUON_VARIANTS])
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    torch.manual_seed(0)
    num_blocks = NUM_REQUESTS * -(-max(args.contexts) // BLOCK_SIZE)
    formats = sorted({VARIANTS[name][0] if name in VARIANTS else "fp8" for name in variants})
    caches = {f: make_index_cache(num_blocks, f, DEVICE) for f in formats}
    results = [bench_context(c, caches, variants, copy_bw, matmul_rate) for c in args.contexts]
    # A run over other contexts than the default set names them, so that runs of one round,
    # one context each, do not overwrite each other's file.
    suffix = "" if args.contexts == CONTEXTS else "_" + "_".join(
        f"{c // 1024}k" for c in args.contexts)
    path = write_result("triton_indexer_score" + suffix, {
        "shape": f"{NUM_REQUESTS} requests x {ROWS_PER_REQUEST} rows, H_I {NUM_INDEX_HEADS}, "
                 f"block {BLOCK_SIZE}",
        "variants": {name: repr(VARIANTS[name][1]) if name in VARIANTS else
                     "gluon_kernels.hopper.indexer_score" for name in variants},
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print_table(results, copy_bw, matmul_rate)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
