"""Dense MLA decode over the paged FP8 latent cache: 16 requests, H = 96, 16K and 128K.

Kernels: the Hopper Gluon kernel (the warp-specialized sparse kernel in its dense mode,
gluon_kernels/hopper/dense_mla.py: what the `hopper` target runs) at its default and fixed key
splits, the Triton kernel's default tiles (`triton_default`: what the `triton` target runs),
"default" (what the engine's graph steps run on this GPU, from its kernel table) and, unless
--no-triton-tiles, the Triton kernel's tile variants.

Figures: bytes per second (each request's latent rows read once, 576 B per token) against
the copy bandwidth measured in the same run, and FLOP/s (2 * H * (576 + 512) per row and
causal key) against the BF16 GEMM rate, for plain decode (1 row per request) and for
verification (4 rows per request), for several tile configurations side by side: rows per
program (g: verification rows sharing one key stream), heads per program (bh), keys per
step (bn), warps (w), stages (s) and key splits (sp; default: the fewest that fill the
multiprocessors). Each variant is checked against the fp32 torch op (at 16K) first.
With 96 heads on an FP8 cache one row does 363 FLOP per byte, past the H200's ridge (~180),
so decode is matrix-bound: the copy-bandwidth fraction cannot reach 70% with bf16
products; the figure to judge is the fraction of the roofline, max(of BW, of GEMM).
Peers: the op's torch implementation (16K only) and torch's scaled_dot_product_attention
on the same keys dequantized to bf16 and gathered contiguous beforehand (untimed), the 96 x
rows query vectors of a request as the queries of one head (MQA), unmasked.

Floors on an H200 (~750 TFLOP/s, ~4.25 TB/s), 16 requests: 16K 1 row 54.8 GFLOP = 73 us,
151 MB = 36 us; 128K 1 row 438 GFLOP = 0.58 ms, 1.21 GB = 0.28 ms; 4 rows 4x the FLOP
(0.29 ms and 2.3 ms), the same bytes.

Every call passes the host-side hints the engine passes (max_position, rows_per_request),
so the launchers read nothing from the device. The rounds that chose the defaults:
benchmarks/NOTES.md.

Usage: python -m benchmarks.kernels.bench_dense_mla [--out DIR] [--contexts 16384 131072]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from atomk31.ops.dense_mla import dense_mla_torch
from atomk31.triton_kernels.dense_mla import dense_mla_triton
from atomk31.triton_kernels.mla_tiles import MLATileConfig
from gluon_kernels.hopper.dense_mla import dense_mla_hopper
from benchmarks.common import (
    engine_kernels,
    measure_copy_bandwidth,
    measure_matmul_rate,
    time_graph_ms,
    time_ms,
    write_result,
)

NUM_REQUESTS = 16
NUM_HEADS = 96
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
SOFTMAX_SCALE = 192**-0.5
CONTEXTS = [16384, 131072]
ROWS_PER_REQUEST = [1, 4]
# (rows per request passed as the hint (1: none), heads, keys per step, warps, stages, splits
# or None, scores via memory, value splits) per rows/request; None: the launcher's choice.
# The first of each list is the fastest measured; "vs2": two programs per query block, each
# owning half of the value columns (see bench_sparse_mla.py).
CONFIGS = {
    1: [(1, 64, 128, 8, 1, None, False, 1), (1, 64, 128, 8, 1, 8, False, 1),
        (1, 64, 64, 4, 1, None, False, 2), (1, 64, 128, 4, 1, None, False, 2),
        (1, 128, 64, 8, 1, None, False, 2)],
    4: [(4, 16, 64, 8, 2, None, False, 1), (4, 16, 128, 8, 1, None, False, 1),
        (2, 32, 64, 8, 2, None, False, 1), (4, 16, 64, 4, 1, None, False, 2),
        (4, 16, 64, 4, 2, None, False, 2), (4, 32, 64, 8, 1, None, False, 2),
        (1, 64, 128, 8, 1, None, False, 1)],
}

# Tile configs with the next tile's key rows read ahead (p1) and FP16 products over the FP8
# latent (f16), see mla_kernel.py; by name.
KNOB_VARIANTS = {
    1: {"g1_bh128_bn64_s1_vs2_p1_f16": {"block_h": 128, "block_n": 64, "num_warps": 8,
                                         "num_stages": 1, "value_splits": 2, "prefetch": 1,
                                         "fp16_operands": True},
        "g1_bh128_bn64_s1_vs2_p1": {"block_h": 128, "block_n": 64, "num_warps": 8,
                                     "num_stages": 1, "value_splits": 2, "prefetch": 1}},
    4: {"g4_bh32_bn64_s1_vs2_p1_f16": {"block_h": 32, "block_n": 64, "num_warps": 8,
                                        "num_stages": 1, "value_splits": 2, "prefetch": 1,
                                        "fp16_operands": True}},
}


def make_block_table(num_requests: int, context: int, device: str) -> torch.Tensor:
    """Each request owns ceil(context / BLOCK_SIZE) blocks, handed out in a shuffled order."""
    blocks_per_request = -(-context // BLOCK_SIZE)
    order = torch.randperm(num_requests * blocks_per_request, device=device)
    return order.view(num_requests, blocks_per_request).to(torch.int32)


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


def sdpa_peer(args: tuple, context: int, rows_per_request: int):
    """SDPA over bf16 keys gathered per request: q [N, 1, rows * H, 576], k [N, 1, S, 576]."""
    q, latent, _, block_table = args[:4]
    pages = latent.view(torch.uint8)[block_table.long()].view(latent.dtype)  # fp8 gather
    keys = pages.reshape(NUM_REQUESTS, -1, 576)[:, :context].to(torch.bfloat16)[:, None]
    values = keys[..., :512]
    queries = q.view(NUM_REQUESTS, 1, rows_per_request * NUM_HEADS, 576)
    return lambda: F.scaled_dot_product_attention(queries, keys, values, scale=SOFTMAX_SCALE)


def variant_name(config: tuple) -> str:
    rows, block_h, block_n, num_warps, num_stages, num_splits, via_memory, value_splits = config
    splits = "" if num_splits is None else f"_sp{num_splits}"
    flags = ("_vm" if via_memory else "") + ("" if value_splits == 1 else f"_vs{value_splits}")
    return f"g{rows}_bh{block_h}_bn{block_n}_w{num_warps}_s{num_stages}{splits}{flags}"


GLUON_SPLITS = (None, 2, 4)  # num_splits of the Gluon kernel's variants (None: the launcher's)


def bench_case(context: int, rows_per_request: int, latent: torch.Tensor, copy_bw: float,
               matmul_rate: float, triton_tiles: bool = True) -> dict:
    args = dense_inputs(context, rows_per_request, latent, DEVICE)
    num_rows = NUM_REQUESTS * rows_per_request
    num_bytes = NUM_REQUESTS * context * 576
    flops = 2 * NUM_HEADS * (576 + 512) * num_rows * context
    result = {"context": context, "rows_per_request": rows_per_request, "bytes": num_bytes,
              "flops": flops}
    hints = {"max_position": context - 1}
    variants = {} if not triton_tiles else {variant_name(c): (
        lambda c=c: dense_mla_triton(*args, **hints, rows_per_request=c[0], config=MLATileConfig(
            block_h=c[1], block_n=c[2], num_warps=c[3], num_stages=c[4], num_splits=c[5],
            scores_via_memory=c[6], value_splits=c[7])))
        for c in CONFIGS[rows_per_request]}
    if triton_tiles:
        variants.update({name: (lambda kw=kw: dense_mla_triton(
            *args, **hints, rows_per_request=rows_per_request, config=MLATileConfig(**kw)))
            for name, kw in KNOB_VARIANTS[rows_per_request].items()})
    # The Triton kernel's default tiles (the `triton` target's, off Hopper).
    variants["triton_default"] = lambda: dense_mla_triton(
        *args, **hints, rows_per_request=rows_per_request)
    for splits in GLUON_SPLITS:
        name = "gluon_ws" + ("" if splits is None else f"_sp{splits}")
        variants[name] = lambda splits=splits: dense_mla_hopper(
            *args, **hints, rows_per_request=rows_per_request,
            config=MLATileConfig(num_splits=splits))
    # What the engine's graph steps run here (its table), with what it passes: the longest
    # position and the rows per request.
    engine_dense = engine_kernels(DEVICE).graph.dense_mla
    variants["default"] = lambda: engine_dense(*args, **hints, rows_per_request=rows_per_request)
    want = None
    if context == min(CONTEXTS):
        variants["torch"] = lambda: dense_mla_torch(*args)
        want, _ = dense_mla_torch(args[0].float(), *args[1:])
    try:
        variants["sdpa_bf16"] = sdpa_peer(args, context, rows_per_request)
    except torch.cuda.OutOfMemoryError as error:
        result["sdpa_bf16"] = {"error": f"OutOfMemoryError: {str(error)[:120]}"}
    for name, fn in variants.items():
        try:
            got = fn()
            torch.cuda.synchronize()
            # Replayed from a CUDA graph (what a captured decode step pays; eager launches of
            # the Gluon kernel cost ~0.1-0.2 ms of host time), eager beside it; the torch op
            # reads the device, so eager only.
            eager_ms = time_ms(fn)
            ms = eager_ms if name == "torch" else time_graph_ms(fn)
        except Exception as error:  # one failing configuration must not hide the others
            result[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            continue
        entry = {"ms": ms, "eager_ms": eager_ms, "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                 "matmul_fraction": flops / (ms * 1e-3) / matmul_rate}
        if want is not None and name != "sdpa_bf16":
            entry["relative_error_vs_torch_fp32"] = ((got[0] - want).norm() / want.norm()).item()
        result[name] = entry
    peer_ms = result.get("sdpa_bf16", {}).get("ms")
    for value in result.values():
        if isinstance(value, dict) and "ms" in value and peer_ms:
            value["speedup_vs_sdpa"] = peer_ms / value["ms"]
    return result


def print_table(results: list[dict]) -> None:
    print(f"{'r':>1} {'context':>7} {'variant':<28} {'ms':>9} {'of BW':>6} {'of GEMM':>8} "
          f"{'x sdpa':>7} {'rel err':>8}")
    for r in results:
        for name, v in r.items():
            if not isinstance(v, dict):
                continue
            head = f"{r['rows_per_request']:>1} {r['context']:>7} {name:<28}"
            if "error" in v:
                print(f"{head} FAILED {v['error'][:60]}")
                continue
            error = v.get("relative_error_vs_torch_fp32")
            print(f"{head} {v['ms']:9.3f} {v['bandwidth_fraction']:6.1%} "
                  f"{v['matmul_fraction']:8.1%} {v.get('speedup_vs_sdpa', 0):7.2f} "
                  f"{'' if error is None else f'{error:8.1e}'}")
    for r in results:
        timed = {name: v["ms"] for name, v in r.items() if isinstance(v, dict) and "ms" in v
                 and name not in ("torch", "sdpa_bf16")}
        best = min(timed, key=timed.get)
        print(f"{r['rows_per_request']} {r['context']:>7} best {best} "
              f"{r[best]['matmul_fraction']:.1%} of GEMM "
              f"(default {r['default'].get('matmul_fraction', 0):.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS_PER_REQUEST,
                        help="rows per request")
    parser.add_argument("--no-triton-tiles", action="store_true",
                        help="skip the Triton tile variants (defaults and peers only)")
    args = parser.parse_args()
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    torch.manual_seed(0)
    latent = make_latent_cache(NUM_REQUESTS * -(-max(args.contexts) // BLOCK_SIZE), DEVICE)
    results = [bench_case(c, n, latent, copy_bw, matmul_rate,
                          triton_tiles=not args.no_triton_tiles)
               for n in args.rows for c in args.contexts]
    path = write_result("triton_dense_mla", {
        "shape": f"{NUM_REQUESTS} requests, H {NUM_HEADS}, fp8 latent, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"wrote {path}")
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print_table(results)


if __name__ == "__main__":
    main()
