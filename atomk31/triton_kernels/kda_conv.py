"""KDA short convolution in Triton: causal depthwise conv over cached inputs, then SiLU, and
the conv state after it (MODEL_SPEC §4.4 short convolution).

Contracts are those of ``atomk31/ops/kda_conv.py`` (``short_conv_silu``,
``conv_state_after``). Each token of request r reads ``zz = cat(state_r, z_r)``: tap j of the
token at offset i is ``z[start + i + j - (Kc-1)]`` when that index is inside the request,
else row ``i + j`` of the request's state (zeros when ``has_initial_state[r]`` is False).

Two launches for ``short_conv_silu``: the convolution reads the old states, then
``conv_state_rows_kernel`` overwrites them (one program per request and channel block, all
loads before all stores). Neither reads cu_seqlens on the host, so decode steps never sync.
With ``state_slots`` the states are rows of a layer's pool, read and written in place.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _state_index(slots_ptr, request, mask, HAS_SLOTS: tl.constexpr):
    """The state row of ``request``: its slot in the pool, or the request itself."""
    if HAS_SLOTS:
        return tl.load(slots_ptr + request, mask=mask, other=0).to(tl.int64)
    return request.to(tl.int64)


@triton.jit
def _history_or_token(
    z_ptr, state_ptr, src, start, state_index, has_state, o_c, m_rows, m_c,
    stride_z, C: tl.constexpr, HISTORY: tl.constexpr,
):
    """Value of padded row ``src`` (token index; below ``start`` it is a row of state
    ``state_index``)."""
    is_token = src >= start
    b_z = tl.load(z_ptr + src.to(tl.int64)[:, None] * stride_z + o_c[None, :],
                  mask=(m_rows & is_token)[:, None] & m_c[None, :], other=0.0)
    state_row = src - start + HISTORY
    b_s = tl.load(state_ptr + (state_index * HISTORY + state_row)[:, None] * C
                  + o_c[None, :],
                  mask=(m_rows & ~is_token & has_state)[:, None] & m_c[None, :], other=0.0)
    return tl.where(is_token[:, None], b_z.to(tl.float32), b_s.to(tl.float32))


@triton.jit
def short_conv_silu_kernel(
    # pointers
    z_ptr, weight_ptr, state_ptr, y_ptr, cu_seqlens_ptr, request_of_token_ptr,
    has_state_ptr, slots_ptr,
    # sizes and strides
    num_tokens, stride_z, stride_y,
    # meta-parameters
    C: tl.constexpr, WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    i_t, i_c = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_t, m_c = o_t < num_tokens, o_c < C
    request = tl.load(request_of_token_ptr + o_t, mask=m_t, other=0)
    start = tl.load(cu_seqlens_ptr + request, mask=m_t, other=0)
    has_state = tl.load(has_state_ptr + request, mask=m_t, other=0) != 0
    state_index = _state_index(slots_ptr, request, m_t, HAS_SLOTS)
    b_acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        b_w = tl.load(weight_ptr + o_c * WIDTH + j, mask=m_c, other=0.0).to(tl.float32)
        b_x = _history_or_token(z_ptr, state_ptr, o_t + j - (WIDTH - 1), start, state_index,
                                has_state, o_c, m_t, m_c, stride_z, C, WIDTH - 1)
        b_acc += b_x * b_w[None, :]
    b_y = b_acc * tl.sigmoid(b_acc)                                       # SiLU
    tl.store(y_ptr + o_t.to(tl.int64)[:, None] * stride_y + o_c[None, :],
             b_y.to(y_ptr.dtype.element_ty), mask=m_t[:, None] & m_c[None, :])


@triton.jit
def conv_state_rows_kernel(
    # pointers
    z_ptr, state_ptr, out_ptr, cu_seqlens_ptr, has_state_ptr, rows_ptr, slots_ptr,
    # strides
    stride_z,
    # meta-parameters
    C: tl.constexpr, HISTORY: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_SLOTS: tl.constexpr, OUT_IS_STATE: tl.constexpr,
):
    """out[i] = the last HISTORY rows of cat(state_r, z_r[:m]) for rows_ptr[i] = (r, m);
    m = -1 means the request's whole length. All loads precede all stores, so out may be
    the state itself (OUT_IS_STATE: row r is written where the state of r lies; each program
    owns its request's rows)."""
    i_row, i_c = tl.program_id(0), tl.program_id(1)
    request = tl.load(rows_ptr + 2 * i_row).to(tl.int32)
    tokens = tl.load(rows_ptr + 2 * i_row + 1).to(tl.int32)
    start = tl.load(cu_seqlens_ptr + request)
    if tokens < 0:
        tokens = tl.load(cu_seqlens_ptr + request + 1) - start
    o_h = tl.arange(0, BLOCK_H)
    requests = request + tl.zeros([BLOCK_H], dtype=tl.int32)
    has_state = tl.load(has_state_ptr + requests) != 0
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_h, m_c = o_h < HISTORY, o_c < C
    state_index = _state_index(slots_ptr, requests, o_h >= 0, HAS_SLOTS)
    b_rows = _history_or_token(z_ptr, state_ptr, start + tokens - HISTORY + o_h, start,
                               state_index, has_state, o_c,
                               m_h, m_c, stride_z, C, HISTORY)
    tl.debug_barrier()
    out_row = state_index if OUT_IS_STATE else i_row.to(tl.int64)
    tl.store(out_ptr + (out_row * HISTORY + o_h)[:, None] * C + o_c[None, :],
             b_rows.to(out_ptr.dtype.element_ty), mask=m_h[:, None] & m_c[None, :])


def short_conv_silu_triton(
    z: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """z: [T, C] (row stride free); weight: [C, Kc]; conv_state: [N, Kc-1, C] (contiguous,
    updated in place; with state_slots int64 [N]: the pool [S, Kc-1, C], rows state_slots);
    cu_seqlens: int32 [N+1]; has_initial_state: bool [N] -> y [T, C]."""
    _check(z, conv_state, cu_seqlens, has_initial_state, state_slots)
    num_tokens, num_channels = z.shape
    history = conv_state.shape[1]
    num_requests = has_initial_state.shape[0]
    if weight.shape != (num_channels, history + 1):
        raise ValueError(f"short_conv_silu: weight must be [C, Kc] = [{num_channels}, "
                         f"{history + 1}], got {tuple(weight.shape)}")
    if z.stride(1) != 1:
        z = z.contiguous()
    y = torch.empty((num_tokens, num_channels), dtype=z.dtype, device=z.device)
    if num_tokens == 0 or num_requests == 0:
        return y
    bounds = cu_seqlens.to(torch.int32)
    request_of_token = torch.searchsorted(
        bounds[1:], torch.arange(num_tokens, dtype=torch.int32, device=z.device), right=True
    ).to(torch.int32)
    has_state = has_initial_state.to(torch.int8)
    slots = _slots(state_slots, conv_state)
    block_t, block_c = 16, 128
    short_conv_silu_kernel[(triton.cdiv(num_tokens, block_t), triton.cdiv(num_channels, block_c))](
        z, weight.contiguous(), conv_state, y, bounds, request_of_token, has_state, slots,
        num_tokens, z.stride(0), y.stride(0),
        C=num_channels, WIDTH=history + 1, BLOCK_T=block_t, BLOCK_C=block_c,
        HAS_SLOTS=state_slots is not None, num_warps=4,
    )
    # Whole-request rows: (r, -1) for every request.
    rows = torch.stack([torch.arange(num_requests, device=z.device),
                        torch.full((num_requests,), -1, device=z.device)], dim=1)
    _launch_rows(z, conv_state, conv_state, bounds, has_state, rows, state_slots,
                 out_is_state=True)
    return y


def conv_state_after_triton(
    z: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    snapshot_at: torch.Tensor,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Conv states after the first m tokens of request r for each (r, m) row of
    snapshot_at int64 [M, 2] -> [M, Kc-1, C] in conv_state.dtype. Call before
    short_conv_silu, which overwrites conv_state. ``state_slots`` as there."""
    _check(z, conv_state, cu_seqlens, has_initial_state, state_slots)
    if snapshot_at.dim() != 2 or snapshot_at.shape[1] != 2:
        raise ValueError("conv_state_after: snapshot_at must be [M, 2] rows of (request, "
                         f"tokens), got shape {tuple(snapshot_at.shape)}")
    if z.stride(1) != 1:
        z = z.contiguous()
    out = torch.empty((snapshot_at.shape[0],) + tuple(conv_state.shape[1:]),
                      dtype=conv_state.dtype, device=z.device)
    if snapshot_at.shape[0]:
        _launch_rows(z, conv_state, out, cu_seqlens.to(torch.int32),
                     has_initial_state.to(torch.int8), snapshot_at, state_slots,
                     out_is_state=False)
    return out


def _slots(state_slots: torch.Tensor | None, conv_state: torch.Tensor) -> torch.Tensor:
    """The slots argument of the kernels (any tensor when there are none: it is not read)."""
    return conv_state if state_slots is None else state_slots.to(torch.int64).contiguous()


def _launch_rows(z: torch.Tensor, conv_state: torch.Tensor, out: torch.Tensor,
                 bounds: torch.Tensor, has_state: torch.Tensor, rows: torch.Tensor,
                 state_slots: torch.Tensor | None, out_is_state: bool) -> None:
    history, num_channels = conv_state.shape[1:]
    block_c = 256
    conv_state_rows_kernel[(rows.shape[0], triton.cdiv(num_channels, block_c))](
        z, conv_state, out, bounds, has_state, rows.to(torch.int64).contiguous(),
        _slots(state_slots, conv_state), z.stride(0),
        C=num_channels, HISTORY=history, BLOCK_H=triton.next_power_of_2(history),
        BLOCK_C=block_c, HAS_SLOTS=state_slots is not None, OUT_IS_STATE=out_is_state,
        num_warps=4,
    )


def _check(z: torch.Tensor, conv_state: torch.Tensor, cu_seqlens: torch.Tensor,
           has_initial_state: torch.Tensor, state_slots: torch.Tensor | None) -> None:
    """Shapes and dtypes only (no host sync)."""
    if z.dim() != 2 or conv_state.dim() != 3 or conv_state.shape[2] != z.shape[1]:
        raise ValueError(f"short_conv_silu: expected z [T, C] and conv_state [N, Kc-1, C] with "
                         f"the same C, got {tuple(z.shape)} and {tuple(conv_state.shape)}")
    if not conv_state.is_contiguous():
        raise ValueError("short_conv_silu (triton): conv_state must be contiguous; gather the "
                         "slots into a contiguous [N, Kc-1, C] tensor first")
    num_requests = conv_state.shape[0] if state_slots is None else state_slots.shape[0]
    if cu_seqlens.shape != (num_requests + 1,):
        raise ValueError(f"short_conv_silu: cu_seqlens must be [N+1] = [{num_requests + 1}], "
                         f"got {tuple(cu_seqlens.shape)}")
    if has_initial_state.shape != (num_requests,) or has_initial_state.dtype != torch.bool:
        raise ValueError(f"short_conv_silu: has_initial_state must be bool [N] = "
                         f"[{num_requests}], got {has_initial_state.dtype} "
                         f"{tuple(has_initial_state.shape)}")
