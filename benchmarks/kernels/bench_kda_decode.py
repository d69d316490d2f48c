"""KDA decode step: atomk31's Triton kernel vs flash-linear-attention's fused_recurrent_kda.

Batch N = 1 to 64 requests, H = 96 heads, K = V = 128, BF16 q/k/v, fp32 g, beta and state.
The step must read and write each request's fp32 state (64 KiB per head) once, so the
figure is (state bytes read + written + inputs + output) / time against the measured copy
bandwidth. Both kernels are timed as CUDA-graph replays (as the engine runs decode), each
call updating a state larger than L2 from batch 16 up.

Run: python -m benchmarks.kernels.bench_kda_decode [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from benchmarks.common import measure_copy_bandwidth, write_result

HEADS, HEAD_DIM = 96, 128


def graph_ms(fn) -> float:
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def step_bytes(num_requests: int) -> int:
    state = 2 * num_requests * HEADS * HEAD_DIM * HEAD_DIM * 4
    inputs = num_requests * HEADS * (HEAD_DIM * (2 + 2 + 2 + 4 + 2) + 4)     # q k v g o, beta
    return state + inputs


def run(batches: list[int], out_dir: Path | None) -> dict:
    from atomk31.ops.kda import kda_gate_torch
    from atomk31.triton_kernels.kda_decode import KdaRecurrentConfig, kda_decode_triton

    try:
        from fla.ops.kda import fused_recurrent_kda
    except ImportError:
        fused_recurrent_kda = None
    copy_bw = measure_copy_bandwidth()
    scale = HEAD_DIM ** -0.5
    rows = []
    for n in batches:
        shape = (n, HEADS, HEAD_DIM)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        g = kda_gate_torch(torch.randn(shape, device="cuda") * 3,
                           torch.randn(HEADS, device="cuda"),
                           torch.randn(HEADS * HEAD_DIM, device="cuda"), -5.0)
        beta = torch.rand(n, HEADS, device="cuda")
        state = torch.randn(n, HEADS, HEAD_DIM, HEAD_DIM, device="cuda")
        row = {"batch": n, "bytes": step_bytes(n)}
        for name, block_v in (("atomk31", None), ("atomk31 bv32", 32), ("atomk31 bv64", 64),
                              ("atomk31 bv128", 128)):
            ms = graph_ms(lambda: kda_decode_triton(q, k, v, g, beta, state, scale,
                                                    config=KdaRecurrentConfig(block_v)))
            row[name] = {"us": ms * 1e3, "fraction_of_copy_bw": step_bytes(n) / (ms * 1e-3) / copy_bw}
        if fused_recurrent_kda is not None:
            fla_state = state.clone()
            try:
                ms = graph_ms(lambda: fused_recurrent_kda(
                    q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], scale=scale,
                    initial_state=fla_state, output_final_state=True,
                    use_qk_l2norm_in_kernel=True))
                row["fla fused_recurrent_kda"] = {
                    "us": ms * 1e3, "fraction_of_copy_bw": step_bytes(n) / (ms * 1e-3) / copy_bw}
            except Exception as error:  # the peer failing is reported, not fatal
                row["fla fused_recurrent_kda"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
        rows.append(row)
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "heads": HEADS, "head_dim": HEAD_DIM,
               "timing": "CUDA graph replay, median", "rows": rows}
    path = write_result("kda_decode", payload, out_dir)
    print(f"{'batch':>5} {'variant':>24} {'us':>8} {'of copy bw':>10}")
    for row in rows:
        for name, value in row.items():
            if isinstance(value, dict):
                print(f"{row['batch']:>5} {name:>24} {value['us']:8.2f} "
                      f"{value['fraction_of_copy_bw']:10.3f}")
            elif isinstance(value, str):
                print(f"{row['batch']:>5} {name:>24} {value}")
    print(f"wrote {path}")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.batches, args.out)


if __name__ == "__main__":
    main()
