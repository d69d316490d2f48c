"""Triton sparse MLA decode: H = 96 heads per row over k = 2048 selected FP8 latent rows.

Figure: FLOP/s (2 * H * k * (576 + 512) per row: scores and values) against the BF16 GEMM
rate measured in the same run (anchor: FlashMLA's sparse decode, about 410 TFLOP/s on an
H800), and bytes per second (the selected rows read once per row, queries read and fp32
outputs written once) against the copy bandwidth, at 16 and 64 decode rows, for several tile
configurations side by side. Times are CUDA-graph replays (what the engine pays once decode
is captured; the selections of 16 rows, 19 MB, then sit in L2) with the eager time beside.
Each variant is checked against the op's torch implementation (fp32 products) before it is
timed: its relative error over the GPU tests' bound (1e-2). Peer: the op's torch
implementation (eager).

Floors on an H200 (~790 TFLOP/s bf16, ~4.25 TB/s copy): 16 rows 6.85 GFLOP = 8.7 us,
23.9 MB = 5.6 us; 64 rows 27.4 GFLOP = 34.7 us, 95.7 MB = 22.5 us: matrix-bound. With 96
heads padded to 128 and the scores recomputed by both value halves ("vs2") the programs issue
2.04x the counted products: that caps vs2 at ~49% of the GEMM rate.

Variant names: bh heads per program, bn keys per step, w4 four warps (one warpgroup; else
eight), s pipeline stages, sp key splits (default: the fewest that fill the multiprocessors),
vm scores via memory, vs2 value halves, p1 the next tile's key rows read ahead (see
mla_kernel.py), f16 FP16 products over the FP8 latent (queries scaled into FP16's range:
mla_fp16_query.py).

"gluon_hopper" is the Hopper Gluon kernel (gluon_kernels/hopper/sparse_mla.py, the `hopper`
target's: a producer warpgroup converts the keys, a scorer and a value worker), "_spN" with N
key splits. The rounds that chose the defaults, and the variants since removed (the one-role
Gluon kernel, the warp-specialized kernel's other product orders): benchmarks/NOTES.md.

Usage: python -m benchmarks.kernels.bench_sparse_mla [--out DIR] [--rows 16 64] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.triton_kernels.mla_tiles import MLATileConfig
from atomk31.triton_kernels.sparse_mla import sparse_mla_triton
from gluon_kernels.hopper.sparse_mla import sparse_mla_hopper
from benchmarks.common import (
    measure_copy_bandwidth,
    measure_matmul_rate,
    time_graph_ms,
    time_ms,
    write_result,
)

NUM_HEADS = 96
TOP_K = 2048
BLOCK_SIZE = 128
DEVICE = "cuda"  # the benchmarks time GPU kernels
SOFTMAX_SCALE = 192**-0.5
CONTEXT = 131072  # tokens per request the selections are drawn from
ROW_COUNTS = [16, 64]
ERROR_BOUND = 1e-2  # the GPU tests' bound on the output's relative error (bf16 products)


def knobs(block_h: int, block_n: int, num_stages: int, value_splits: int, prefetch: int = 0,
          fp16: bool = False, num_splits: int | None = None, via_memory: bool = False,
          num_warps: int = 8) -> dict:
    return {"config": MLATileConfig(block_h=block_h, block_n=block_n, num_warps=num_warps,
                                    num_stages=num_stages, value_splits=value_splits,
                                    prefetch=prefetch, fp16_operands=fp16,
                                    num_splits=num_splits, scores_via_memory=via_memory)}


def gluon(num_splits: int | None = None) -> dict:
    return {"kernel": "gluon_hopper", "config": MLATileConfig(num_splits=num_splits)}


# Per row count: variant name -> how it runs (the Triton launcher's tile config, or the Gluon
# kernel's key splits). The defaults and the references they were measured against.
VARIANTS = {
    64: {
        "bh128_bn64_s1_vs2": knobs(128, 64, 1, 2),
        "bh128_bn64_s1_vs2_f16": knobs(128, 64, 1, 2, fp16=True),
        "bh128_bn64_s1_vs2_p1": knobs(128, 64, 1, 2, prefetch=1),
        "bh128_bn64_s1_vs2_p1_f16": knobs(128, 64, 1, 2, prefetch=1, fp16=True),
        "bh128_bn32_s2_vs2_p1_f16": knobs(128, 32, 2, 2, prefetch=1, fp16=True),
        # One warpgroup a program, two programs a multiprocessor (232 / 254 registers,
        # 106 KB of shared memory each): one program's loads and softmax under the other's
        # products; its 32-key score product is bound by shared memory (the queries re-read
        # from it for every 32 keys).
        "bh64_bn32_w4_vs2_f16": knobs(64, 32, 1, 2, fp16=True, num_warps=4),
        "bh64_bn32_w4_vs2_p1_f16": knobs(64, 32, 1, 2, prefetch=1, fp16=True, num_warps=4),
        # Scores via memory: each warpgroup scores half the keys (no recomputed scores, 1.33x
        # the counted products instead of 2.04x), probabilities through a scratch buffer.
        "bh64_bn64_s1_vm_f16": knobs(64, 64, 1, 1, fp16=True, via_memory=True),
        "triton": {"config": None},
        "gluon_hopper": gluon(),
    },
    16: {
        "bh64_bn64_s1_sp16_vm": knobs(64, 64, 1, 1, num_splits=16, via_memory=True),
        "bh64_bn64_s1_sp8_vm": knobs(64, 64, 1, 1, num_splits=8, via_memory=True),
        "bh128_bn64_s1_sp4_vs2_p1_f16": knobs(128, 64, 1, 2, prefetch=1, fp16=True,
                                              num_splits=4),
        "bh128_bn64_s1_sp4_vs2_f16": knobs(128, 64, 1, 2, fp16=True, num_splits=4),
        "bh128_bn64_s1_sp4_vs2_p1": knobs(128, 64, 1, 2, prefetch=1, num_splits=4),
        "bh128_bn32_s2_sp4_vs2_p1_f16": knobs(128, 32, 2, 2, prefetch=1, fp16=True,
                                              num_splits=4),
        "bh64_bn32_w4_sp4_vs2_f16": knobs(64, 32, 1, 2, fp16=True, num_splits=4, num_warps=4),
        "bh64_bn32_w4_sp4_vs2_p1_f16": knobs(64, 32, 1, 2, prefetch=1, fp16=True,
                                             num_splits=4, num_warps=4),
        "triton": {"config": None},
        "gluon_hopper": gluon(),
        "gluon_hopper_sp2": gluon(2),
        "gluon_hopper_sp8": gluon(8),
    },
}
# The round's set: the Triton default and the Gluon kernel (what Hopper's table runs).
QUICK = {64: ["triton", "gluon_hopper"], 16: ["triton", "gluon_hopper"]}


def make_latent_cache(num_blocks: int, device: str) -> torch.Tensor:
    rows = torch.randn(num_blocks, BLOCK_SIZE, 576, device=device) * 4
    return rows.to(torch.float8_e4m3fn)


def random_selection(num_rows: int, num_slots: int, device: str) -> torch.Tensor:
    """k distinct slots per row, in no order (what topk_slots hands attention)."""
    keys = torch.rand(num_rows, num_slots, device=device)
    return keys.topk(TOP_K, dim=1).indices.to(torch.int32)


def run_variant(q: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                variant: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One variant: the Gluon kernel's launcher, else the Triton one, with its config."""
    if variant.get("kernel") == "gluon_hopper":
        return sparse_mla_hopper(q, cache, 1.0, slots, SOFTMAX_SCALE, variant["config"])
    return sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE, variant["config"])


def bench_rows(num_rows: int, cache: torch.Tensor, copy_bw: float, matmul_rate: float,
               quick: bool) -> dict:
    slots = random_selection(num_rows, min(cache.shape[0] * BLOCK_SIZE, CONTEXT), DEVICE)
    q = torch.randn(num_rows, NUM_HEADS, 576, device=DEVICE).to(torch.bfloat16)
    flops = 2 * num_rows * NUM_HEADS * TOP_K * (576 + 512)
    num_bytes = num_rows * (TOP_K * (576 + 4) + NUM_HEADS * (576 * 2 + 512 * 4))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, 1.0, slots, SOFTMAX_SCALE)
    result = {"rows": num_rows, "heads": NUM_HEADS, "k": TOP_K, "flops": flops,
              "bytes": num_bytes}
    table = VARIANTS.get(num_rows, VARIANTS[64])
    names = QUICK.get(num_rows, list(table)) if quick else list(table)
    # The default first: its row prints even if a new variant fails or hangs.
    variants = {"default": lambda: sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE)}
    variants.update({name: (lambda kw=table[name]: run_variant(q, cache, slots, kw))
                     for name in names})
    variants["torch"] = lambda: sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    for name, fn in variants.items():
        try:
            out, lse = fn()
            torch.cuda.synchronize()
            error = ((out - want_out).norm() / want_out.norm()).item()
            lse_error = ((lse - want_lse).norm() / want_lse.norm()).item()
            eager_ms = time_ms(fn)
            graph_ms = eager_ms if name == "torch" else time_graph_ms(fn)
        except Exception as exc:  # one failing configuration must not hide the others
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(f"{num_rows:>4} {name:<30} FAILED {result[name]['error'][:80]}", flush=True)
            continue
        default_ms = result.get("default", {}).get("ms", graph_ms)
        print(f"{num_rows:>4} {name:<30} graph {graph_ms * 1e3:8.1f} us  eager "
              f"{eager_ms * 1e3:8.1f} us  {flops / (graph_ms * 1e-3) / matmul_rate:6.1%} of GEMM"
              f"  {default_ms / graph_ms:5.2f}x default  err/bound {error / ERROR_BOUND:.3f}",
              flush=True)
        result[name] = {"ms": graph_ms, "eager_ms": eager_ms,
                        "matmul_fraction": flops / (graph_ms * 1e-3) / matmul_rate,
                        "tflops": flops / (graph_ms * 1e-3) / 1e12,
                        "bandwidth_fraction": num_bytes / (graph_ms * 1e-3) / copy_bw,
                        "relative_error_vs_torch_fp32": error,
                        "error_over_bound": error / ERROR_BOUND,
                        "lse_relative_error": lse_error}
    torch_ms = result["torch"].get("ms")
    for value in result.values():
        if isinstance(value, dict) and "ms" in value and torch_ms:
            value["speedup_vs_torch"] = torch_ms / value["ms"]
    return result


def print_table(results: list[dict]) -> None:
    print(f"{'rows':>4} {'variant':<30} {'graph us':>8} {'eager us':>8} {'TFLOP/s':>7} "
          f"{'of GEMM':>7} {'of BW':>6} {'x torch':>7} {'err/bnd':>7}")
    for r in results:
        for name, v in r.items():
            if not isinstance(v, dict):
                continue
            if "error" in v:
                print(f"{r['rows']:>4} {name:<30} FAILED {v['error'][:70]}")
                continue
            print(f"{r['rows']:>4} {name:<30} {v['ms'] * 1e3:8.1f} {v['eager_ms'] * 1e3:8.1f} "
                  f"{v['tflops']:7.1f} {v['matmul_fraction']:7.1%} "
                  f"{v['bandwidth_fraction']:6.1%} {v.get('speedup_vs_torch', 0):7.1f} "
                  f"{v['error_over_bound']:7.3f}")
    for r in results:
        timed = {name: v["ms"] for name, v in r.items()
                 if isinstance(v, dict) and "ms" in v and name != "torch"
                 and v["error_over_bound"] < 1}
        if not timed:
            continue
        best = min(timed, key=timed.get)
        print(f"{r['rows']:>4} best {best} {r[best]['matmul_fraction']:.1%} of GEMM "
              f"(default {r['default'].get('matmul_fraction', 0):.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--rows", type=int, nargs="+", default=ROW_COUNTS)
    parser.add_argument("--quick", action="store_true", help="the main variants only")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s",
          flush=True)
    cache = make_latent_cache(CONTEXT // BLOCK_SIZE, DEVICE)
    results = [bench_rows(n, cache, copy_bw, matmul_rate, args.quick) for n in args.rows]
    path = write_result("triton_sparse_mla", {
        "shape": f"H {NUM_HEADS}, k {TOP_K}, fp8 latent, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"wrote {path}")
    print_table(results)


if __name__ == "__main__":
    main()
