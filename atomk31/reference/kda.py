"""The KDA mixer: short convolutions, gates, the scan and the gated output (MODEL_SPEC §4.4).

Dims: T tokens, D hidden, H heads, K = V head dim, Kc conv width, C = H*K channels.
"""

from dataclasses import dataclass

import torch

from atomk31.reference.kda_scan import kda_chunked, kda_recurrent
from atomk31.reference.norms import rms_norm


@dataclass(frozen=True)
class KdaWeights:
    """One KDA layer's weights in float32, normalised at load.

    q_proj, k_proj, v_proj, g_proj [C, D]; q_conv1d, k_conv1d, v_conv1d [C, Kc];
    f_a_proj [K, D]; f_b_proj [C, K]; b_proj [H, D]; A_log [H] (first H entries, §9 #16);
    dt_bias [C]; o_norm [K] (shared by all heads); o_proj [D, C].
    """

    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    g_proj: torch.Tensor
    q_conv1d: torch.Tensor
    k_conv1d: torch.Tensor
    v_conv1d: torch.Tensor
    f_a_proj: torch.Tensor
    f_b_proj: torch.Tensor
    b_proj: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    o_norm: torch.Tensor
    o_proj: torch.Tensor

    @property
    def num_heads(self) -> int:
        return self.A_log.numel()

    @property
    def head_dim(self) -> int:
        return self.o_norm.numel()


@dataclass(frozen=True)
class KdaState:
    """Per-request KDA state of one layer: conv inputs [Kc-1, C] (x3) and recurrent [H, K, V]."""

    conv_q: torch.Tensor
    conv_k: torch.Tensor
    conv_v: torch.Tensor
    recurrent: torch.Tensor


def short_conv_silu(
    z: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv (no bias) then SiLU: z [T, C], weight [C, Kc], cache [Kc-1, C].

    The cache holds the last Kc-1 *inputs* (zeros for a new request). Returns
    (silu(y) [T, C], new cache [Kc-1, C]); `weight[:, Kc-1]` multiplies the current token.
    """
    kernel_size = weight.shape[-1]
    if cache is None:
        cache = z.new_zeros(kernel_size - 1, z.shape[-1])
    padded = torch.cat([cache.to(z.dtype), z])                        # [T + Kc-1, C]
    num_tokens = z.shape[0]
    y = sum(weight[:, j] * padded[j : j + num_tokens] for j in range(kernel_size))
    return torch.nn.functional.silu(y), padded[padded.shape[0] - (kernel_size - 1) :]


def kda_gates(
    f: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, gate_lower_bound: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forget gate g [T, H, K] (log space, < 0) and write strength beta [T, H].

    f [T, H, K] forget-gate pre-activation, b [T, H] beta logits, A_log [H], dt_bias [H*K].
    With a lower bound lb: `g = lb * sigmoid(exp(A_log) * (f + dt_bias))`, so g in (lb, 0);
    without: Kimi-Linear's `g = -exp(A_log) * softplus(f + dt_bias)` (§4.4). beta = sigmoid(b).
    """
    num_heads, head_dim = f.shape[1], f.shape[2]
    pre = f + dt_bias.view(num_heads, head_dim)
    rate = torch.exp(A_log).view(num_heads, 1)
    if gate_lower_bound is None:
        g = -rate * torch.nn.functional.softplus(pre)
    else:
        g = gate_lower_bound * torch.sigmoid(rate * pre)
    return g, torch.sigmoid(b)


def kda_layer(
    x: torch.Tensor,
    weights: KdaWeights,
    gate_lower_bound: float | None,
    eps: float,
    state: KdaState | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, KdaState]:
    """The KDA mixer: x [T, D] (normed layer input) -> (y [T, D], state after the last token).

    `eps` is rms_norm_eps for o_norm (§9 #3). `state` None starts a new request. The scan is
    the sequential definition, or the chunked form when `chunk_size` is given.
    """
    num_tokens, num_heads, head_dim = x.shape[0], weights.num_heads, weights.head_dim
    if state is None:
        cache_q = cache_k = cache_v = initial_recurrent = None
    else:
        cache_q, cache_k, cache_v, initial_recurrent = state.conv_q, state.conv_k, state.conv_v, state.recurrent
    q, conv_q = short_conv_silu(x @ weights.q_proj.T, weights.q_conv1d, cache_q)
    k, conv_k = short_conv_silu(x @ weights.k_proj.T, weights.k_conv1d, cache_k)
    v, conv_v = short_conv_silu(x @ weights.v_proj.T, weights.v_conv1d, cache_v)
    f = ((x @ weights.f_a_proj.T) @ weights.f_b_proj.T).view(num_tokens, num_heads, head_dim)
    g, beta = kda_gates(f, x @ weights.b_proj.T, weights.A_log, weights.dt_bias, gate_lower_bound)
    heads = (num_tokens, num_heads, head_dim)
    if chunk_size is None:
        o, recurrent = kda_recurrent(q.view(heads), k.view(heads), v.view(heads), g, beta, initial_recurrent)
    else:
        o, recurrent = kda_chunked(q.view(heads), k.view(heads), v.view(heads), g, beta, initial_recurrent, chunk_size)
    output_gate = torch.sigmoid(x @ weights.g_proj.T).view(heads)
    y = rms_norm(o, weights.o_norm, eps) * output_gate                 # per head over V
    return y.reshape(num_tokens, num_heads * head_dim) @ weights.o_proj.T, KdaState(conv_q, conv_k, conv_v, recurrent)
