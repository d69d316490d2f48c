"""The engine's accuracy table: the built-in model's task families per backend configuration.

For each configuration, starts `atomk31 serve` on the shipped checkpoint (a subprocess, as a user
would), waits for /health, runs `atomk31 eval`'s runner against it, stops it; then prints a
Markdown table (one column per configuration) and writes
`benchmarks/results/YYYY-MM-DD_<gpu>_demo_accuracy.json`.

    python -m benchmarks.demo.accuracy_table --configs cpu-torch            # any machine
    python -m benchmarks.demo.accuracy_table --configs triton-fp8-fp8,triton-mxfp4-fp8,triton-fp8-bf16

Configurations (name: serve flags): `cpu-torch` (torch kernels on the CPU, float32), and on a GPU
`triton-<index keys>-<latent>` with index keys fp8 | mxfp4 and latent fp8 | bf16 (CUDA graphs on,
the default).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from atomk31.demo.evaluate import EvalOptions, run_eval
from atomk31.demo.shipped import shipped_checkpoint
from benchmarks.common import write_result

CONFIGS: dict[str, list[str]] = {
    "cpu-torch": ["--device", "cpu", "--kernel-backend", "torch"],
    **{f"triton-{keys}-{latent}": ["--kernel-backend", "triton", "--index-cache-dtype", keys,
                                   "--kv-cache-dtype", latent]
       for keys in ("fp8", "mxfp4") for latent in ("fp8", "bf16")},
}
STARTUP_TIMEOUT_S = 300


def _wait_for_health(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"atomk31 serve exited with code {process.returncode} before it "
                               f"answered /health; see its log above")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"atomk31 serve did not answer /health within {STARTUP_TIMEOUT_S} s")


def measure(config: str, model: Path, port: int, options: EvalOptions) -> dict:
    """Serve `model` with the configuration's flags and score every family through it."""
    command = [sys.executable, "-m", "atomk31.cli", "--log-level", "WARNING", "serve", "--model",
               str(model), "--served-model-name", "atomk31-demo", "--port", str(port),
               *CONFIGS[config]]
    process = subprocess.Popen(command)
    try:
        _wait_for_health(port, process)
        base_url = f"http://127.0.0.1:{port}/v1"
        return run_eval(EvalOptions(**{**options.__dict__, "base_url": base_url}))
    finally:
        process.terminate()
        process.wait(timeout=60)


def markdown_table(results: dict[str, dict]) -> str:
    configs = list(results)
    groups = list(next(iter(results.values()))["results"])
    lines = ["| task | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for group in groups:
        cells = [f"{results[c]['results'][group]['accuracy']:.3f}" for c in configs]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
        for check in ("schema_valid", "right_call", "uses_result", "text_answer"):
            if check in results[configs[0]]["results"][group]:
                cells = [f"{results[c]['results'][group].get(check, float('nan')):.3f}"
                         for c in configs]
                lines.append(f"| {group}: {check} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="cpu-torch",
                        help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--num-per-task", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--passkey-lengths", default="1024,2048,4096,8192")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="completion budget for every family (default: per family)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint (default: the shipped atomk31/demo/weights)")
    args = parser.parse_args(argv)
    model = args.model or shipped_checkpoint()
    if model is None:
        raise SystemExit("no trained weights in atomk31/demo/weights/; pass --model DIR")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    lengths = tuple(int(v) for v in args.passkey_lengths.split(","))
    options = EvalOptions(num_per_task=args.num_per_task, seed=args.seed,
                          concurrency=args.concurrency, passkey_lengths=lengths,
                          max_tokens=args.max_tokens)
    results = {config: measure(config, model, args.port, options) for config in configs}
    print(markdown_table(results))
    print(write_result("demo_accuracy", {"model": str(model), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
