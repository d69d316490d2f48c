"""KDA gate and token-by-token recurrence: decode and speculative verify (MODEL_SPEC §4.4).

The chunked prefill lives in ``kda_prefill.py`` and the short convolution in ``kda_conv.py``;
all three share the conventions below.

Dims: N = requests, H = KDA heads, K = key head dim, V = value head dim (K = V = 128 in K3.1).
Recurrent state: ``[N, H, K, V]`` fp32, key-major exactly as §4.4's ``S`` (the decay scales
the rows, i.e. the key axis). ``q``/``k`` arrive raw: the ops l2-normalise them per head over
K (``x / sqrt(sum x^2 + 1e-6)``, §9 #3) and multiply q by ``scale`` (``K ** -0.5`` in K3.1).
``g`` is the log-space decay from ``kda_gate`` (fp32); ``beta`` is already sigmoided (fp32,
§4.4: a BF16 sigmoid costs accuracy). All recurrence math is fp32; outputs take v's dtype.

Contracts:

* ``kda_gate(f [T, H, K], A_log [H], dt_bias [H*K], lower_bound) -> g fp32 [T, H, K]``.
  Lower-bounded form (K3.1, ``gate_lower_bound = -5``):
  ``g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias[h*K + d]))``, so g is in
  (lower_bound, 0). Null form (``lower_bound=None``, Kimi-Linear):
  ``g = -exp(A_log[h]) * softplus(f + dt_bias)``.
* ``kda_decode(q [N, H, K], k [N, H, K], v [N, H, V], g [N, H, K], beta [N, H],
  state [N, H, K, V], scale, state_slots=None) -> o [N, H, V]``: one step per request in
  §4.4's order (1. decay the rows, 2. delta-rule error ``u = beta (v - k̂ S)``, 3. rank-1
  write ``S += k̂ u^T``, 4. read after the write ``o = q̂ S``); the state is updated in
  place. With ``state_slots`` (int64 [N]) ``state`` is a layer's whole state pool
  ``[S, H, K, V]`` and request r's state is ``state[state_slots[r]]``: the engine's decode
  steps update the pool where it lies, so no step gathers and scatters 6 MiB of state per
  request and layer (the slots are distinct).
* ``kda_verify(q [N, Tq, H, K], k, v [N, Tq, H, V], g [N, Tq, H, K], beta [N, Tq, H],
  state [N, H, K, V], scale) -> (o [N, Tq, H, V], states_after_each fp32 [N, Tq, H, K, V])``:
  Tq steps from ``state``, which is left untouched; ``states_after_each[:, i]`` is the state
  after row i, so a verify that accepts the first n+1 rows resumes from
  ``states_after_each[:, n]`` exactly (§5.7).

Tests: decode equals the chunked prefill within 1e-4 relative (max-abs error over max-abs
value), verify states equal stepping one by one exactly (same arithmetic).
"""

import torch
import torch.nn.functional as F

from atomk31.ops.registry import register
from atomk31.ops.requirements import needs_gpu

# §9 #3: the KDA l2 norms of q and k use 1e-6.
L2_NORM_EPS = 1e-6


def kda_gate_torch(
    f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None
) -> torch.Tensor:
    """Forget gate in log space. f: [T, H, K]; A_log: [H]; dt_bias: [H*K] -> g fp32 [T, H, K]."""
    if f.dim() != 3:
        raise ValueError(f"kda_gate: f must be [T, H, K], got shape {tuple(f.shape)}")
    _, num_heads, head_dim = f.shape
    if A_log.shape != (num_heads,) or dt_bias.shape != (num_heads * head_dim,):
        raise ValueError(
            f"kda_gate: expected A_log [H] = [{num_heads}] and dt_bias [H*K] = "
            f"[{num_heads * head_dim}], got {tuple(A_log.shape)} and {tuple(dt_bias.shape)} "
            "(the loader keeps the first H entries of a padded A_log, §9 #16)"
        )
    decay_rate = A_log.float().exp()[:, None]                              # [H, 1]
    pre_activation = f.float() + dt_bias.float().view(num_heads, head_dim)
    if lower_bound is None:
        return -decay_rate * F.softplus(pre_activation)
    if not lower_bound < 0:
        raise ValueError(f"kda_gate: lower_bound must be negative or None, got {lower_bound}")
    return lower_bound * torch.sigmoid(decay_rate * pre_activation)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim (K), in fp32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def kda_step(
    q_hat: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step on prepared fp32 inputs (q̂ already scaled); returns (o, new state).

    q_hat, k_hat, g: [..., H, K]; v: [..., H, V]; beta: [..., H]; state: [..., H, K, V].
    """
    decayed = state * g.exp()[..., None]                                   # 1. decay rows
    error = beta[..., None] * (v - torch.einsum("...k,...kv->...v", k_hat, decayed))   # 2.
    new_state = decayed + k_hat[..., :, None] * error[..., None, :]       # 3. rank-1 write
    return torch.einsum("...k,...kv->...v", q_hat, new_state), new_state  # 4. read after


def kda_decode_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step per request; updates the state (``state`` [N, H, K, V], or the rows
    ``state_slots`` of the pool ``state``) in place -> o [N, H, V]."""
    rows = state if state_slots is None else state[state_slots]
    _check_step_shapes("kda_decode", q, k, v, g, beta, rows, leading=(q.shape[0],))
    o, new_state = kda_step(l2_normalize(q) * scale, l2_normalize(k), v.float(), g.float(),
                            beta.float(), rows)
    if state_slots is None:
        state.copy_(new_state)
    else:
        state[state_slots] = new_state
    return o.to(v.dtype)


def kda_verify_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tq steps per request from ``state`` (not modified) -> (o [N, Tq, H, V],
    states_after_each [N, Tq, H, K, V])."""
    if q.dim() != 4:
        raise ValueError(f"kda_verify: q must be [N, Tq, H, K], got shape {tuple(q.shape)}")
    num_requests, num_rows = q.shape[:2]
    _check_step_shapes("kda_verify", q, k, v, g, beta, state, leading=(num_requests, num_rows))
    q_hat, k_hat = l2_normalize(q) * scale, l2_normalize(k)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    states_after_each = torch.empty(
        (num_requests, num_rows) + tuple(state.shape[1:]), dtype=torch.float32, device=state.device
    )
    current = state.float()
    for i in range(num_rows):
        o[:, i], current = kda_step(q_hat[:, i], k_hat[:, i], v[:, i].float(), g[:, i].float(),
                                    beta[:, i].float(), current)
        states_after_each[:, i] = current
    return o.to(v.dtype), states_after_each


def _check_step_shapes(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    leading: tuple[int, ...],
) -> None:
    if state.dim() != 4 or state.dtype != torch.float32:
        raise ValueError(
            f"{op}: state must be fp32 [N, H, K, V], got {state.dtype} {tuple(state.shape)}"
        )
    num_requests, num_heads, head_dim, value_dim = state.shape
    expected = {
        "q": (*leading, num_heads, head_dim), "k": (*leading, num_heads, head_dim),
        "v": (*leading, num_heads, value_dim), "g": (*leading, num_heads, head_dim),
        "beta": (*leading, num_heads),
    }
    arrived = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, shape in expected.items():
        if tuple(arrived[name].shape) != shape:
            raise ValueError(
                f"{op}: {name} must have shape {list(shape)} to match state "
                f"[N={num_requests}, H={num_heads}, K={head_dim}, V={value_dim}], "
                f"got {list(arrived[name].shape)}"
            )
    if leading[0] != num_requests:
        raise ValueError(f"{op}: state has N={num_requests} requests, inputs have {leading[0]}")


def check_cu_seqlens(op: str, cu_seqlens: torch.Tensor, num_requests: int, num_tokens: int) -> None:
    """cu_seqlens must be int32/int64 [N+1], start at 0, end at T, never decrease."""
    if cu_seqlens.shape != (num_requests + 1,) or cu_seqlens.dtype not in (torch.int32,
                                                                            torch.int64):
        raise ValueError(
            f"{op}: cu_seqlens must be int32 [N+1] = [{num_requests + 1}], got "
            f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
        )
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != num_tokens or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(
            f"{op}: cu_seqlens must rise from 0 to T={num_tokens} without decreasing, got {bounds}"
        )


def check_snapshot_rows(
    op: str, requests: torch.Tensor, counts: torch.Tensor, cu_seqlens: torch.Tensor
) -> None:
    """Every (request, tokens) snapshot row must name a request and stay within its tokens."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    for r, m in zip(requests.tolist(), counts.tolist()):
        if not 0 <= r < len(lengths) or not 0 <= m <= int(lengths[r]):
            raise ValueError(
                f"{op}: snapshot_at row ({r}, {m}) is out of range: need 0 <= request < "
                f"{len(lengths)} and 0 <= tokens <= that request's length in this batch"
            )


register("kda_gate", "torch", kda_gate_torch)
register("kda_decode", "torch", kda_decode_torch)
register("kda_decode", "triton", "atomk31.triton_kernels.kda_decode:kda_decode_triton",
         why_not=needs_gpu)
register("kda_verify", "torch", kda_verify_torch)
register("kda_verify", "triton", "atomk31.triton_kernels.kda_decode:kda_verify_triton",
         why_not=needs_gpu)
