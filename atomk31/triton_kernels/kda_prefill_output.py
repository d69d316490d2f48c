"""KDA chunked prefill, stage 3: the output, all chunks in parallel (MODEL_SPEC §4.4, chunked
form).

One program per (chunk, head, block of BLOCK_V value channels). From stage 1's ``qg`` and
``aqk`` and stage 2's state before the chunk ``h`` and ``V'``:

    O = qg h + aqk V'

Moving this out of the sequential stage 2 halves the products on its critical path; the
price is writing ``h`` (K x V per chunk and head, in the intermediates' dtype) and ``V'``.
Products as in stage 2: fp32 operands at ``DOT_PRECISION`` (IEEE for fp32 inputs), or
operands in the intermediates' dtype with ``BF16_PRODUCTS``.

Provenance: the split follows flash-linear-attention's chunk_kda (its output kernel is
chunk_gla_fwd_o_gk, fla/ops/gla/chunk.py); the code is ours.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.runtime import dot_precision, runs_on_interpreter


@triton.jit
def kda_prefill_output_kernel(
    # pointers: stage-1 qg [C, H, BT, K], aqk fp32 [C, H, BT, BT]; stage-2 h [C, H, K, V],
    # new_v [C, H, BT, V]; output o [T, H, V]; the chunk table
    qg_ptr, aqk_ptr, h_ptr, new_v_ptr, o_ptr, chunk_start_ptr, chunk_len_ptr,
    stride_o,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BF16_PRODUCTS: tl.constexpr,
):
    i_c, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_k, o_t = tl.arange(0, BLOCK_K), tl.arange(0, BT)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k, m_v = o_k < K, o_v < V
    base = (i_c * H + i_h).to(tl.int64)
    p_rows = (base * BT + o_t)[:, None]
    b_qg = tl.load(qg_ptr + p_rows * K + o_k[None, :], mask=m_k[None, :], other=0.0)
    b_h = tl.load(h_ptr + base * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.0)
    b_aqk = tl.load(aqk_ptr + p_rows * BT + o_t[None, :], mask=o_t[:, None] >= o_t[None, :],
                    other=0.0)
    b_new_v = tl.load(new_v_ptr + p_rows * V + o_v[None, :], mask=m_v[None, :], other=0.0)
    if BF16_PRODUCTS:
        b_o = tl.dot(b_qg, b_h)
        b_o = tl.dot(b_aqk.to(b_new_v.dtype), b_new_v, b_o)
    else:
        b_o = tl.dot(b_qg.to(tl.float32), b_h.to(tl.float32), input_precision=DOT_PRECISION)
        b_o = tl.dot(b_aqk.to(tl.float32), b_new_v.to(tl.float32), b_o,
                     input_precision=DOT_PRECISION)
    t0 = tl.load(chunk_start_ptr + i_c).to(tl.int64)
    length = tl.load(chunk_len_ptr + i_c)
    tl.store(o_ptr + (t0 + o_t)[:, None] * stride_o + i_h * V + o_v[None, :],
             b_o.to(o_ptr.dtype.element_ty), mask=(o_t < length)[:, None] & m_v[None, :])


def kda_prefill_output(
    intra: dict[str, torch.Tensor],
    stage2: dict[str, torch.Tensor],
    o: torch.Tensor,
    chunk_start: torch.Tensor,
    chunk_len: torch.Tensor,
    bf16_products: bool = True,
    block_v: int | None = None,
) -> None:
    """Stage 3: writes o [T, H, V] from intra's qg, aqk and stage2's h, new_v (all [C, H, ...]).
    ``bf16_products`` applies to BF16 intermediates only; ``block_v`` is a tuning knob."""
    num_chunks, num_heads, chunk_size, head_dim = intra["qg"].shape
    value_dim = stage2["new_v"].shape[-1]
    if chunk_start.shape[0] == 0:
        return
    is_wide = intra["qg"].element_size() == 4
    if block_v is None:
        # Chunks x heads already fill the GPU; fp32 tiles need the smaller block for registers.
        block_v = 64 if is_wide else 128
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    bf16_products = (bf16_products and intra["qg"].dtype == torch.bfloat16
                     and not runs_on_interpreter(kda_prefill_output_kernel))
    grid = (chunk_start.shape[0], num_heads, triton.cdiv(value_dim, block_v))
    kda_prefill_output_kernel[grid](
        intra["qg"], intra["aqk"], stage2["h"], stage2["new_v"], o, chunk_start, chunk_len,
        o.stride(0),
        H=num_heads, K=head_dim, V=value_dim, BT=chunk_size,
        BLOCK_K=triton.next_power_of_2(head_dim), BLOCK_V=block_v,
        DOT_PRECISION=dot_precision(kda_prefill_output_kernel, intra["qg"].dtype),
        BF16_PRODUCTS=bf16_products, num_warps=4,
    )
