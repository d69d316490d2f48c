"""PTPC-FP8 scaled GEMM: atomk31's Triton kernel vs torch._scaled_mm with row-wise scales, on
the proxy model's linear shapes; and the time to quantize the proxy's BF16 linears at load.

Both GEMMs take the same FP8 activations (one scale per token) and FP8 weights (one scale per
output channel) and write BF16. Per case the launcher's default and a few variants (tiles,
split K, FP8 promotion interval, bf16 products, M specialization) are timed side by side.
Figures: time, ratio to the peer (peer time / ours), the fraction of the measured limits (bytes
A + B read and C written over the copy bandwidth; FLOPs over the BF16 matrix rate, FP8's own
peak being about twice that), and the error against fp32 math of the same quantized values
(max-abs error over max-abs output, fp32 outputs) of ours and of torch._scaled_mm.

Run: python -m benchmarks.kernels.bench_ptpc_fp8 [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

# (N, K) of the proxy's PTPC-eligible linears (MODEL_SPEC §3.2, §6.5).
SHAPES = {
    "kda qkv (fused)": (3 * 12288, 7168),
    "o_proj": (7168, 12288),
    "shared gate_up": (2 * 6144, 7168),
    "shared down": (7168, 6144),
    "mla q_b": (18432, 1536),
    "mla kv_a": (576, 7168),
    "mla kv_b": (24576, 512),
}
TOKENS = [1, 16, 128, 1024, 4096]
# A variant is correct when its bf16 output is within this of fp32 math (max-abs error over
# max-abs output): bf16 rounding gives up to 2^-8 (half an ulp), a wrong tile or split O(1).
BF16_OUTPUT_TOLERANCE = 1e-2


@dataclass(frozen=True)
class Variant:
    """One timed GEMM: a config (None: the launcher's default, or a change to it) and whether
    to compile with M specialized (Triton's default, the kernel opts out)."""

    label: str
    config: object = None              # GemmConfig, or a callable default -> GemmConfig
    specialize_m: bool = False
    measure_error: bool = False


def variants_for(name: str, m: int) -> list[Variant]:
    """The variants compared at (shape, M) besides the default."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig

    def change(**fields):
        return lambda default: dataclasses.replace(default, **fields)

    if m == 1 and name in ("o_proj", "shared gate_up", "mla q_b"):
        out = [Variant("M specialized", specialize_m=True)]
        if name == "o_proj":
            out.append(Variant("64x64x128 wgmma", GemmConfig(64, 64, 128)))
        return out
    if name == "mla kv_a":
        return {1: [Variant("16x64x128 split14", GemmConfig(16, 64, 128, split_k=14))],
                128: [Variant("64x128 no split", GemmConfig(64, 128, 128))],
                4096: [Variant("128x64", GemmConfig(128, 64, 128, num_warps=4)),
                       Variant("128x128 split2", GemmConfig(128, 128, 128, 2, num_warps=8))],
                }.get(m, [])
    if name == "o_proj" and m == 128:
        return [Variant("64x128 split2", GemmConfig(64, 128, 128, 2)),
                Variant("64x64x128", GemmConfig(64, 64, 128)),
                Variant("64x128x256 s3", GemmConfig(64, 128, 256, num_stages=3))]
    if name == "o_proj" and m == 4096:
        return [Variant("promote 32", change(promote_every=32), measure_error=True),
                Variant("promote 64", change(promote_every=64), measure_error=True),
                Variant("no promotion", change(promote_every=None), measure_error=True),
                Variant("bf16 products", change(dot_bf16=True), measure_error=True),
                Variant("128x256 promote 128", GemmConfig(128, 256, 128, num_warps=8,
                                                          num_stages=3), measure_error=True)]
    if name == "mla kv_b" and m == 4096:
        return [Variant("128x256 promote 128", GemmConfig(128, 256, 128, num_warps=8,
                                                          num_stages=3)),
                Variant("128x256 no promotion", GemmConfig(128, 256, 128, num_warps=8,
                                                           num_stages=3, promote_every=None))]
    return []


QUICK_CASES = [("o_proj", 1), ("o_proj", 128), ("o_proj", 4096), ("shared gate_up", 1),
               ("mla q_b", 1), ("mla kv_a", 1), ("mla kv_a", 128), ("mla kv_a", 1024),
               ("mla kv_a", 4096), ("mla kv_b", 4096)]


def relative_error(y: torch.Tensor, expected: torch.Tensor) -> float:
    return ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def scaled_mm_fp32(x_q, x_scale, w_q, w_scale) -> torch.Tensor:
    """torch._scaled_mm with an fp32 output: row-wise scales write only bf16, so unit
    per-tensor scales and the row/column scales applied afterwards in fp32."""
    one = torch.ones((), device=x_q.device)
    y = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return y * x_scale[:, None] * w_scale[None, :]


def run_case(name: str, m: int, w_q, w_scale, limits: dict, specialized_kernel) -> dict:
    """Time the default, the variants and the peer at one (shape, M); errors vs fp32 math."""
    from atomk31.triton_kernels.ptpc_fp8 import (pick_config, ptpc_linear_quantized_triton,
                                                 ptpc_quantize_triton)

    n, k = w_q.shape
    x_q, x_scale = ptpc_quantize_triton(torch.randn(m, k, device=w_q.device,
                                                    dtype=torch.bfloat16))
    expected = (x_q.float() @ w_q.float().T) * x_scale[:, None] * w_scale[None, :]
    default = pick_config(m, n, k)
    moved, flops = m * k + n * k + 2 * m * n, 2 * m * n * k
    row = {"shape": name, "m": m, "n": n, "k": k, "default_config": dataclasses.asdict(default),
           "variants": {}}
    for variant in [Variant("default", measure_error=True), *variants_for(name, m)]:
        config = variant.config(default) if callable(variant.config) else \
            (variant.config or default)
        kernel = specialized_kernel if variant.specialize_m else None

        def gemm(out_dtype=torch.bfloat16):
            return ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, out_dtype, config,
                                                kernel)
        try:
            ms = time_ms(gemm)
            # every variant: its bf16 output against fp32 math (bf16 rounding is 2^-8 of an
            # element); the fp32 output, for the accumulation error, where asked (a compile)
            bf16_error = relative_error(gemm(), expected)
            error = relative_error(gemm(torch.float32), expected) if variant.measure_error \
                else None
        except Exception as failure:  # a variant that does not compile is a result, not a stop
            row["variants"][variant.label] = {"failed": f"{type(failure).__name__}: "
                                                        f"{str(failure)[:200]}"}
            continue
        row["variants"][variant.label] = {
            "ms": ms, "config": dataclasses.asdict(config), "error": error,
            "bf16_output_error": bf16_error, "correct": bf16_error <= BF16_OUTPUT_TOLERANCE,
            "fraction_of_copy_bw": moved / (ms * 1e-3) / limits["copy"],
            "fraction_of_bf16_matmul_rate": flops / (ms * 1e-3) / limits["matmul"]}
    peer_ms = time_ms(lambda: torch._scaled_mm(
        x_q, w_q.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :],
        out_dtype=torch.bfloat16))
    try:
        peer_error = relative_error(scaled_mm_fp32(x_q, x_scale, w_q, w_scale), expected)
    except RuntimeError:        # no fp32 output from this cuBLASLt: the error stays unknown
        peer_error = float("nan")
    row["torch._scaled_mm"] = {"ms": peer_ms, "error": peer_error}
    for result in row["variants"].values():
        if "ms" in result:
            result["ratio_vs_peer"] = peer_ms / result["ms"]
    return row


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


def print_table(rows: list[dict]) -> None:
    print(f"{'shape':>15} {'M':>5} {'variant':>20} {'ms':>8} {'peer':>8} {'ratio':>6} "
          f"{'of bw':>6} {'of mm':>6} {'error':>8} {'peer err':>8} ok")
    for row in rows:
        peer = row["torch._scaled_mm"]
        for label, result in row["variants"].items():
            if "failed" in result:
                print(f"{row['shape']:>15} {row['m']:>5} {label:>20} {result['failed'][:60]}")
                continue
            error = f"{result['error']:8.2e}" if result["error"] is not None else f"{'-':>8}"
            print(f"{row['shape']:>15} {row['m']:>5} {label:>20} {result['ms']:8.4f} "
                  f"{peer['ms']:8.4f} {result['ratio_vs_peer']:6.2f} "
                  f"{result['fraction_of_copy_bw']:6.2f} "
                  f"{result['fraction_of_bf16_matmul_rate']:6.2f} {error} {peer['error']:8.2e} "
                  f"{'ok' if result['correct'] else 'WRONG'}")


def run(quick: bool, out_dir: Path | None) -> dict:
    import triton

    from atomk31.quant.ptpc import quantize_weight_ptpc
    from atomk31.triton_kernels.ptpc_fp8 import ptpc_gemm_kernel

    torch.backends.cuda.matmul.allow_tf32 = False        # the fp32 reference stays fp32
    limits = {"copy": measure_copy_bandwidth(), "matmul": measure_matmul_rate()}
    # Triton's default: M == 1 compiled apart (the kernel opts out of that)
    specialized_kernel = triton.jit(ptpc_gemm_kernel.fn)
    cases = QUICK_CASES if quick else [(name, m) for name in SHAPES for m in TOKENS]
    rows, weights = [], {}
    for name, m in cases:
        if name not in weights:
            weights.clear()
            n, k = SHAPES[name]
            weights[name] = quantize_weight_ptpc(
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        rows.append(run_case(name, m, *weights[name], limits, specialized_kernel))
    payload = {"copy_bandwidth_bytes_per_s": limits["copy"],
               "matmul_flops_per_s": limits["matmul"], "quick": quick, "rows": rows}
    if not quick:
        payload["quantize_proxy_linears"] = time_quantizing_proxy()
    path = write_result("ptpc_fp8", payload, out_dir)
    print_table(rows)
    if not quick:
        print(f"quantize proxy linears: {payload['quantize_proxy_linears']}")
    print(f"wrote {path}")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="ten (shape, M) cases with their variants (~60 s on an H200)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.quick, args.out)


if __name__ == "__main__":
    main()
