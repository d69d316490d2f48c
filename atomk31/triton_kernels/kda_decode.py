"""KDA token-by-token recurrence in Triton: one decode step, and the speculative verify
(MODEL_SPEC §4.4 recurrence, §5.7 states after each row).

Contracts are those of ``atomk31/ops/kda.py`` (``kda_decode``, ``kda_verify``): raw q/k
(l2-normalised here, eps 1e-6, q times ``scale``), log-decay g fp32, sigmoided beta fp32,
state ``[N, H, K, V]`` fp32 key-major.

One program owns one (request, head, block of BLOCK_V value channels) and keeps that
``[K, BLOCK_V]`` slice of the state in registers: the decode step reads and writes each state
byte once, which is the whole cost of the op (64 KiB per head), so the kernel is bound by
memory bandwidth. The verify variant runs its Tq rows in the same program and writes the
state after every row.

Provenance: the program layout follows flash-linear-attention's ``fused_recurrent_kda``
(fla-org/flash-linear-attention, fla/ops/kda/fused_recurrent.py); the code is ours.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# §9 #3: the KDA l2 norms of q and k use 1e-6.
L2_NORM_EPS = tl.constexpr(1e-6)
# Programs per step below which a program takes 32 value channels instead of 64: small
# batches need more programs to keep the memory system busy.
SMALL_BATCH_PROGRAMS = 2048


@dataclass(frozen=True)
class KdaRecurrentConfig:
    """Value channels per program (``block_v``; None: 32 below SMALL_BATCH_PROGRAMS
    (request, head) pairs, else 64)."""

    block_v: int | None = None


@triton.jit
def kda_recurrent_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,       # [N, Tq, H, K|V], beta [N, Tq, H]
    state_ptr,                                   # [N | S, H, K, V] fp32, the state before row 0
    slots_ptr,                                   # [N] int64: request n's state row (HAS_SLOTS)
    o_ptr,                                       # [N, Tq, H, V]
    states_out_ptr,                              # [N, Tq, H, K, V] or the state itself (decode)
    # sizes
    num_rows, scale,
    # meta-parameters
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    STORE_EVERY_ROW: tl.constexpr,               # verify: state after each row; decode: last
    HAS_SLOTS: tl.constexpr,                     # the state is a pool indexed by slots_ptr
):
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_k = tl.arange(0, BLOCK_K)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    i_state = tl.load(slots_ptr + i_n).to(tl.int64) if HAS_SLOTS else i_n.to(tl.int64)
    p_state = state_ptr + (i_state * H + i_h) * K * V
    b_state = tl.load(p_state + o_kv, mask=m_kv, other=0.0)
    for i_t in range(num_rows):
        row = (i_n * num_rows + i_t).to(tl.int64) * H + i_h        # index of (n, t, h)
        b_q = tl.load(q_ptr + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v_ptr + row * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_beta = tl.load(beta_ptr + row).to(tl.float32)
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + L2_NORM_EPS) * scale
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + L2_NORM_EPS)
        b_state = b_state * tl.exp(b_g)[:, None]                       # 1. decay rows
        b_error = b_beta * (b_v - tl.sum(b_k[:, None] * b_state, axis=0))   # 2. delta error
        b_state = b_state + b_k[:, None] * b_error[None, :]            # 3. rank-1 write
        b_o = tl.sum(b_q[:, None] * b_state, axis=0)                   # 4. read after write
        tl.store(o_ptr + row * V + o_v, b_o.to(o_ptr.dtype.element_ty), mask=m_v)
        if STORE_EVERY_ROW:
            tl.store(states_out_ptr + row * K * V + o_kv, b_state, mask=m_kv)
    if not STORE_EVERY_ROW:
        tl.store(states_out_ptr + (i_state * H + i_h) * K * V + o_kv, b_state, mask=m_kv)


def _launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, states_out: torch.Tensor, o: torch.Tensor, num_rows: int, scale: float,
    store_every_row: bool, config: KdaRecurrentConfig | None,
    state_slots: torch.Tensor | None = None,
) -> None:
    _, num_heads, head_dim, value_dim = state.shape
    num_requests = q.shape[0]
    block_v = config.block_v if config is not None else None
    if block_v is None:
        block_v = 32 if num_requests * num_heads < SMALL_BATCH_PROGRAMS else 64
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    grid = (num_requests, num_heads, triton.cdiv(value_dim, block_v))
    if num_requests == 0 or num_rows == 0:
        return
    slots = state_slots if state_slots is not None else state  # (unread without slots)
    kda_recurrent_kernel[grid](
        q, k, v, g, beta, state, slots, o, states_out, num_rows, scale,
        H=num_heads, K=head_dim, V=value_dim,
        BLOCK_K=triton.next_power_of_2(head_dim), BLOCK_V=block_v,
        STORE_EVERY_ROW=store_every_row, HAS_SLOTS=state_slots is not None, num_warps=4,
    )


def kda_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    state_slots: torch.Tensor | None = None,
    config: KdaRecurrentConfig | None = None,
) -> torch.Tensor:
    """One decode step per request; the state is updated in place: ``state`` [N, H, K, V]
    fp32, or with ``state_slots`` (int64 [N], distinct) the rows ``state_slots`` of the pool
    ``state`` [S, H, K, V].

    q, k, g: [N, H, K]; v: [N, H, V]; beta: [N, H] -> o [N, H, V] in v.dtype.
    """
    _check_recurrent_inputs("kda_decode", (q, k, v, g, beta), state, leading=q.shape[:1],
                            pooled=state_slots is not None)
    o = torch.empty_like(v)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    # Each program reads its own [K, BLOCK_V] slice before it writes it back, so the state
    # can be its own output.
    _launch(q, k, v, g, beta, state, state, o, 1, scale, store_every_row=False, config=config,
            state_slots=None if state_slots is None else state_slots.contiguous())
    return o


def kda_verify_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    config: KdaRecurrentConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tq steps per request from ``state`` (left untouched).

    q, k, g: [N, Tq, H, K]; v: [N, Tq, H, V]; beta: [N, Tq, H]; state: [N, H, K, V] fp32
    -> (o [N, Tq, H, V] in v.dtype, states_after_each fp32 [N, Tq, H, K, V]).
    """
    if q.dim() != 4:
        raise ValueError(f"kda_verify: q must be [N, Tq, H, K], got shape {tuple(q.shape)}")
    _check_recurrent_inputs("kda_verify", (q, k, v, g, beta), state, leading=q.shape[:2])
    num_requests, num_rows = q.shape[:2]
    o = torch.empty_like(v)
    states_after_each = torch.empty((num_requests, num_rows) + tuple(state.shape[1:]),
                                    dtype=torch.float32, device=state.device)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    _launch(q, k, v, g, beta, state, states_after_each, o, num_rows, scale,
            store_every_row=True, config=config)
    return o, states_after_each


def _check_recurrent_inputs(
    op: str, inputs: tuple[torch.Tensor, ...], state: torch.Tensor, leading: torch.Size,
    pooled: bool = False,
) -> None:
    """Shapes and dtypes only: no value checks, so decode never synchronises with the host."""
    if state.dim() != 4 or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"{op}: state must be a contiguous fp32 [N, H, K, V] tensor, got "
                         f"{state.dtype} {tuple(state.shape)} (contiguous={state.is_contiguous()})")
    _, num_heads, head_dim, value_dim = state.shape
    q, k, v, g, beta = inputs
    expected = {"q": (*leading, num_heads, head_dim), "k": (*leading, num_heads, head_dim),
                "v": (*leading, num_heads, value_dim), "g": (*leading, num_heads, head_dim),
                "beta": (*leading, num_heads)}
    arrived = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, shape in expected.items():
        if tuple(arrived[name].shape) != shape:
            raise ValueError(f"{op}: {name} must have shape {list(shape)} to match state "
                             f"{list(state.shape)}, got {list(arrived[name].shape)}")
    if not pooled and leading[0] != state.shape[0]:
        raise ValueError(f"{op}: state has N={state.shape[0]} requests, inputs have {leading[0]}")
