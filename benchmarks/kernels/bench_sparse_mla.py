"""Triton sparse MLA decode: H = 96 heads per row over k = 2048 selected FP8 latent rows.

Figure: FLOP/s (2 * H * k * (576 + 512) per row: scores and values) against the BF16 GEMM
rate measured in the same run (anchor: FlashMLA's sparse decode, about 410 TFLOP/s on an
H800), and bytes per second (the selected rows read once per row, queries read and fp32
outputs written once) against the copy bandwidth, at 16 and 64 decode rows, for several tile
configurations side by side: heads per program (bh), keys per step (bn), warps (w),
pipeline stages (s) and key splits (sp; default: the fewest that fill the multiprocessors).
Each variant is checked against the op's torch implementation (fp32) before it is timed.
Peer: the op's torch implementation.

Floors on an H200 (~750 TFLOP/s bf16, ~4.25 TB/s copy): 16 rows 6.85 GFLOP = 9.1 us,
23.9 MB = 5.6 us; 64 rows 27.4 GFLOP = 36.5 us, 95.7 MB = 22.6 us: matrix-bound. BLOCK_H = 64
pads 96 heads to 128, so the issued products cap it near 75% of the matrix rate; two value
splits ("vs2": each program recomputes the 576-wide scores for half the values) issue 1.53x
more, capping it near 49%.

Round 1 (H200, fraction of the GEMM rate): 64 rows bh64_bn128_w8_s1 16.3% (best, now the
default there); 16 rows bh64_bn64_w8_s1_sp8_vm 11.5% (best, now the default there).
Predictions for round 2: defaults as round 1; vs2 on one warpgroup (w4) 18-25% at 64 rows if
two programs share a multiprocessor and hide each other's gathers, ~10% if shared memory
allows only one; bh128_w8_vs2 like bh64_bn128 (the same products per warpgroup and the same
key reads); more key splits at 16 rows (sp16) ~12%.

Usage: python -m benchmarks.kernels.bench_sparse_mla [--out DIR] [--rows 16 64]
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
# (heads, keys per step, warps, stages, splits or None, scores via memory, value splits).
# Round 1's best at 64 rows (bn128 s1) and at 16 rows (sp8 vm) first, both now defaults;
# then bn128 with the scratch hand-over, sp8 without it (does "vm" matter?), more splits at
# 16 rows, and the value-split programs ("vs2"): one warpgroup each (w4: two programs per
# multiprocessor when their shared memory fits, likely only at bn32) at 32, 64 and 128 keys
# per step, with two stages, and on 8 warps; bh128 puts all 96 heads (padded to 128) in one
# program, each warpgroup 64 of them over half the values.
CONFIGS = [
    (64, 128, 8, 1, None, False, 1), (64, 64, 8, 1, 8, True, 1),
    (64, 128, 8, 1, None, True, 1), (64, 64, 8, 1, 8, False, 1), (64, 64, 8, 1, 16, True, 1),
    (64, 32, 4, 1, None, False, 2), (64, 64, 4, 1, None, False, 2),
    (64, 128, 4, 1, None, False, 2), (64, 64, 4, 2, None, False, 2),
    (64, 64, 4, 1, 8, False, 2), (64, 64, 8, 1, None, False, 2),
    (64, 64, 8, 1, None, True, 2), (128, 64, 8, 1, None, False, 2),
    (128, 128, 8, 1, None, False, 2),
]


def make_latent_cache(num_blocks: int, device: str) -> torch.Tensor:
    rows = torch.randn(num_blocks, BLOCK_SIZE, 576, device=device) * 4
    return rows.to(torch.float8_e4m3fn)


def random_selection(num_rows: int, num_slots: int, device: str) -> torch.Tensor:
    """k distinct slots per row, in no order (what topk_slots hands attention)."""
    keys = torch.rand(num_rows, num_slots, device=device)
    return keys.topk(TOP_K, dim=1).indices.to(torch.int32)


def variant_name(block_h: int, block_n: int, num_warps: int, num_stages: int,
                 num_splits: int | None, scores_via_memory: bool, value_splits: int) -> str:
    splits = "" if num_splits is None else f"_sp{num_splits}"
    memory = "_vm" if scores_via_memory else ""
    halves = "" if value_splits == 1 else f"_vs{value_splits}"
    return f"bh{block_h}_bn{block_n}_w{num_warps}_s{num_stages}{splits}{memory}{halves}"


def bench_rows(num_rows: int, cache: torch.Tensor, copy_bw: float, matmul_rate: float) -> dict:
    slots = random_selection(num_rows, min(cache.shape[0] * BLOCK_SIZE, CONTEXT), DEVICE)
    q = torch.randn(num_rows, NUM_HEADS, 576, device=DEVICE).to(torch.bfloat16)
    flops = 2 * num_rows * NUM_HEADS * TOP_K * (576 + 512)
    num_bytes = num_rows * (TOP_K * (576 + 4) + NUM_HEADS * (576 * 2 + 512 * 4))
    want_out, want_lse = sparse_mla_torch(q.float(), cache, 1.0, slots, SOFTMAX_SCALE)
    result = {"rows": num_rows, "heads": NUM_HEADS, "k": TOP_K, "flops": flops,
              "bytes": num_bytes}
    variants = {variant_name(*config): (
        lambda c=config: sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE, block_h=c[0],
                                           block_n=c[1], num_warps=c[2], num_stages=c[3],
                                           num_splits=c[4], scores_via_memory=c[5],
                                           value_splits=c[6]))
        for config in CONFIGS}
    variants["default"] = lambda: sparse_mla_triton(q, cache, 1.0, slots, SOFTMAX_SCALE)
    variants["torch"] = lambda: sparse_mla_torch(q, cache, 1.0, slots, SOFTMAX_SCALE)
    for name, fn in variants.items():
        try:
            out, lse = fn()
            torch.cuda.synchronize()
        except Exception as error:  # one failing configuration must not hide the others
            result[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            continue
        error = ((out - want_out).norm() / want_out.norm()).item()
        lse_error = ((lse - want_lse).norm() / want_lse.norm()).item()
        ms = time_ms(fn)
        result[name] = {"ms": ms, "matmul_fraction": flops / (ms * 1e-3) / matmul_rate,
                        "tflops": flops / (ms * 1e-3) / 1e12,
                        "bandwidth_fraction": num_bytes / (ms * 1e-3) / copy_bw,
                        "relative_error_vs_torch_fp32": error,
                        "lse_relative_error": lse_error}
    torch_ms = result["torch"].get("ms")
    for name, value in result.items():
        if isinstance(value, dict) and "ms" in value and torch_ms:
            value["speedup_vs_torch"] = torch_ms / value["ms"]
    return result


def print_table(results: list[dict]) -> None:
    print(f"{'rows':>4} {'variant':<24} {'ms':>8} {'TFLOP/s':>8} {'of GEMM':>8} {'of BW':>6} "
          f"{'x torch':>8} {'rel err':>8}")
    for r in results:
        for name, v in r.items():
            if not isinstance(v, dict):
                continue
            if "error" in v:
                print(f"{r['rows']:>4} {name:<24} FAILED {v['error'][:60]}")
                continue
            print(f"{r['rows']:>4} {name:<24} {v['ms']:8.4f} {v['tflops']:8.1f} "
                  f"{v['matmul_fraction']:8.1%} {v['bandwidth_fraction']:6.1%} "
                  f"{v.get('speedup_vs_torch', 0):8.1f} "
                  f"{v['relative_error_vs_torch_fp32']:8.1e}")
    for r in results:
        timed = {name: v["ms"] for name, v in r.items()
                 if isinstance(v, dict) and "ms" in v and name != "torch"}
        best = min(timed, key=timed.get)
        print(f"{r['rows']:>4} best {best} {r[best]['matmul_fraction']:.1%} of GEMM "
              f"(default {r['default'].get('matmul_fraction', 0):.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--rows", type=int, nargs="+", default=ROW_COUNTS)
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    cache = make_latent_cache(CONTEXT // BLOCK_SIZE, DEVICE)
    results = [bench_rows(n, cache, copy_bw, matmul_rate) for n in args.rows]
    path = write_result("triton_sparse_mla", {
        "shape": f"H {NUM_HEADS}, k {TOP_K}, fp8 latent, block {BLOCK_SIZE}",
        "copy_bandwidth_Bps": copy_bw, "bf16_matmul_flops": matmul_rate, "results": results},
        out_dir=args.out)
    print(f"wrote {path}")
    print(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {matmul_rate / 1e12:.0f} TFLOP/s")
    print_table(results)


if __name__ == "__main__":
    main()
