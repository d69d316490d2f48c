"""KDA chunked prefill: atomk31's Triton kernel vs flash-linear-attention's chunk_kda.

One sequence of T tokens (8K to 64K), H = 96 heads, K = V = 128, BF16 q/k/v, fp32 g and beta,
fp32 initial and final states, both kernels l2-normalising q and k themselves. Figures:
tokens/s, the ratio to fla measured side by side, and the fraction of the measured limits:
the fewest bytes (inputs read once, o and the state written once) over the copy bandwidth,
and the chunked form's matrix FLOPs over the BF16 matrix rate.

Run: python -m benchmarks.kernels.bench_kda_prefill [--out DIR] [--lengths 8192 32768]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

HEADS, HEAD_DIM, CHUNK = 96, 128, 64


def make_inputs(num_tokens: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    from atomk31.ops.kda import kda_gate_torch

    shape = (num_tokens, HEADS, HEAD_DIM)
    f = torch.randn(shape, device=device) * 3
    g = kda_gate_torch(f, torch.randn(HEADS, device=device),
                       torch.randn(HEADS * HEAD_DIM, device=device), -5.0)
    return {
        "q": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "k": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "v": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "g": g, "beta": torch.rand(num_tokens, HEADS, device=device),
        "state": torch.randn(1, HEADS, HEAD_DIM, HEAD_DIM, device=device),
        "cu_seqlens": torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
    }


def minimal_bytes(num_tokens: int) -> int:
    per_token = HEADS * HEAD_DIM * (2 + 2 + 2 + 4 + 2) + HEADS * 4    # q k v g o, beta
    return num_tokens * per_token + 2 * HEADS * HEAD_DIM * HEAD_DIM * 4


def chunked_flops(num_tokens: int) -> int:
    """Matrix FLOPs per head and chunk of the chunked form: scores (2 C^2 K), solve-applied
    w and u (2 C^2 (K+V)), state read and output (2 C K V x 2 + 2 C^2 V), state update
    (2 C K V)."""
    c, k = CHUNK, HEAD_DIM
    per_chunk = 2 * (2 * c * c * k) + 2 * c * c * 2 * k + 3 * 2 * c * k * k + 2 * c * c * k
    return HEADS * (num_tokens // c) * per_chunk


def run(lengths: list[int], out_dir: Path | None) -> dict:
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    try:
        from fla.ops.kda import chunk_kda
    except ImportError:
        chunk_kda = None
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    scale = HEAD_DIM ** -0.5
    rows = []
    for num_tokens in lengths:
        x = make_inputs(num_tokens)
        variants = {
            "atomk31 bf16": dict(),
            "atomk31 bf16 bv64": dict(block_v=64),
            "atomk31 fp32-intermediates": dict(intermediate_dtype=torch.float32),
        }
        row = {"tokens": num_tokens}
        for name, knobs in variants.items():
            try:
                ms = time_ms(lambda: kda_prefill_triton(
                    x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["cu_seqlens"],
                    scale, **knobs))
            except Exception as error:  # a variant that does not compile is reported, not fatal
                row[name] = f"failed: {type(error).__name__}: {str(error)[:200]}"
                continue
            row[name] = {"ms": ms, "tokens_per_s": num_tokens / ms * 1e3,
                         "fraction_of_copy_bw": minimal_bytes(num_tokens) / (ms * 1e-3) / copy_bw,
                         "fraction_of_matmul_rate":
                             chunked_flops(num_tokens) / (ms * 1e-3) / matmul_rate}
        if chunk_kda is not None:
            cu = x["cu_seqlens"].long()
            try:
                ms = time_ms(lambda: chunk_kda(
                    x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
                    scale=scale, initial_state=x["state"], output_final_state=True,
                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu))
            except Exception as error:  # the peer failing is reported, not fatal
                row["fla chunk_kda"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
            else:
                row["fla chunk_kda"] = {"ms": ms, "tokens_per_s": num_tokens / ms * 1e3}
                for name in variants:
                    if isinstance(row[name], dict):
                        row[name]["speedup_vs_fla"] = ms / row[name]["ms"]
        rows.append(row)
        del x
        torch.cuda.empty_cache()
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "heads": HEADS, "head_dim": HEAD_DIM, "rows": rows}
    path = write_result("kda_prefill", payload, out_dir)
    print(f"{'tokens':>7} {'variant':>28} {'ms':>8} {'Mtok/s':>7} {'vs fla':>7}")
    for row in rows:
        for name, value in row.items():
            if isinstance(value, dict):
                print(f"{row['tokens']:>7} {name:>28} {value['ms']:8.3f} "
                      f"{value['tokens_per_s'] / 1e6:7.3f} {value.get('speedup_vs_fla', 1.0):7.3f}")
            elif name != "tokens":
                print(f"{row['tokens']:>7} {name:>28} {value}")
    print(f"wrote {path}")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 65536])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.lengths, args.out)


if __name__ == "__main__":
    main()
