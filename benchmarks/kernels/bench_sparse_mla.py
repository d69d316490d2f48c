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

Round 3 (H200, graph us; predictions in brackets): 64 rows: default bh128_bn64_s1_vs2 200.6
(185); p1 237.7 (135); p1_f16 221.7 (125); bn32_s2_p1 258.5 (115); bn32_s2_p1_f16 238.0
(105); a keys-major kernel (keys as the products' rows, no padding or recomputed scores)
318-450 (70-100), since removed. 16 rows: bh128_bn64_s1_sp4_vs2_p1_f16 64.3 (40), now the
default; round 2's default (bh64 sp16 vm) 95.0, bh64_bn64_s1_sp8_vm 78.6 (60). Load latency
was not the bottleneck at 64 rows (reading ahead lost); FP16 gained ~7% (p1_f16 vs p1) and
is 10x closer to the fp32 result. Triton 3.6's SASS (compiled offline) showed why p1 lost:
its carried 64-bit row offsets spilled (56-64 B) with the reloads inside the runs of wgmma;
p1 now carries the int32 slots instead (24 B, reloads outside them). Final-round
predictions: 64 rows bh128_bn64_s1_vs2_f16 ~187 us, p1_f16 185-215 us; 16 rows default and
bh128_bn64_s1_sp4_vs2_f16 ~60-64 us, sp4_vs2_p1 (bf16) ~68 us, bh64 sp16 vm ~95 us.

Session 4 (the gather's slots no longer go through an int64 division: 230 fewer instructions
a tile), round 1 (H200, graph us; predictions in brackets): 64 rows bh128_bn64_s1_vs2_f16
153.1 (178), now the default, 25.2% of GEMM; with the next tile's rows asked of L2
(prefetch.global.L2) 152.0 (160); BF16 (the old default) 185.6 (190); one warpgroup a
program, two programs a multiprocessor (bh64_bn32_w4_vs2_f16) 205.8 (140), with L2 requests
184.0 (110); scores via memory bh64_bn64_s1_vm_f16 198.5 (190). 16 rows: the default
(bh128_bn64_s1_sp4_vs2_p1_f16) 47.2 (60), 20.5%; with L2 requests 57.7 (52); w4 sp4 59.6
(45), with L2 requests 61.4 (38). The L2 requests were removed (no gain at 64 rows, a loss
at 16, where the selections sit in L2 between graph replays). Final-round predictions: 64 rows
default ~153, p1_f16 ~150 (all row loads before the first product; 32 B of stack under 3.6),
BF16 ~186; 16 rows default ~47, sp4_vs2_f16 (no read-ahead) ~55.

Session 5: the Hopper Gluon kernel (gluon_kernels/sparse_mla_hopper.py; staged: FP8 rows by
cp.async into staging; rg: into registers a tile ahead, the value product under the next
tile's conversion): 64 heads a CTA, each warpgroup scores half of each 64-key tile and
accumulates half the values (1.33x the counted products issued). Round 1 (H200, graph us;
predictions in brackets; GEMM 760 TFLOP/s): 64 rows staged 130.3 (85), rg 121.5 (75), 29.7%
of GEMM, the Triton kernel 153.1; 16 rows staged 41.5 (28), rg 39.2 (25), 23.0%, Triton
47.6; staged sp2 68.5 (45), rg sp8 51.7 (28). rg is the default on Hopper since ("default";
"triton" is the Triton kernel; the staging was removed). A tile costs ~3.4 us (~6,300
clocks) against ~2,700 of tensor and shared-memory work: the ~685 instructions a thread a
tile (softmax, FP8 -> FP16 conversion, O's rescale) run between the products, not under them.
Final round (GEMM 743 TFLOP/s): 64 rows default 123.0 = 28.1% of GEMM, triton 155.0; 16 rows
39.5 / 47.6. A lazy rescale (O rescaled only when a maximum grows past 2^8: 128 fewer
multiplies a thread on most tiles, but ~12 stack reloads a tile under 3.6) lost: 140.8 and
45.0 us (predicted ~114 and ~38), and was removed.

Session 6: the warp-specialized Gluon kernel (gluon_kernels/sparse_mla_hopper_ws.py,
"gluon_hopper_ws", the default on Hopper since round 2): a producer warpgroup gathers and
converts the keys into two FP16 buffers, warpgroup 0 scores all 64 keys of a tile (N = 64)
and runs the softmax, warpgroup 1 adds its half of the values from P in shared memory;
mbarriers hand the buffers over. Orders of the products (schedule): late_values (default),
scores_first "sf", values_first "vf". Round 1 (H200, graph us; GEMM 700 TFLOP/s; predicted
64 rows ~70): 64 rows sf 99.2 (39.5% of GEMM), vf 100.3, one-role 121.6, triton 153.2; 16
rows sf / vf 33.9, sf with 2 / 8 splits 50.2 / 46.4, one-role 39.3. Round 2 (GEMM 730
TFLOP/s; queries staged in one read, no spare product after the last tile): 64 rows
late_values 87.4 (42.9%), sf 90.6, one-role 122.6, triton 154.8; 16 rows 32.3 / 32.5 / 39.7 /
47.7. The producer asking L2 for the next tile's rows (or the one after) lost: sf 95.7 /
98.3, late_values 93.3, 16 rows 34.3 (removed). Final-round predictions: 64 rows default
~87, sf ~91; 16 rows default ~32.

Usage: python -m benchmarks.kernels.bench_sparse_mla [--out DIR] [--rows 16 64] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atomk31.ops.sparse_mla import sparse_mla_torch
from atomk31.triton_kernels.sparse_mla import sparse_mla_triton
from gluon_kernels.sparse_mla_hopper import sparse_mla_hopper
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
    return {"block_h": block_h, "block_n": block_n, "num_warps": num_warps,
            "num_stages": num_stages,
            "value_splits": value_splits, "prefetch": prefetch, "fp16_operands": fp16,
            "num_splits": num_splits, "scores_via_memory": via_memory}


# Per row count: variant name -> launcher knobs. Round 3 measured every one of them on the
# H200 (graph us, 64 / 16 rows): the defaults (bh128_bn64_s1_vs2 200 us; few rows now
# bh128_bn64_s1_sp4_vs2_p1_f16 64 us, was bh64_bn64_s1_sp16_vm 95 us) and the losers kept as
# references: p1 at 64 rows 238, bn32 with two stages 258. Session 4 (graph us): the 64-row
# default is now bh128_bn64_s1_vs2_f16 (153.1; BF16 185.6); w4 205.8 (16 rows 59.6), vm 198.5.
VARIANTS = {
    64: {
        "bh128_bn64_s1_vs2": knobs(128, 64, 1, 2),
        "bh128_bn64_s1_vs2_f16": knobs(128, 64, 1, 2, fp16=True),
        "bh128_bn64_s1_vs2_p1": knobs(128, 64, 1, 2, prefetch=1),
        "bh128_bn64_s1_vs2_p1_f16": knobs(128, 64, 1, 2, prefetch=1, fp16=True),
        "bh128_bn32_s2_vs2_p1_f16": knobs(128, 32, 2, 2, prefetch=1, fp16=True),
        # One warpgroup a program, two programs a multiprocessor (232 / 254 registers,
        # 106 KB of shared memory each): one program's loads and softmax under the other's
        # products. Lost (205.8 vs 153.1 us): its 32-key score product is bound by shared
        # memory (the queries re-read from it for every 32 keys).
        "bh64_bn32_w4_vs2_f16": knobs(64, 32, 1, 2, fp16=True, num_warps=4),
        "bh64_bn32_w4_vs2_p1_f16": knobs(64, 32, 1, 2, prefetch=1, fp16=True, num_warps=4),
        # Scores via memory: each warpgroup scores half the keys (no recomputed scores, 1.33x
        # the counted products instead of 2.04x), probabilities through a scratch buffer.
        "bh64_bn64_s1_vm_f16": knobs(64, 64, 1, 1, fp16=True, via_memory=True),
        # Session 5: the Hopper Gluon kernel (gluon_kernels/sparse_mla_hopper.py, the default
        # on Hopper since): 64 heads a CTA, each warpgroup scores half of a 64-key tile and
        # accumulates half the values, the FP8 rows loaded into registers a tile ahead and
        # converted under the value product (121.5 us; by cp.async into staging: 130.3, the
        # staging since removed).
        "triton": {"kernel": "triton"},
        "gluon_hopper": {"kernel": "gluon_hopper"},
        # Session 6: warp-specialized (gluon_kernels/sparse_mla_hopper_ws.py, the default
        # since, its order late_values): a producer warpgroup converts the keys, the value
        # products run under the softmax; sf / vf: its other orders (see its SCHEDULE). The
        # producer's L2 requests for the next tile's rows lost (removed; numbers above).
        "gluon_hopper_ws_sf": {"kernel": "gluon_hopper", "warp_specialized": True,
                               "schedule": "scores_first"},
        "gluon_hopper_ws_vf": {"kernel": "gluon_hopper", "warp_specialized": True,
                               "schedule": "values_first"},
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
        # The Gluon kernel's key splits: 32 CTAs x 4 (the default, 128 CTAs of 8 tiles) won:
        # 39.2 us (staged: 41.5); sp8 51.7, staged sp2 68.5.
        "triton": {"kernel": "triton"},
        "gluon_hopper": {"kernel": "gluon_hopper"},
        "gluon_hopper_sp8": {"kernel": "gluon_hopper", "num_splits": 8},
        "gluon_hopper_ws_sf": {"kernel": "gluon_hopper", "warp_specialized": True,
                               "schedule": "scores_first"},
        "gluon_hopper_ws_sp2": {"kernel": "gluon_hopper", "warp_specialized": True,
                                "num_splits": 2},
        "gluon_hopper_ws_sp8": {"kernel": "gluon_hopper", "warp_specialized": True,
                                "num_splits": 8},
    },
}
# The round's set: the defaults' measured forms and the candidates to replace them.
# "default" is the warp-specialized kernel since session 6; "gluon_hopper" the one-role one.
QUICK = {64: ["triton", "gluon_hopper", "gluon_hopper_ws_sf"], 16: ["triton", "gluon_hopper"]}


def make_latent_cache(num_blocks: int, device: str) -> torch.Tensor:
    rows = torch.randn(num_blocks, BLOCK_SIZE, 576, device=device) * 4
    return rows.to(torch.float8_e4m3fn)


def random_selection(num_rows: int, num_slots: int, device: str) -> torch.Tensor:
    """k distinct slots per row, in no order (what topk_slots hands attention)."""
    keys = torch.rand(num_rows, num_slots, device=device)
    return keys.topk(TOP_K, dim=1).indices.to(torch.int32)


def run_variant(q: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                knobs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One variant: the Gluon kernel's launcher with its own knobs, else the Triton one."""
    if knobs.get("kernel") == "gluon_hopper":
        rest = {key: value for key, value in knobs.items() if key != "kernel"}
        return sparse_mla_hopper(q, cache, 1.0, slots, SOFTMAX_SCALE, **rest)
    return sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE, **knobs)


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
