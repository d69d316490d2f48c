"""RMSNorm, LayerNorm and the L2 normalisation of KDA (MODEL_SPEC §4.2, §4.4, §9 #3).

All functions compute in the dtype of their input (float32 in the oracle, float64 in some
tests) over the last dim and return that dtype.
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * x / sqrt(mean(x^2) + eps)` over the last dim; x [..., n], weight [n].

    The weight multiplies directly (no "1 + w" convention), §4.2.
    """
    return weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * (x - mean) / sqrt(var + eps) + bias` with the biased variance; x [..., n]."""
    centered = x - x.mean(dim=-1, keepdim=True)
    variance = centered.pow(2).mean(dim=-1, keepdim=True)
    return weight * (centered * torch.rsqrt(variance + eps)) + bias


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim (fla's l2norm; KDA q and k, §4.4, §9 #3)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def root_mean_square(x: torch.Tensor) -> float:
    """RMS over every element of `x` (the trace statistic); 0.0 for an empty tensor."""
    return float(x.float().pow(2).mean().sqrt()) if x.numel() else 0.0
