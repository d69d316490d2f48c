"""KDA chunked prefill: atomk31's Triton kernel (design variants) vs flash-linear-attention's
chunk_kda, with the time of each of our stages.

H = 96 heads, K = V = 128, BF16 q/k/v, fp32 g (K3.1's gate, floor -5) and beta, fp32 initial
and final states, both kernels l2-normalising q and k themselves. Cases: one sequence of 8K
and 32K tokens, and 4 sequences of 8K (--quick); --full adds one sequence of 64K.

Per case and variant: milliseconds, tokens/s, the ratio to fla measured side by side, and
the fraction of the measured limits: the fewest bytes (inputs read once, o and the state
written once) over the copy bandwidth, and the chunked form's matrix FLOPs over the BF16
matrix rate. Correctness: on the 8K case every variant's o and final state are compared with
the torch op (fp32, on the same BF16 inputs), as the max-abs error over the max-abs value.
Stage times: stage 1 of every variant ("1a": the scores + solve kernel of the two-kernel
ones, whose "1" is both kernels; on the other cases the first two variants only), stages 2
(state) and 3 (output) of the default.

Run: python -m benchmarks.kernels.bench_kda_prefill --quick [--out DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import measure_copy_bandwidth, measure_matmul_rate, time_ms, write_result

HEADS, HEAD_DIM, CHUNK = 96, 128, 64
CHECK_CASE = "1x8K"
CHECK_TOLERANCE = 1e-2      # as the GPU test of BF16 inputs: BF16 intermediates and output


def variants() -> dict[str, object]:
    """Design variants of stage 1 (the others stay at the launchers' defaults: output in the
    chunk-parallel stage 3, BF16 products in stages 2-3, 64 value channels per stage-2 program):
    round 1's single kernel (the default), and the two-kernel split (scores + solve, then gated
    rows + w/u) with its slice widths and warps."""
    from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning as T

    return {
        "1-kernel bv64 (fp32 default)": T(),
        "2-kernel bk32 w4": T(intra_split=True),
        "2k scores bk16 w4": T(intra_split=True, scores_block_k=16),
        "2k scores bk16 w2 (bf16 default)": T(intra_split=True, scores_block_k=16, scores_num_warps=2),
        "2k scores bk32 w2": T(intra_split=True, scores_num_warps=2),
        "2k gated w8": T(intra_split=True, gated_num_warps=8),
    }


def make_inputs(lengths: list[int], device: str = "cuda") -> dict[str, torch.Tensor]:
    from atomk31.ops.kda import kda_gate_torch

    num_tokens = sum(lengths)
    shape = (num_tokens, HEADS, HEAD_DIM)
    f = torch.randn(shape, device=device) * 3
    g = kda_gate_torch(f, torch.randn(HEADS, device=device),
                       torch.randn(HEADS * HEAD_DIM, device=device), -5.0)
    bounds = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    return {
        "q": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "k": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "v": torch.randn(shape, device=device, dtype=torch.bfloat16),
        "g": g, "beta": torch.rand(num_tokens, HEADS, device=device),
        "state": torch.randn(len(lengths), HEADS, HEAD_DIM, HEAD_DIM, device=device),
        "cu_seqlens": bounds,
    }


def minimal_bytes(num_tokens: int, num_requests: int) -> int:
    per_token = HEADS * HEAD_DIM * (2 + 2 + 2 + 4 + 2) + HEADS * 4    # q k v g o, beta
    return num_tokens * per_token + num_requests * 2 * HEADS * HEAD_DIM * HEAD_DIM * 4


def chunked_flops(num_tokens: int) -> int:
    """Matrix FLOPs per head and chunk of the chunked form: scores (2 C^2 K), solve-applied
    w and u (2 C^2 (K+V)), state read and output (2 C K V x 2 + 2 C^2 V), state update
    (2 C K V)."""
    c, k = CHUNK, HEAD_DIM
    per_chunk = 2 * (2 * c * c * k) + 2 * c * c * 2 * k + 3 * 2 * c * k * k + 2 * c * c * k
    return HEADS * (num_tokens // c) * per_chunk


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected).abs().max() / expected.abs().max())


def stage_times(x: dict[str, torch.Tensor], scale: float,
                every_variant: bool) -> dict[str, float]:
    """Milliseconds of stage 1 of every variant (or of the first two: round 1's default and
    the two-kernel one), of the scores + solve kernel of the two-kernel ones, then of stages
    2 and 3 of the default; all launched as kda_prefill_triton does."""
    from atomk31.triton_kernels.kda_prefill import plan_chunks, run_intra
    from atomk31.triton_kernels.kda_prefill_output import kda_prefill_output
    from atomk31.triton_kernels.kda_prefill_scores import kda_prefill_scores
    from atomk31.triton_kernels.kda_prefill_state import kda_prefill_state
    from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning

    plan = plan_chunks(x["cu_seqlens"].tolist(), [])
    device = x["q"].device
    table = {name: torch.tensor(values, dtype=torch.int32, device=device)
             for name, values in plan.items() if name != "copies"}
    inputs = (x["q"], x["k"], x["v"], x["g"], x["beta"], table["chunk_start"],
              table["chunk_len"], scale, torch.bfloat16)
    times: dict[str, float] = {}
    scores_timed = set()
    for name, tuning in list(variants().items())[:None if every_variant else 2]:
        times[f"1 {name}"] = time_ms(lambda tuning=tuning: run_intra(*inputs, tuning))
        scores_config = (tuning.scores_block_k, tuning.scores_num_warps)
        if tuning.intra_split and scores_config not in scores_timed:
            scores_timed.add(scores_config)
            times[f"1a {name}"] = time_ms(lambda tuning=tuning: kda_prefill_scores(
                x["q"], x["k"], x["g"], x["beta"], table["chunk_start"], table["chunk_len"],
                scale, tuning.scores_block_k, tuning.scores_num_warps))
    tuning = KdaPrefillTuning()
    stage1 = run_intra(*inputs, tuning)
    o = torch.empty_like(x["v"])
    snapshots = torch.empty(1, HEADS, HEAD_DIM, HEAD_DIM, device=device)

    def state() -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        return kda_prefill_state(stage1, x["state"], o, snapshots, table["chunk_start"],
                                 table["chunk_len"], table["chunk_snapshot"],
                                 table["request_chunks"], tuning)

    _, stage2 = state()
    times["2 state"] = time_ms(state)
    times["3 output"] = time_ms(lambda: kda_prefill_output(
        stage1, stage2, o, table["chunk_start"], table["chunk_len"], tuning.bf16_products,
        tuning.output_block_v))
    return times


def run(cases: dict[str, list[int]], out_dir: Path | None) -> dict:
    from atomk31.ops.kda_prefill import kda_prefill_torch
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    try:
        from fla.ops.kda import chunk_kda
    except ImportError:
        chunk_kda = None
    copy_bw, matmul_rate = measure_copy_bandwidth(), measure_matmul_rate()
    scale = HEAD_DIM ** -0.5
    rows = []
    for case, lengths in cases.items():
        x = make_inputs(lengths)
        num_tokens = sum(lengths)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["cu_seqlens"], scale)
        expected = None
        if case == CHECK_CASE:
            expected = kda_prefill_torch(x["q"].float(), x["k"].float(), x["v"].float(),
                                         *args[3:])
        row: dict = {"case": case, "tokens": num_tokens, "requests": len(lengths)}
        timed: dict[str, Callable[[], object]] = {}
        for name, tuning in variants().items():
            timed[name] = (lambda tuning=tuning: kda_prefill_triton(*args, tuning=tuning))
        if chunk_kda is not None:
            cu = x["cu_seqlens"].long()
            timed["fla chunk_kda"] = lambda: chunk_kda(
                x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
                scale=scale, initial_state=x["state"], output_final_state=True,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        for name, fn in timed.items():
            try:
                result = fn()
                ms = time_ms(fn)
            except Exception as error:  # a variant that does not compile is reported, not fatal
                row[name] = f"failed: {type(error).__name__}: {str(error)[:300]}"
                continue
            entry = {"ms": ms, "tokens_per_s": num_tokens / ms * 1e3,
                     "fraction_of_copy_bw":
                         minimal_bytes(num_tokens, len(lengths)) / (ms * 1e-3) / copy_bw,
                     "fraction_of_matmul_rate":
                         chunked_flops(num_tokens) / (ms * 1e-3) / matmul_rate}
            if expected is not None:
                o, final_state = (result[0][0], result[1]) if name.startswith("fla") \
                    else result[:2]
                entry["o_error"] = relative_error(o, expected[0])
                entry["state_error"] = relative_error(final_state, expected[1])
                entry["correct"] = max(entry["o_error"], entry["state_error"]) < CHECK_TOLERANCE
            row[name] = entry
        fla = row.get("fla chunk_kda")
        if isinstance(fla, dict):
            for name in variants():
                if isinstance(row.get(name), dict):
                    row[name]["speedup_vs_fla"] = fla["ms"] / row[name]["ms"]
        try:
            row["stages_ms"] = stage_times(x, scale, every_variant=case == CHECK_CASE)
        except Exception as error:  # reported, not fatal
            row["stages_ms"] = f"failed: {type(error).__name__}: {str(error)[:300]}"
        rows.append(row)
        del x, expected
        torch.cuda.empty_cache()
    payload = {"copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops_per_s": matmul_rate,
               "heads": HEADS, "head_dim": HEAD_DIM, "rows": rows}
    path = write_result("kda_prefill", payload, out_dir)
    print(f"wrote {path}")
    print_table(rows)
    return payload


def print_table(rows: list[dict]) -> None:
    print(f"{'case':>6} {'variant':>30} {'ms':>7} {'Mtok/s':>7} {'vs fla':>6} {'copyBW':>6} "
          f"{'MMA':>6} {'o err':>8} {'S err':>8}")
    for row in rows:
        for name, value in row.items():
            if name in ("case", "tokens", "requests"):
                continue
            if name == "stages_ms":
                if isinstance(value, str):
                    print(f"{row['case']:>6} {'stages (ms)':>30} {value}")
                    continue
                for stage, ms in value.items():
                    print(f"{row['case']:>6} {'stage ' + stage:>30} {ms:7.3f}")
            elif isinstance(value, dict):
                errors = (f"{value['o_error']:8.1e} {value['state_error']:8.1e} "
                          f"{'ok' if value['correct'] else 'FAIL'}" if "o_error" in value else "")
                print(f"{row['case']:>6} {name:>30} {value['ms']:7.3f} "
                      f"{value['tokens_per_s'] / 1e6:7.3f} "
                      f"{value.get('speedup_vs_fla', 1.0):6.3f} "
                      f"{value['fraction_of_copy_bw']:6.3f} "
                      f"{value['fraction_of_matmul_rate']:6.3f} {errors}")
            else:
                print(f"{row['case']:>6} {name:>30} {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1x8K, 1x32K and 4x8K only")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="run only these cases (names as printed, e.g. 1x8K)")
    args = parser.parse_args()
    cases = {CHECK_CASE: [8192], "1x32K": [32768], "4x8K": [8192] * 4}
    if not args.quick:
        cases["1x64K"] = [65536]
    if args.cases:
        unknown = sorted(set(args.cases) - set(cases))
        if unknown:
            parser.error(f"unknown cases {unknown}; choose from {sorted(cases)}")
        cases = {name: lengths for name, lengths in cases.items() if name in args.cases}
    run(cases, args.out)


if __name__ == "__main__":
    main()

