"""KDA short convolution: causal depthwise conv over cached inputs, then SiLU (MODEL_SPEC §4.4).

Dims: T = tokens of the batch (requests concatenated), N = requests, C = channels (H*K or
H*V), Kc = conv width (4 in K3.1). ``cu_seqlens`` int32 [N+1], ``cu_seqlens[0] = 0``,
delimits request r's tokens as ``z[cu_seqlens[r]:cu_seqlens[r+1]]`` (a request may have 0).

Contracts:

* ``short_conv_silu(z [T, C], weight [C, Kc], conv_state [N, Kc-1, C], cu_seqlens,
  has_initial_state bool [N]) -> y [T, C]``: per request, ``zz = cat(state_r, z_r)`` (state
  taken as zeros when ``has_initial_state[r]`` is False),
  ``y_t = silu(sum_j weight[:, j] * zz[t + j])`` (``weight[:, Kc-1]`` hits the current token),
  then ``conv_state[r] = zz[-(Kc-1):]`` in place: the last Kc-1 *inputs* (pre-conv).
  A checkpoint weight ``[C, 1, Kc]`` is passed as ``weight[:, 0, :]``. With ``state_slots``
  (int64 [N], keyword) ``conv_state`` is a layer's whole pool ``[S, Kc-1, C]`` and request
  r's state is ``conv_state[state_slots[r]]``, read and written where it lies.
* ``conv_state_after(z [T, C], conv_state [N, Kc-1, C], cu_seqlens, has_initial_state,
  snapshot_at int64 [M, 2]) -> [M, Kc-1, C]``: for each row ``(r, m)`` the conv state request
  r would hold after its first m tokens of this batch (``0 <= m <= T_r``), i.e. the last Kc-1
  rows of ``cat(state_r, z_r[:m])``; for prefix-cache snapshots. Call it *before*
  ``short_conv_silu``, which overwrites ``conv_state``. ``state_slots`` as above.

Accumulation in fp32; y takes z's dtype, the state keeps its own dtype (BF16 in the engine).
Tests: fp32 within 1e-6 relative of a per-request loop; states exact.
"""

import torch
import torch.nn.functional as F

from atomk31.ops.kda import check_cu_seqlens, check_snapshot_rows
from atomk31.ops.registry import register
from atomk31.ops.requirements import READS_DEVICE, needs_gpu


def short_conv_silu_torch(
    z: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise conv + SiLU over variable-length requests; updates conv_state in place.

    z: [T, C]; weight: [C, Kc]; conv_state: [N, Kc-1, C] (or the pool [S, Kc-1, C] with
    state_slots [N]); cu_seqlens: int32 [N+1]; has_initial_state: bool [N] -> y [T, C].
    """
    if state_slots is not None:
        rows = conv_state[state_slots]
        y = short_conv_silu_torch(z, weight, rows, cu_seqlens, has_initial_state)
        conv_state[state_slots] = rows
        return y
    _check_conv_inputs("short_conv_silu", z, conv_state, cu_seqlens, has_initial_state)
    width = conv_state.shape[1] + 1
    if weight.shape != (z.shape[1], width):
        raise ValueError(
            f"short_conv_silu: weight must be [C, Kc] = [{z.shape[1]}, {width}] (Kc - 1 = the "
            f"conv_state rows; pass a checkpoint [C, 1, Kc] weight as weight[:, 0, :]), "
            f"got {tuple(weight.shape)}"
        )
    padded, token_rows = _pad_with_states(z, conv_state, cu_seqlens, has_initial_state)
    history = width - 1
    # zz[t + j] of the token at padded row p is padded[p - history + j].
    out = torch.zeros(z.shape, dtype=torch.float32, device=z.device)
    for j in range(width):
        out += weight[:, j].float() * padded[token_rows - history + j]
    # Request r's last Kc-1 padded rows end where its next state block would start.
    ends = cu_seqlens[1:].long() + history * torch.arange(1, len(conv_state) + 1,
                                                          device=z.device)
    rows = ends[:, None] - history + torch.arange(history, device=z.device)   # [N, Kc-1]
    conv_state.copy_(padded[rows].to(conv_state.dtype))
    return F.silu(out).to(z.dtype)


def conv_state_after_torch(
    z: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    snapshot_at: torch.Tensor,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Conv states after the first m tokens of request r, for each (r, m) row of snapshot_at.

    z: [T, C]; conv_state: [N, Kc-1, C] (before this batch; or the pool [S, Kc-1, C] with
    state_slots [N]); snapshot_at: int64 [M, 2] -> [M, Kc-1, C] in conv_state.dtype.
    """
    if state_slots is not None:
        conv_state = conv_state[state_slots]
    _check_conv_inputs("conv_state_after", z, conv_state, cu_seqlens, has_initial_state)
    if snapshot_at.dim() != 2 or snapshot_at.shape[1] != 2:
        raise ValueError(
            f"conv_state_after: snapshot_at must be [M, 2] rows of (request, tokens), "
            f"got shape {tuple(snapshot_at.shape)}"
        )
    requests, counts = snapshot_at[:, 0].long(), snapshot_at[:, 1].long()
    check_snapshot_rows("conv_state_after", requests, counts, cu_seqlens)
    padded, _ = _pad_with_states(z, conv_state, cu_seqlens, has_initial_state)
    history = conv_state.shape[1]
    # Request r's padded block starts at cu_seqlens[r] + r*(Kc-1); after m tokens its last
    # Kc-1 rows are that start + m + (0..Kc-2).
    starts = cu_seqlens[:-1].long()[requests] + history * requests + counts
    rows = starts[:, None] + torch.arange(history, device=z.device)
    return padded[rows].to(conv_state.dtype)


def _pad_with_states(
    z: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [T + N*(Kc-1), C]: each request's Kc-1 state rows followed by its tokens, and the
    padded row of every token [T]."""
    num_tokens, num_channels = z.shape
    num_requests, history, _ = conv_state.shape
    device = z.device
    request_of_token = torch.searchsorted(
        cu_seqlens[1:].long(), torch.arange(num_tokens, device=device), right=True
    )
    token_rows = torch.arange(num_tokens, device=device) + history * (request_of_token + 1)
    state_rows = (cu_seqlens[:-1].long() + history * torch.arange(num_requests, device=device))
    state_rows = state_rows[:, None] + torch.arange(history, device=device)    # [N, Kc-1]
    # where, not multiply: an unused slot may hold NaN garbage.
    states = torch.where(has_initial_state[:, None, None], conv_state.float(), 0.0)
    padded = torch.empty(num_tokens + num_requests * history, num_channels,
                         dtype=torch.float32, device=device)
    padded[state_rows.reshape(-1)] = states.reshape(-1, num_channels)
    padded[token_rows] = z.float()
    return padded, token_rows


def _check_conv_inputs(
    op: str,
    z: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> None:
    if z.dim() != 2 or conv_state.dim() != 3 or conv_state.shape[2] != z.shape[1]:
        raise ValueError(
            f"{op}: expected z [T, C] and conv_state [N, Kc-1, C] with the same C, got "
            f"{tuple(z.shape)} and {tuple(conv_state.shape)}"
        )
    num_requests = conv_state.shape[0]
    check_cu_seqlens(op, cu_seqlens, num_requests, z.shape[0])
    if has_initial_state.shape != (num_requests,) or has_initial_state.dtype != torch.bool:
        raise ValueError(
            f"{op}: has_initial_state must be bool [N] = [{num_requests}], got "
            f"{has_initial_state.dtype} {tuple(has_initial_state.shape)}"
        )


register("short_conv_silu", "torch", short_conv_silu_torch, not_in_graph=READS_DEVICE)
register("short_conv_silu", "triton", "atomk31.triton_kernels.kda_conv:short_conv_silu_triton",
         why_not=needs_gpu)
register("conv_state_after", "torch", conv_state_after_torch, not_in_graph=READS_DEVICE)
register("conv_state_after", "triton", "atomk31.triton_kernels.kda_conv:conv_state_after_triton",
         why_not=needs_gpu)
