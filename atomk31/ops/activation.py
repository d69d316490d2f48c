"""SiTU-GLU activation (MODEL_SPEC §4.8), used by the dense MLP and all experts.

Contract: ``situ_glu(gate [..., F], up [..., F], beta, linear_beta) -> [..., F]``

    gate_act = beta * tanh(gate / beta) * sigmoid(gate)    # SiLU with the gate capped at ±beta
    up_act   = linear_beta * tanh(up / linear_beta)         # or up itself when linear_beta is None
    out      = gate_act * up_act

``gate`` and ``up`` share shape and dtype (any float dtype); the math runs in fp32 and the
result is rounded once to the inputs' dtype. ``beta`` is ``activation_situ_beta`` (a config
null is mapped to 1.0 before it reaches the op, §9 #14), ``linear_beta`` is
``activation_situ_linear_beta`` (None = no cap). Fused gate/up weights keep the order
``[gate | up]``; split the fused output in halves before calling. Tests: fp32 within 1e-6
relative of a per-element ``math`` loop.
"""

import torch

from atomk31.ops.registry import register


def situ_glu_torch(
    gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float | None
) -> torch.Tensor:
    """SiTU-GLU. gate, up: [..., F] -> [..., F] in the inputs' dtype (fp32 compute)."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            "situ_glu: gate and up must have the same shape and dtype, got "
            f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}"
        )
    if not beta > 0 or (linear_beta is not None and not linear_beta > 0):
        raise ValueError(
            f"situ_glu: beta and linear_beta must be positive (linear_beta may be None), "
            f"got beta={beta}, linear_beta={linear_beta}"
        )
    a = gate.float()
    b = up.float()
    gate_act = beta * torch.tanh(a / beta) * torch.sigmoid(a)
    up_act = b if linear_beta is None else linear_beta * torch.tanh(b / linear_beta)
    return (gate_act * up_act).to(gate.dtype)


register("situ_glu", "torch", situ_glu_torch)
