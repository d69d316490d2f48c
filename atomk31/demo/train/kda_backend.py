"""Choosing the KDA scan of the trainer: plain PyTorch, or fla's `chunk_kda` on a GPU.

fla is used only when it is importable, the device is a GPU, and it agrees with the plain
PyTorch scan on a random batch (outputs and input gradients); otherwise the trainer keeps the
PyTorch scan and says why.
"""

from __future__ import annotations

import logging

import torch

from atomk31.demo.train.kda_scan import kda_chunked_batched
from atomk31.demo.train.model import DemoModel

logger = logging.getLogger(__name__)

KDA_BACKENDS = ("auto", "torch", "fla")
AGREEMENT_TOLERANCE = 2e-2     # relative, on outputs and on q's gradient (fla computes in bf16 parts)


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def fla_disagreement(device: torch.device, num_heads: int, head_dim: int) -> float:
    """Largest relative error between fla's chunk_kda and the PyTorch scan on a random batch."""
    from fla.ops.kda import chunk_kda

    generator = torch.Generator(device="cpu").manual_seed(0)
    shape = (2, 300, num_heads, head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device).requires_grad_() for _ in "qkv")
    g = (-5.0 * torch.sigmoid(torch.randn(shape, generator=generator))).to(device)
    beta = torch.sigmoid(torch.randn(shape[:3], generator=generator)).to(device)
    reference = kda_chunked_batched(q, k, v, g, beta)
    (grad_reference,) = torch.autograd.grad(reference.square().sum(), q)
    fla_out, _ = chunk_kda(q, k, v, g, beta, scale=head_dim**-0.5, use_qk_l2norm_in_kernel=True)
    (grad_fla,) = torch.autograd.grad(fla_out.float().square().sum(), q)
    return max(_relative_error(fla_out.float(), reference), _relative_error(grad_fla, grad_reference))


def choose_kda_backend(model: DemoModel, requested: str, device: torch.device) -> str:
    """Set every KDA layer's scan; returns "torch" or "fla"."""
    if requested not in KDA_BACKENDS:
        raise ValueError(f"kda backend must be one of {KDA_BACKENDS}, got {requested!r}")
    chosen, reason = "torch", "requested"
    if requested != "torch":
        if device.type != "cuda":
            reason = "fla's chunk_kda needs a GPU"
        else:
            try:
                error = fla_disagreement(device, model.config.kda_num_heads,
                                         model.config.kda_head_dim)
            except ImportError as exc:
                reason = f"fla is not importable ({exc})"
            except Exception as exc:  # a kernel that fails to build or run: keep the PyTorch scan
                reason = f"fla's chunk_kda failed ({type(exc).__name__}: {exc})"
            else:
                if error <= AGREEMENT_TOLERANCE:
                    chosen, reason = "fla", f"agrees with the PyTorch scan (relative error {error:.1e})"
                else:
                    reason = f"disagrees with the PyTorch scan (relative error {error:.1e})"
    if requested == "fla" and chosen != "fla":
        raise RuntimeError(f"--kda-backend fla was requested but {reason}; use --kda-backend torch")
    for layer in model.kda_layers():
        layer.use_fla = chosen == "fla"
    logger.info("KDA scan: %s (%s)", chosen, reason)
    return chosen
