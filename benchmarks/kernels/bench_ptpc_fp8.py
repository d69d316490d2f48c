"""PTPC-FP8 scaled GEMM: atomk31's Triton kernel vs torch._scaled_mm with row-wise scales, on
the proxy model's linear shapes; and the time to quantize the proxy's BF16 linears at load.

Both GEMMs take the same FP8 activations (one scale per token) and FP8 weights (one scale per
output channel) and write BF16. Per case the launcher's default and a few variants (tiles,
split K, FP8 promotion interval and form, warp specialization) are timed side by side.
Figures: time, ratio to the peer (peer time / ours), the fraction of the measured limits (bytes
A + B read and C written over the copy bandwidth; FLOPs over the BF16 matrix rate, FP8's own
peak being about twice that), and the error against fp32 math of the same quantized values
(max-abs error over max-abs output, fp32 outputs) of ours and of torch._scaled_mm.

Run: python -m benchmarks.kernels.bench_ptpc_fp8 [--quick] [--warp-specialized] [--out DIR]
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
    to measure its fp32-output accumulation error (one more compile)."""

    label: str
    config: object = None              # GemmConfig, or a callable default -> GemmConfig
    measure_error: bool = False


def change(**fields):
    """A variant config: the launcher's default with some fields replaced."""
    return lambda default: dataclasses.replace(default, **fields)


# Triton's automatic warp specialization of the K loop (a producer partition feeding the
# wgmma warpgroups). Apart (--warp-specialized): a new compiler path on sm_90 that might
# fail or hang, so it runs only when asked, under its own timeout.
WARP_SPECIALIZED_CASES = [("o_proj", 4096), ("mla kv_b", 4096)]
WARP_SPECIALIZED_VARIANTS = [
    Variant("warp specialized", change(warp_specialize=True), measure_error=True),
    Variant("ws promote per tile", change(warp_specialize=True, promote_per_tile=True)),
]


def variants_for(name: str, m: int) -> list[Variant]:
    """The variants compared at (shape, M) besides the default (round 2: the round-1 winners
    are the defaults; these are the new candidates, plus "no promotion" as the speed bound)."""
    from atomk31.triton_kernels.ptpc_fp8 import GemmConfig

    # promotion as an explicit fp32 add of each 128-K tile's product
    per_tile = Variant("promote per tile", change(promote_per_tile=True), measure_error=True)
    # 64x128 tiles, one warpgroup, 3 stages: 3 CTAs fit an SM (72 KiB, ~170 registers), so
    # one CTA's promotion wait or epilogue overlaps another's wgmma; more tiles per wave
    small_tiles = Variant("64x128 w4 s3", GemmConfig(64, 128, 128, num_stages=3))
    small_tiles_per_tile = Variant("64x128 s3 per tile", GemmConfig(
        64, 128, 128, num_stages=3, promote_per_tile=True), measure_error=True)
    no_promotion = Variant("no promotion", change(promote_every=None), measure_error=True)
    table = {
        ("o_proj", 128): [Variant("64x128 w8", GemmConfig(64, 128, 128, num_warps=8)),
                          Variant("64x128x256 w8 s3", GemmConfig(64, 128, 256, num_warps=8,
                                                                 num_stages=3)),
                          per_tile],
        ("o_proj", 4096): [per_tile,
                           Variant("128x128 s3", change(num_stages=3)),
                           Variant("128x128x256 s3", GemmConfig(128, 128, 256, num_warps=8,
                                                                num_stages=3),
                                   measure_error=True),
                           Variant("128x128 group16", change(group_m=16)),
                           small_tiles, small_tiles_per_tile, no_promotion],
        # N = 12288: 192 tiles of 64 columns are 1.45 waves of 132 SMs
        ("shared gate_up", 1): [Variant("16x32x256", GemmConfig(16, 32, 256)),
                                Variant("16x64x256 split2", GemmConfig(16, 64, 256, 2)),
                                Variant("16x128x256 split2", GemmConfig(16, 128, 256, 2))],
        # 52 us for 4 MB in round 1: no split (one launch, no atomics) vs more programs
        ("mla kv_a", 1): [Variant("16x64x256 no split", GemmConfig(16, 64, 256)),
                          Variant("16x32x256 split7", GemmConfig(16, 32, 256, 7)),
                          Variant("16x64x512 split7 s2", GemmConfig(16, 64, 512, 7,
                                                                    num_stages=2))],
        ("mla kv_a", 1024): [Variant("64x128 w4 s3 split3",
                                     GemmConfig(64, 128, 128, 3, num_stages=3))],
        # N = 576: 160 tiles of 128x128 are 1.2 waves; 320 of 64x128 fit at once
        ("mla kv_a", 4096): [small_tiles, small_tiles_per_tile, per_tile],
        # K = 512: four K tiles per output tile, the epilogue (201 MB of bf16) dominates
        ("mla kv_b", 4096): [small_tiles, small_tiles_per_tile,
                             Variant("64x128 w4 s2", GemmConfig(64, 128, 128, num_stages=2)),
                             per_tile, no_promotion],
    }
    return table.get((name, m), [])


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


def run_case(name: str, m: int, w_q, w_scale, limits: dict,
             variants: list[Variant]) -> dict:
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
    for variant in [Variant("default", measure_error=True), *variants]:
        config = variant.config(default) if callable(variant.config) else \
            (variant.config or default)

        def gemm(out_dtype=torch.bfloat16):
            return ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, out_dtype, config)
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


def run(quick: bool, out_dir: Path | None, warp_specialized: bool = False) -> dict:
    from atomk31.quant.ptpc import quantize_weight_ptpc

    started = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False        # the fp32 reference stays fp32
    limits = {"copy": measure_copy_bandwidth(), "matmul": measure_matmul_rate()}
    cases = QUICK_CASES if quick else [(name, m) for name in SHAPES for m in TOKENS]
    if warp_specialized:
        cases = WARP_SPECIALIZED_CASES
    rows, weights = [], {}
    for name, m in cases:
        if name not in weights:
            weights.clear()
            n, k = SHAPES[name]
            weights[name] = quantize_weight_ptpc(
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        variants = WARP_SPECIALIZED_VARIANTS if warp_specialized else variants_for(name, m)
        rows.append(run_case(name, m, *weights[name], limits, variants))
    payload = {"copy_bandwidth_bytes_per_s": limits["copy"],
               "matmul_flops_per_s": limits["matmul"], "quick": quick, "rows": rows}
    if not quick and not warp_specialized:
        payload["quantize_proxy_linears"] = time_quantizing_proxy()
    path = write_result("ptpc_fp8_warp_specialized" if warp_specialized else "ptpc_fp8",
                        payload, out_dir)
    print(f"wrote {path} ({time.perf_counter() - started:.0f} s)")
    if "quantize_proxy_linears" in payload:
        print(f"quantize proxy linears: {payload['quantize_proxy_linears']}")
    print_table(rows)
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="ten (shape, M) cases with their variants (~60 s on an H200)")
    parser.add_argument("--warp-specialized", action="store_true",
                        help="only o_proj and kv_b at M = 4096: the default vs Triton's warp "
                             "specialization (run under a timeout: a new sm_90 path)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.quick, args.out, args.warp_specialized)


if __name__ == "__main__":
    main()
