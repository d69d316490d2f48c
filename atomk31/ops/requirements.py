"""The ``why_not`` checks implementations register with (ops/registry.py): each takes the
`KernelContext` the tables are built for and returns None when the implementation can serve
it, else a short reason that `atomk31 info` prints."""

from __future__ import annotations

from collections.abc import Callable

import torch

from atomk31.ops.target import KernelContext

WhyNot = Callable[[KernelContext], str | None]


def needs_gpu(context: KernelContext) -> str | None:
    """Triton kernels: any CUDA or ROCm GPU with Triton installed."""
    if not context.target.is_gpu:
        return "needs a GPU (Triton)"
    if "triton" not in context.target.packages:
        return "needs the triton package"
    return None


def needs_hopper(context: KernelContext) -> str | None:
    """Kernels written for sm_90 (wgmma, TMA, warp specialization)."""
    reason = needs_gpu(context)
    if reason is None and context.target.name != "sm90":
        reason = f"needs an sm_90 (Hopper) GPU, got {context.target.name}"
    return reason


def needs_rocm(archs: tuple[str, ...], package: str | None = None) -> WhyNot:
    """Kernels for the ROCm GPUs ``archs`` (gfx names), optionally needing ``package``."""
    def why_not(context: KernelContext) -> str | None:
        target = context.target
        if target.vendor != "amd":
            return "needs a ROCm GPU"
        if target.name not in archs:
            return f"needs {' or '.join(archs)}, got {target.name}"
        if package is not None and package not in target.packages:
            return f"needs the {package} package (pip install 'atomk31[amd]')"
        return None
    return why_not


def needs_latent(*dtypes: torch.dtype) -> WhyNot:
    """Kernels that read only these latent cache dtypes."""
    names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)

    def why_not(context: KernelContext) -> str | None:
        if context.latent_dtype not in dtypes:
            return f"reads a {names} latent, the cache is " \
                   f"{str(context.latent_dtype).removeprefix('torch.')}"
        return None
    return why_not


def needs_index_format(index_format: str) -> WhyNot:
    def why_not(context: KernelContext) -> str | None:
        if context.index_format != index_format:
            return f"reads {index_format} index keys, the cache has {context.index_format}"
        return None
    return why_not


def needs_compute(*dtypes: torch.dtype) -> WhyNot:
    names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)

    def why_not(context: KernelContext) -> str | None:
        if context.compute_dtype not in dtypes:
            return f"takes {names} activations, the engine computes in " \
                   f"{str(context.compute_dtype).removeprefix('torch.')}"
        return None
    return why_not


def all_of(*checks: WhyNot) -> WhyNot:
    """The first reason of ``checks``, in order (None when none objects)."""
    def why_not(context: KernelContext) -> str | None:
        for check in checks:
            reason = check(context)
            if reason is not None:
                return reason
        return None
    return why_not


# A torch implementation that reads tensor values on the host (a sync), which a CUDA-graph
# capture cannot do.
READS_DEVICE = "reads tensor values on the host (a device sync), which a graph cannot capture"
