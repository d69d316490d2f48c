"""A differentiable, batched chunked KDA scan in plain PyTorch (MODEL_SPEC §4.4, chunked form).

Same results as `atomk31.reference.kda_scan.kda_recurrent`, for batches and with autograd.
Chunks of 64 tokens run in parallel except for the state hand-over between chunks; inside a
chunk, the decays `exp(Gamma_i - Gamma_j)` are factorised per 16-token row block `I` around
`rho_I` (Gamma just before block I): `exp(Gamma_i - rho_I) * exp(rho_I - Gamma_j)`. For i in
block I the first factor lies in [e^-80, 1] (16 steps of at most -5, the gate's floor) and for
j <= end of block I the second lies in [e^-320, e^80], so nothing overflows in float32 and only
negligible terms underflow; later columns are masked before the exponential. This is the
sub-chunk idea of fla's KDA kernels (16-token blocks for gates bounded below), written as
tensor algebra.

Dims: B batch, T tokens, H heads, K key dim, V value dim, N chunks of C tokens, M = C / 16 row
blocks per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64
BLOCK_SIZE = 16
L2_NORM_EPS = 1e-6


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def _to_chunks(x: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """[B, T_padded, H, X] -> [B, H, N, C, X]."""
    b, _, h, width = x.shape
    return x.view(b, num_chunks, CHUNK_SIZE, h, width).permute(0, 3, 1, 2, 4)


def _intra_chunk_scores(q: torch.Tensor, k: torch.Tensor, cumulative: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """A_kk (j < i) and A_qk (j <= i), [B, H, N, C, C]: sum_d x_i[d] k_j[d] exp(G_i[d] - G_j[d])."""
    *lead, c, width = k.shape
    m = c // BLOCK_SIZE
    blocks = cumulative.view(*lead, m, BLOCK_SIZE, width)
    # rho_I: Gamma at the last position before block I (0 before the first block).
    rho = torch.cat([torch.zeros_like(blocks[..., :1, 0, :]), blocks[..., :-1, -1, :]], dim=-2)
    left = torch.exp(blocks - rho.unsqueeze(-2))                          # [.., M, 16, K] <= 1
    exponent = rho.unsqueeze(-2) - cumulative.unsqueeze(-3)               # [.., M, C, K]
    column = torch.arange(c, device=k.device)
    block_end = torch.arange(m, device=k.device) * BLOCK_SIZE + BLOCK_SIZE - 1
    future = column.view(1, c) > block_end.view(m, 1)                     # [M, C]
    right = torch.exp(exponent.masked_fill(future.unsqueeze(-1), float("-inf"))) \
        * k.unsqueeze(-3)                                                 # [.., M, C, K]
    k_left = (k.view(*lead, m, BLOCK_SIZE, width) * left)
    q_left = (q.view(*lead, m, BLOCK_SIZE, width) * left)
    a_kk = torch.einsum("...msk,...mck->...msc", k_left, right).reshape(*lead, c, c)
    a_qk = torch.einsum("...msk,...mck->...msc", q_left, right).reshape(*lead, c, c)
    lower = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    return a_kk.masked_fill(lower.logical_not() | torch.eye(c, dtype=torch.bool, device=k.device),
                            0.0), a_qk.masked_fill(~lower, 0.0)


def kda_chunked_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor) -> torch.Tensor:
    """KDA over a batch of sequences starting from a zero state.

    q, k [B, T, H, K] raw (post-conv; normalised here, q scaled by 1/sqrt(K)); v [B, T, H, V];
    g [B, T, H, K] log-space decay (< 0, >= the gate floor -5); beta [B, T, H] in (0, 1).
    Returns o [B, T, H, V] in float32. Right padding is harmless: outputs at position t depend
    only on positions <= t.
    """
    dtype = torch.float32
    b, t, h, key_dim = q.shape
    q_hat = _l2_normalize(q.to(dtype)) * key_dim**-0.5
    k_hat = _l2_normalize(k.to(dtype))
    pad = (-t) % CHUNK_SIZE
    num_chunks = (t + pad) // CHUNK_SIZE
    padded = [F.pad(x.to(dtype), (0, 0, 0, 0, 0, pad)) for x in (q_hat, k_hat, v, g)]
    q_c, k_c, v_c, g_c = (_to_chunks(x, num_chunks) for x in padded)
    beta_c = F.pad(beta.to(dtype), (0, 0, 0, pad)).view(b, num_chunks, CHUNK_SIZE, h) \
        .permute(0, 3, 1, 2)                                              # [B, H, N, C]
    cumulative = g_c.cumsum(dim=-2)                                       # Gamma [B, H, N, C, K]
    a_kk, a_qk = _intra_chunk_scores(q_c, k_c, cumulative)
    eye = torch.eye(CHUNK_SIZE, dtype=dtype, device=q.device)
    unit_lower = eye + beta_c.unsqueeze(-1) * a_kk
    transform = torch.linalg.solve_triangular(unit_lower, torch.diag_embed(beta_c), upper=False,
                                              unitriangular=True)         # Tm [B, H, N, C, C]
    w = transform @ (torch.exp(cumulative) * k_c)                         # [B, H, N, C, K]
    u = transform @ v_c                                                   # [B, H, N, C, V]
    q_decayed = q_c * torch.exp(cumulative)
    last = cumulative[..., -1:, :]                                        # Gamma_C [B, H, N, 1, K]
    k_to_end = (torch.exp(last - cumulative) * k_c).transpose(-1, -2)     # [B, H, N, K, C]
    chunk_decay = torch.exp(last).transpose(-1, -2)                       # [B, H, N, K, 1]
    state = q.new_zeros(b, h, key_dim, v.shape[-1], dtype=dtype)
    outputs = []
    for n in range(num_chunks):
        v_new = u[:, :, n] - w[:, :, n] @ state                           # V' [B, H, C, V]
        outputs.append(q_decayed[:, :, n] @ state + a_qk[:, :, n] @ v_new)
        state = chunk_decay[:, :, n] * state + k_to_end[:, :, n] @ v_new
    o = torch.stack(outputs, dim=2)                                       # [B, H, N, C, V]
    return o.permute(0, 2, 3, 1, 4).reshape(b, num_chunks * CHUNK_SIZE, h, -1)[:, :t]
