"""The `amd` backend: which AMD kernel each op runs on a ROCm GPU (DESIGN.md §3).

Per op, in this order: a Gluon or FlyDSL kernel written for gfx950 (some also run on gfx942),
else aiter where it has the op, else the registry falls back along amd -> triton -> torch.
Every registration says why it cannot run on a device, which `atomk31 info` prints
(OpTable.describe()).

| op              | amd implementation                              | runs on          |
|-----------------|-------------------------------------------------|------------------|
| indexer_score   | gluon_kernels.indexer_score (scaled MFMA / MFMA)| gfx950, gfx942   |
| topk_positions  | gluon_kernels.radix_topk (multi-workgroup radix)| gfx950, gfx942   |
| sparse_mla      | flydsl_kernels.sparse_mla on an e4m3fn latent   | gfx950 + flydsl  |
| moe_experts_mxfp4 | flydsl_kernels.moe_mxfp4 (Dl, F multiples of 128) | gfx950 + flydsl |
| rms_norm        | aiter.rms_norm on 2-D bf16/fp16 rows            | ROCm + aiter     |
| everything else | the triton implementation, else torch           |                  |

Kernel packages are imported on first call, never at import time: aiter and FlyDSL exist only
in ROCm installs, and importing this module must stay cheap everywhere.
"""

import importlib.util
from collections.abc import Callable

import torch

from atomk31.ops.registry import register

GLUON_ARCHS = ("gfx950", "gfx942")
FLYDSL_ARCHS = ("gfx950",)


def rocm_arch(device: torch.device) -> str | None:
    """The gfx name of a ROCm GPU ("gfx950"), or None for any other device."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]


def _needs_rocm_arch(archs: tuple[str, ...], package: str | None = None
                     ) -> Callable[[torch.device], str | None]:
    """A why_unavailable check: a ROCm GPU of one of ``archs``, and ``package`` installed."""
    def why_unavailable(device: torch.device) -> str | None:
        arch = rocm_arch(device)
        if arch is None:
            return "needs a ROCm GPU"
        if arch not in archs:
            return f"needs {' or '.join(archs)}, got {arch}"
        if package is not None and importlib.util.find_spec(package) is None:
            return f"needs the {package} package (pip install 'atomk31[amd]')"
        return None
    return why_unavailable


def _needs_aiter(device: torch.device) -> str | None:
    if rocm_arch(device) is None:
        return "needs a ROCm GPU"
    if importlib.util.find_spec("aiter") is None:
        return "needs aiter (pip install 'atomk31[amd]')"
    return None


def indexer_score_amd(
    q: torch.Tensor,
    head_weights: torch.Tensor,
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
    block_table: torch.Tensor,
    row_request: torch.Tensor,
    row_position: torch.Tensor,
    block_size: int,
    num_positions: int | None = None,
) -> torch.Tensor:
    """`indexer_score` with the Gluon kernel (scaled MFMA on gfx950, CDNA3 MFMA on gfx942);
    launches a CUDA (HIP) graph replays take the Triton kernel: the Gluon launcher reads its
    row-group count back from the device, which a capture cannot do."""
    from atomk31.triton_kernels.runtime import launches_are_replayed

    if launches_are_replayed():
        from atomk31.ops.indexer_score import indexer_score_triton

        return indexer_score_triton(q, head_weights, index_values, index_scales, index_format,
                                    fp8_variant, block_table, row_request, row_position,
                                    block_size, num_positions=num_positions)
    from gluon_kernels.indexer_score import indexer_score_gluon

    return indexer_score_gluon(q, head_weights, index_values, index_scales, index_format,
                               fp8_variant, block_table, row_request, row_position, block_size,
                               num_positions=num_positions)


def topk_positions_amd(scores: torch.Tensor, k: int, lengths: torch.Tensor) -> torch.Tensor:
    """`topk_positions` with the Gluon multi-workgroup radix select."""
    from gluon_kernels.radix_topk import topk_positions_gluon

    return topk_positions_gluon(scores, k, lengths)


def sparse_mla_amd(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sparse_mla`: the FlyDSL kernel on a contiguous e4m3fn latent cache; other cache
    dtypes (bf16, fnuz) go to the portable implementation."""
    if latent_cache.dtype == torch.float8_e4m3fn and latent_cache.is_contiguous():
        from flydsl_kernels.sparse_mla import sparse_mla_flydsl

        return sparse_mla_flydsl(q, latent_cache, latent_scale, slots, softmax_scale)
    return _portable_sparse_mla()(q, latent_cache, latent_scale, slots, softmax_scale)


def _portable_sparse_mla() -> Callable:
    try:
        from atomk31.triton_kernels.sparse_mla import sparse_mla_triton
    except ImportError:
        from atomk31.ops.sparse_mla import sparse_mla_torch

        return sparse_mla_torch
    return sparse_mla_triton


def moe_experts_mxfp4_amd(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
    one_factor_exact: bool = False,
) -> torch.Tensor:
    """`moe_experts_mxfp4`: the FlyDSL kernels when Dl and F are multiples of 128 (K3.1:
    3584, 3072); other shapes go to the portable implementation, and so do launches a CUDA
    (HIP) graph replays: the FlyDSL path reads its grid size back from the device, which a
    capture cannot do. one_factor_exact (the weights' promise, ops/moe.py) only reaches the
    portable path: FlyDSL decodes its own way."""
    from flydsl_kernels.moe_mxfp4 import check_shapes, moe_experts_mxfp4_flydsl

    from atomk31.triton_kernels.runtime import launches_are_replayed

    args = (z, topk_weights, topk_ids, w13_packed, w13_scales, w2_packed, w2_scales, beta,
            linear_beta)
    if w13_packed.dim() == 3 and check_shapes(w13_packed) is None and \
            not launches_are_replayed():
        return moe_experts_mxfp4_flydsl(*args)
    return _portable_moe_experts_mxfp4()(*args, one_factor_exact=one_factor_exact)


def _portable_moe_experts_mxfp4() -> Callable:
    try:
        from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_triton
    except ImportError:
        from atomk31.ops.moe import moe_experts_mxfp4_torch

        return moe_experts_mxfp4_torch
    return moe_experts_mxfp4_triton


def rms_norm_amd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` with aiter for 2-D bf16/fp16 rows (its kernels' domain); else torch."""
    if x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16) and x.is_contiguous():
        import aiter

        return aiter.rms_norm(x, weight.to(x.dtype), eps)
    from atomk31.ops.norms import rms_norm_torch

    return rms_norm_torch(x, weight, eps)


register("indexer_score", "amd", indexer_score_amd, _needs_rocm_arch(GLUON_ARCHS))
register("topk_positions", "amd", topk_positions_amd, _needs_rocm_arch(GLUON_ARCHS))
register("sparse_mla", "amd", sparse_mla_amd, _needs_rocm_arch(FLYDSL_ARCHS, "flydsl"))
register("moe_experts_mxfp4", "amd", moe_experts_mxfp4_amd,
         _needs_rocm_arch(FLYDSL_ARCHS, "flydsl"))
register("rms_norm", "amd", rms_norm_amd, _needs_aiter)
