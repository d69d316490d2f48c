"""`atomk31 info`: the platform, and the kernel every op runs in eager and in graph steps.

With ``--target sm90|gfx950|gfx942|cpu`` it prints the tables of a machine that is not here:
the registry answers for that target with its standard packages (ops/target.py), importing no
kernel. Each row names the kernel chosen for an op (and shape class) and every implementation
passed over on the way, with its reason.
"""

from __future__ import annotations

import argparse

import torch

from atomk31.ops.target import NAMED_TARGETS

# The ops a K3.1 release checkpoint's forward calls (MXFP4 routed experts; K31Model.ops_called
# gives a loaded model's own set).
RELEASE_OPS = frozenset({
    "attn_res", "rms_norm", "layer_norm", "kv_write", "dense_mla", "sparse_mla",
    "indexer_score", "topk_slots", "ptpc_linear", "short_conv_silu", "conv_state_after",
    "kda_gate", "kda_decode", "kda_prefill", "gated_rms_norm", "situ_glu", "moe_route",
    "moe_experts_mxfp4",
})


def add_info_arguments(parser: argparse.ArgumentParser, add_flag) -> None:
    add_flag(parser, "kernel_backend", default="auto",
             choices=["auto", "torch", "triton", "hopper", "amd"])
    add_flag(parser, "device", default=None, help="e.g. cpu, cuda:0 (default: the GPU if any)")
    add_flag(parser, "target", default=None,
             help=f"print the tables of another target instead of this device's: one of "
                  f"{', '.join(NAMED_TARGETS)} (or any sm<NN> / gfx<NNN>)")
    from atomk31.info_parallel import add_parallel_plan_arguments

    add_parallel_plan_arguments(parser, add_flag)


def run_info(args: argparse.Namespace) -> int:
    import atomk31
    from atomk31.engine.cuda_graphs import why_no_decode_graphs
    from atomk31.ops import KernelContext, Target, select_kernels

    if args.target is not None:
        try:
            target = Target.named(args.target)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        print(f"atomk31 {atomk31.__version__}, target {target.name} (not this machine: "
              f"assuming its standard packages: {', '.join(sorted(target.packages)) or 'none'})")
    else:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        target = Target.of_device(device)
        print(f"atomk31 {atomk31.__version__}, torch {torch.__version__}, device {device}: "
              f"{_platform(device)}, target {target.name}")
    context = KernelContext.default_for(target)
    kernels = select_kernels(args.kernel_backend, context)
    print(f"kernel backend {args.kernel_backend!r} -> {kernels.backend}; "
          f"{_describe_context(context)}")
    steps = [("eager steps", kernels.eager)]
    if target.is_gpu:           # graphs need a GPU: on a CPU there is no graph table to show
        steps.append(("graph steps", kernels.graph))
    rows = {step: [(op if shape == "any" else f"{op} [{shape}]", chosen, kernel, passed_over)
                   for op, shape, chosen, kernel, passed_over in table.describe()]
            for step, table in steps}
    width = max(len(row[0]) for table_rows in rows.values() for row in table_rows)
    for step, table_rows in rows.items():
        print(f"{step}:")
        for name, chosen, kernel, passed_over in table_rows:
            print(f"  {name:<{width}} {chosen:<7} {kernel}")
            # the implementations passed over (targets without one are not listed)
            reasons = [r for r in passed_over.split("; ") if r and "no kernel yet" not in r]
            if reasons:
                print(f"  {'':<{width}} passed over: {'; '.join(reasons)}")
    why_eager = why_no_decode_graphs(kernels, enforce_eager=False, ops_called=RELEASE_OPS)
    print("decode steps: " + ("replayed from CUDA graphs (--enforce-eager: eager)"
                              if why_eager is None else f"eager ({why_eager})"))
    if args.model is not None:
        from atomk31.info_parallel import print_parallel_plan

        return print_parallel_plan(args, None if args.target is not None else device)
    return 0


def _platform(device: torch.device) -> str:
    if device.type != "cuda":
        return "CPU"
    name = torch.cuda.get_device_name(device)
    return f"{name} (ROCm {torch.version.hip})" if torch.version.hip else \
        f"{name} (CUDA {torch.version.cuda})"


def _describe_context(context) -> str:
    def name(dtype: torch.dtype) -> str:
        return str(dtype).removeprefix("torch.")
    return (f"compute {name(context.compute_dtype)}, latent {name(context.latent_dtype)}, "
            f"{context.index_format} index keys, blocks of {context.block_size}")
