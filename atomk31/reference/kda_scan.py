"""The KDA delta-rule scan: sequential form (the definition) and chunked form (MODEL_SPEC §4.4).

Shapes use §4.4's names: T tokens, H heads, K key dim, V value dim. The state S [H, K, V] is
key-major: the forget gate decays the KEY axis (one value per key channel, shared by every
value channel). Both functions take the raw (post-conv) q and k, apply the L2 normalisation
(eps 1e-6, §9 #3) and the 1/sqrt(K) output scale to q themselves, and compute in the dtype of
their inputs (float32 in the oracle; float64 to check the two forms against each other).
"""

import torch

from atomk31.reference.norms import l2_normalize


def _normalized_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised q scaled by 1/sqrt(K), and L2-normalised k; both [T, H, K]."""
    head_dim = q.shape[-1]
    return l2_normalize(q) * head_dim**-0.5, l2_normalize(k)


def _initial_state(q: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    num_heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    if initial_state is None:
        return q.new_zeros(num_heads, key_dim, value_dim)
    if initial_state.shape != (num_heads, key_dim, value_dim):
        raise ValueError(
            f"KDA initial_state must be [H, K, V] = {[num_heads, key_dim, value_dim]}, got {list(initial_state.shape)}"
        )
    return initial_state.to(q.dtype).clone()


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential KDA scan. q, k [T, H, K] raw; v [T, H, V]; g [T, H, K] log-space decay (< 0);
    beta [T, H] in (0, 1); initial_state [H, K, V] or None (zeros).

    Returns (o [T, H, V], final state [H, K, V]). Per token, in this order (§4.4): decay the
    key rows, delta-rule error against the decayed state, rank-1 write, read AFTER the write.
    """
    q_hat, k_hat = _normalized_qk(q, k)
    state = _initial_state(q, v, initial_state)
    outputs = []
    for t in range(q.shape[0]):
        state = state * torch.exp(g[t]).unsqueeze(-1)                               # 1. decay rows
        error = beta[t].unsqueeze(-1) * (v[t] - torch.einsum("hk,hkv->hv", k_hat[t], state))  # 2.
        state = state + torch.einsum("hk,hv->hkv", k_hat[t], error)                 # 3. write
        outputs.append(torch.einsum("hk,hkv->hv", q_hat[t], state))                 # 4. read
    output = torch.stack(outputs) if outputs else v.new_zeros(0, *v.shape[1:])
    return output, state


def _chunk(
    q_hat: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of n tokens, per head: inputs [H, n, *], state [H, K, V] -> (o [H, n, V], state)."""
    n = q_hat.shape[1]
    cumulative = g.cumsum(dim=1)                                     # Gamma [H, n, K], from the chunk start
    # exp(Gamma_i - Gamma_j) is formed directly and only for j <= i (exponent <= 0), §4.4.
    difference = cumulative.unsqueeze(2) - cumulative.unsqueeze(1)   # [H, i, j, K]
    lower_inclusive = torch.ones(n, n, dtype=torch.bool, device=q_hat.device).tril()
    decay = torch.exp(difference.masked_fill(~lower_inclusive.unsqueeze(-1), float("-inf")))
    a_kk = torch.einsum("hik,hjk,hijk->hij", k_hat, k_hat, decay).tril(diagonal=-1)
    a_qk = torch.einsum("hik,hjk,hijk->hij", q_hat, k_hat, decay)     # j <= i, diagonal included
    # Tm = (I + diag(beta) A_kk)^-1 diag(beta): a unit lower-triangular solve.
    identity = torch.eye(n, dtype=q_hat.dtype, device=q_hat.device).expand_as(a_kk)
    unit_lower = identity + beta.unsqueeze(-1) * a_kk
    transform = torch.linalg.solve_triangular(unit_lower, torch.diag_embed(beta), upper=False, unitriangular=True)
    w = transform @ (torch.exp(cumulative) * k_hat)                  # [H, n, K]
    u = transform @ v                                                # [H, n, V]
    v_new = u - w @ state                                            # V' [H, n, V]
    output = (q_hat * torch.exp(cumulative)) @ state + a_qk @ v_new
    last = cumulative[:, -1:, :]                                     # Gamma_C [H, 1, K]
    state = torch.exp(last).transpose(1, 2) * state + (torch.exp(last - cumulative) * k_hat).transpose(1, 2) @ v_new
    return output, state


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked KDA scan, same arguments and results as `kda_recurrent` (§4.4 "Chunked form").

    Equal to the sequential form in exact arithmetic (float64: ~1e-12); in float32 within
    1e-3 relative on o (§8 #15). The last chunk may be shorter than `chunk_size`.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    q_hat, k_hat = _normalized_qk(q, k)
    state = _initial_state(q, v, initial_state)
    # Work head-major: [H, T, *].
    q_hat, k_hat, v_h, g_h = (t.transpose(0, 1) for t in (q_hat, k_hat, v, g))
    beta_h = beta.transpose(0, 1)
    outputs = []
    for start in range(0, q.shape[0], chunk_size):
        piece = slice(start, start + chunk_size)
        output, state = _chunk(q_hat[:, piece], k_hat[:, piece], v_h[:, piece], g_h[:, piece], beta_h[:, piece], state)
        outputs.append(output)
    output = torch.cat(outputs, dim=1).transpose(0, 1) if outputs else v.new_zeros(0, *v.shape[1:])
    return output, state
