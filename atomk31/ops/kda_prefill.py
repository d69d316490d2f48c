"""KDA chunked prefill over variable-length requests (MODEL_SPEC §4.4, chunked form).

Conventions (state layout, raw q/k, log-decay g, sigmoided beta) are those of ``kda.py``.

Contract: ``kda_prefill(q [T, H, K], k [T, H, K], v [T, H, V], g fp32 [T, H, K],
beta fp32 [T, H], initial_state fp32 [N, H, K, V], cu_seqlens int32 [N+1], scale,
chunk_size=64, snapshot_at int64 [M, 2] | None) -> (o [T, H, V], final_state fp32
[N, H, K, V], snapshots fp32 [M, H, K, V] | None)``

* Request r owns tokens ``cu_seqlens[r]:cu_seqlens[r+1]`` (possibly none) and starts from
  ``initial_state[r]`` (pass zeros for a new request); ``final_state[r]`` is its state after
  its last token. ``initial_state`` is not modified.
* ``snapshot_at`` rows ``(r, m)``, ``0 <= m <= T_r``: ``snapshots[i]`` is request r's state
  after its first m tokens of this call (prefix-cache snapshots). A cut that falls inside a
  chunk splits the chunk there, so a snapshot is never reconstructed, only recorded.
* Each chunk of c <= chunk_size tokens, with ``Γ_i = sum_{j<=i} g_j`` from the chunk start,
  incoming state S and normalised/scaled q̂, k̂:
  ``L[i,j] = β_i Σ_d k̂_i k̂_j exp(Γ_i - Γ_j)`` (j < i), ``W = (I + L)^-1 β (exp(Γ) ⊙ k̂)``,
  ``U = (I + L)^-1 β v``, ``V' = U - W S``, ``A[i,j] = Σ_d q̂_i k̂_j exp(Γ_i - Γ_j)`` (j <= i),
  ``O = (q̂ ⊙ exp(Γ)) S + A V'``, ``S <- exp(Γ_c) ⊙_rows S + (exp(Γ_c - Γ) ⊙ k̂)^T V'``.
  ``exp(Γ_i - Γ_j)`` is formed directly with exponent <= 0, never as
  ``exp(Γ_i) * exp(-Γ_j)``, which overflows fp32 once ``-Γ > 88`` (§4.4 numerics).

fp32 throughout; o takes v's dtype. Memory: one chunk holds ``H * c * c * K`` fp32 decay
factors (200 MB per chunk at H=96, c=64, K=128). Tests: o and states within 1e-4 relative
(max-abs error over max-abs value) of the sequential recurrence and of fla's
``naive_recurrent_kda``; snapshots equal to running the prefix alone.
"""

import torch

from atomk31.ops.kda import check_cu_seqlens, check_snapshot_rows, l2_normalize
from atomk31.ops.registry import register
from atomk31.ops.requirements import READS_DEVICE, needs_gpu


def kda_prefill_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    chunk_size: int = 64,
    snapshot_at: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Chunked KDA over requests delimited by cu_seqlens -> (o, final_state, snapshots)."""
    _check_prefill_inputs(q, k, v, g, beta, initial_state, cu_seqlens, chunk_size, snapshot_at)
    q_hat, k_hat = l2_normalize(q) * scale, l2_normalize(k)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    final_state = torch.empty_like(initial_state, dtype=torch.float32)
    snapshot_rows = [] if snapshot_at is None else snapshot_at.tolist()
    snapshots = (None if snapshot_at is None else
                 torch.empty((len(snapshot_rows),) + tuple(initial_state.shape[1:]),
                             dtype=torch.float32, device=initial_state.device))
    bounds = cu_seqlens.tolist()
    for request in range(len(bounds) - 1):
        start, end = bounds[request], bounds[request + 1]
        # Snapshot indices per cut m, so each is recorded right when the state reaches m.
        snapshots_at_cut: dict[int, list[int]] = {}
        for index, (r, m) in enumerate(snapshot_rows):
            if r == request:
                snapshots_at_cut.setdefault(m, []).append(index)
        cuts = sorted(set(range(0, end - start, chunk_size)) | set(snapshots_at_cut)
                      | {end - start})
        state = initial_state[request].float()
        if 0 in snapshots_at_cut:
            snapshots[snapshots_at_cut[0]] = state
        for a, b in zip(cuts, cuts[1:]):
            tokens = slice(start + a, start + b)
            o[tokens], state = _kda_chunk(q_hat[tokens], k_hat[tokens], v[tokens].float(),
                                          g[tokens].float(), beta[tokens].float(), state)
            if b in snapshots_at_cut:
                snapshots[snapshots_at_cut[b]] = state
        final_state[request] = state
    return o.to(v.dtype), final_state, snapshots


def _kda_chunk(
    q_hat: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of c tokens of one request (fp32). q_hat, k_hat, g: [c, H, K]; v: [c, H, V];
    beta: [c, H]; state: [H, K, V] -> (o [c, H, V], state after the chunk [H, K, V])."""
    q_hat, k_hat, v, g = (x.transpose(0, 1) for x in (q_hat, k_hat, v, g))   # [H, c, ...]
    beta = beta.T[..., None]                                                # [H, c, 1]
    num_tokens = q_hat.shape[1]
    gamma = g.cumsum(dim=1)                                                 # Γ [H, c, K]
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=g.device).tril()
    # exp(Γ_i - Γ_j) for j <= i, 0 above the diagonal (exp(-inf)); exponents stay <= 0.
    exponent = gamma[:, :, None, :] - gamma[:, None, :, :]                  # [H, c, c, K]
    decay = torch.where(causal[:, :, None], exponent, float("-inf")).exp()
    a_kk = torch.einsum("hid,hjd,hijd->hij", k_hat, k_hat, decay).tril(-1)
    eye = torch.eye(num_tokens, dtype=torch.float32, device=g.device)
    unit_lower = eye + beta * a_kk                                          # I + L
    w = torch.linalg.solve_triangular(unit_lower, beta * gamma.exp() * k_hat,
                                      upper=False, unitriangular=True)     # [H, c, K]
    u = torch.linalg.solve_triangular(unit_lower, beta * v,
                                      upper=False, unitriangular=True)     # [H, c, V]
    v_new = u - w @ state                                                   # V' [H, c, V]
    a_qk = torch.einsum("hid,hjd,hijd->hij", q_hat, k_hat, decay)          # j <= i
    o = (q_hat * gamma.exp()) @ state + a_qk @ v_new
    gamma_last = gamma[:, -1:, :]                                           # Γ_c [H, 1, K]
    new_state = (gamma_last.transpose(1, 2).exp() * state
                 + ((gamma_last - gamma).exp() * k_hat).transpose(1, 2) @ v_new)
    return o.transpose(0, 1), new_state


def _check_prefill_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    chunk_size: int,
    snapshot_at: torch.Tensor | None,
) -> None:
    if initial_state.dim() != 4 or initial_state.dtype != torch.float32:
        raise ValueError(
            "kda_prefill: initial_state must be fp32 [N, H, K, V], got "
            f"{initial_state.dtype} {tuple(initial_state.shape)}"
        )
    num_requests, num_heads, head_dim, value_dim = initial_state.shape
    num_tokens = q.shape[0] if q.dim() == 3 else -1
    expected = {
        "q": (num_tokens, num_heads, head_dim), "k": (num_tokens, num_heads, head_dim),
        "v": (num_tokens, num_heads, value_dim), "g": (num_tokens, num_heads, head_dim),
        "beta": (num_tokens, num_heads),
    }
    arrived = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, shape in expected.items():
        if tuple(arrived[name].shape) != shape:
            raise ValueError(
                f"kda_prefill: {name} must have shape {list(shape)} (T from q, H, K, V from "
                f"initial_state [N, H, K, V]), got {list(arrived[name].shape)}"
            )
    if chunk_size < 1:
        raise ValueError(f"kda_prefill: chunk_size must be positive, got {chunk_size}")
    check_cu_seqlens("kda_prefill", cu_seqlens, num_requests, num_tokens)
    if snapshot_at is not None:
        if snapshot_at.dim() != 2 or snapshot_at.shape[1] != 2:
            raise ValueError(
                "kda_prefill: snapshot_at must be [M, 2] rows of (request, tokens) or None, "
                f"got shape {tuple(snapshot_at.shape)}"
            )
        check_snapshot_rows("kda_prefill", snapshot_at[:, 0], snapshot_at[:, 1], cu_seqlens)


register("kda_prefill", "torch", kda_prefill_torch, not_in_graph=READS_DEVICE)
register("kda_prefill", "triton", "atomk31.triton_kernels.kda_prefill:kda_prefill_triton",
         why_not=needs_gpu)
