"""PTPC-FP8 scaled GEMM: atomk31's Triton kernel vs torch._scaled_mm with row-wise scales, on
the proxy model's linear shapes; and the time to quantize the proxy's BF16 linears at load.

Both GEMMs take the same FP8 activations (one scale per token) and FP8 weights (one scale per
output channel) and write BF16. Figures: time, ratio to the peer (peer time / ours), and the
fraction of the measured limits: bytes (A + B read, C written) over the copy bandwidth and
FLOPs over the BF16 matrix rate (FP8's own peak is about twice that).

Run: python -m benchmarks.kernels.bench_ptpc_fp8 [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

# (name, N, K) of the proxy's PTPC-eligible linears (MODEL_SPEC §3.2, §6.5).
SHAPES = [
    ("kda qkv (fused)", 3 * 12288, 7168),
    ("o_proj", 7168, 12288),
    ("shared gate_up", 2 * 6144, 7168),
    ("shared down", 7168, 6144),
    ("mla q_b", 18432, 1536),
    ("mla kv_a", 576, 7168),
    ("mla kv_b", 24576, 512),
]
TOKENS = [1, 16, 128, 1024, 4096]


def proxy_linears(layer: int, is_mla: bool, is_dense: bool) -> dict[str, tuple[int, int]]:
    """Shapes of one proxy layer's linear weights (eligible and excluded), by checkpoint name."""
    a = f"language_model.model.layers.{layer}.self_attn."
    m = f"language_model.model.layers.{layer}."
    hidden, heads = 7168, 96
    if is_mla:
        shapes = {a + "q_a_proj.weight": (1536, hidden), a + "q_b_proj.weight": (18432, 1536),
                  a + "kv_a_proj_with_mqa.weight": (576, hidden),
                  a + "kv_b_proj.weight": (24576, 512), a + "g_proj.weight": (12288, hidden),
                  a + "o_proj.weight": (hidden, 12288),
                  a + "indexer.wq_b.weight": (4096, 1536), a + "indexer.wk.weight": (128, hidden)}
    else:
        shapes = {a + f"{p}_proj.weight": (heads * 128, hidden) for p in "qkvg"}
        shapes.update({a + "f_a_proj.weight": (128, hidden), a + "f_b_proj.weight": (12288, 128),
                       a + "b_proj.weight": (heads, hidden), a + "o_proj.weight": (hidden, 12288)})
    if is_dense:
        shapes.update({m + "mlp.gate_proj.weight": (33792, hidden),
                       m + "mlp.up_proj.weight": (33792, hidden),
                       m + "mlp.down_proj.weight": (hidden, 33792)})
    else:
        e = m + "block_sparse_moe."
        shapes.update({e + "gate.weight": (64, hidden),
                       e + "routed_expert_down_proj.weight": (3584, hidden),
                       e + "routed_expert_up_proj.weight": (hidden, 3584),
                       e + "shared_experts.gate_proj.weight": (6144, hidden),
                       e + "shared_experts.up_proj.weight": (6144, hidden),
                       e + "shared_experts.down_proj.weight": (hidden, 6144)})
    return shapes


def time_quantizing_proxy() -> dict:
    """Quantize every proxy layer's linears on the GPU (random BF16 weights, one layer at a
    time, nothing written); returns the summed quantization time and counts."""
    from atomk31.quant.ptpc import quantize_linears_ptpc

    config = {"global_quant_config": "ptpc_fp8",
              "exclude_layer": ["lm_head", "model.embed_tokens", "*self_attn.[qkv]_conv1d*",
                                "*block_sparse_moe.experts*", "*block_sparse_moe.routed_expert_*"]}
    quantize_linears_ptpc({"w.weight": torch.randn(64, 64, device="cuda").bfloat16()}, config)
    total_s, quantized, params = 0.0, 0, 0
    for layer in range(8):
        weights = {name: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                   for name, shape in proxy_linears(layer, layer in (3, 7), layer == 0).items()}
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = quantize_linears_ptpc(weights, config)
        torch.cuda.synchronize()
        total_s += time.perf_counter() - start
        scaled = [n for n in out if n.endswith("weight_scale")]
        quantized += len(scaled)
        params += sum(out[n[: -len("_scale")]].numel() for n in scaled)
        del weights, out
    return {"seconds": total_s, "linears_quantized": quantized, "parameters": params,
            "note": "8 proxy layers, random BF16 weights already on the GPU, no checkpoint I/O"}


def run(out_dir: Path | None) -> dict:
    from atomk31.quant.ptpc import quantize_weight_ptpc
    from atomk31.triton_kernels.ptpc_fp8 import (
        GemmConfig, pick_config, ptpc_linear_quantized_triton, ptpc_quantize_triton,
    )

    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    rows = []
    for name, n, k in SHAPES:
        w_q, w_scale = quantize_weight_ptpc(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        for m in TOKENS:
            x_q, x_scale = ptpc_quantize_triton(torch.randn(m, k, device="cuda",
                                                            dtype=torch.bfloat16))
            row = {"shape": name, "m": m, "n": n, "k": k}
            candidates = {"default": pick_config(m, n, k)}
            if m <= 16:
                candidates["split1"] = GemmConfig(16, 64, 256, 1)
                candidates["bn128 split4"] = GemmConfig(16, 128, 128, 4)
            elif m >= 1024:
                candidates["128x256"] = GemmConfig(128, 256, 128, num_warps=8, num_stages=3)
            best = None
            for label, config in candidates.items():
                try:
                    ms = time_ms(lambda: ptpc_linear_quantized_triton(
                        x_q, x_scale, w_q, w_scale, torch.bfloat16, config))
                except Exception as error:
                    row[f"atomk31 {label}"] = f"failed: {type(error).__name__}: {str(error)[:150]}"
                    continue
                row[f"atomk31 {label}"] = ms
                best = ms if best is None else min(best, ms)
            peer = time_ms(lambda: torch._scaled_mm(
                x_q, w_q.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :],
                out_dtype=torch.bfloat16))
            moved = m * k + n * k + 2 * m * n
            default = row["atomk31 default"]
            row.update({
                "torch._scaled_mm": peer,
                "ratio_default_vs_peer": peer / default if isinstance(default, float) else None,
                "ratio_best_vs_peer": peer / best if best else None,
                "default_fraction_of_copy_bw": moved / (default * 1e-3) / copy_bw
                if isinstance(default, float) else None,
                "default_fraction_of_bf16_matmul_rate": 2 * m * n * k / (default * 1e-3) / matmul_rate
                if isinstance(default, float) else None,
            })
            rows.append(row)
        del w_q, w_scale
    quantize = time_quantizing_proxy()
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "rows": rows, "quantize_proxy_linears": quantize}
    path = write_result("ptpc_fp8", payload, out_dir)
    print(f"{'shape':>16} {'M':>5} {'ours ms':>8} {'peer ms':>8} {'ratio':>6} {'best':>6} {'of bw':>6}")
    for row in rows:
        default = row["atomk31 default"]
        print(f"{row['shape']:>16} {row['m']:>5} "
              f"{default if isinstance(default, str) else f'{default:8.4f}'} "
              f"{row['torch._scaled_mm']:8.4f} {row['ratio_default_vs_peer'] or 0:6.2f} "
              f"{row['ratio_best_vs_peer'] or 0:6.2f} {row['default_fraction_of_copy_bw'] or 0:6.2f}")
    print(f"quantize proxy linears: {quantize}")
    print(f"wrote {path}")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.out)


if __name__ == "__main__":
    main()
