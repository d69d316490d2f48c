"""Attention-residual mixing site in Triton (MODEL_SPEC §4.3), one pass over the candidates.

Contract of ``atomk31/ops/attn_res.py``: per token, softmax over depth of
``(V_b . query) * rsqrt(mean(V_b^2) + eps)``, mix the candidates with those weights, then
``rms_norm(mix, out_weight, eps)``; fp32 math, one rounding to the candidates' dtype.

One program per token reads each candidate row once and keeps an online softmax (running
max, running sum, rescaled accumulator), so the B+1 rows are never stored twice and the
site costs one read of the candidates plus one write: it is memory-bound.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def attn_res_kernel(
    # pointers: candidates [B+1, T, D], query [D], out_weight [D], out [T, D]
    candidates_ptr, query_ptr, out_weight_ptr, out_ptr,
    # sizes and strides
    num_candidates, stride_candidate, stride_token, eps,
    # meta-parameters
    D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_t = tl.program_id(0)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    b_query = tl.load(query_ptr + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_max = tl.full((), float("-inf"), dtype=tl.float32)
    b_sum = tl.zeros((), dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    p_token = candidates_ptr + i_t.to(tl.int64) * stride_token
    for i_b in range(num_candidates):
        b_v = tl.load(p_token + i_b * stride_candidate + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_score = tl.sum(b_v * b_query) * tl.rsqrt(tl.sum(b_v * b_v) / D + eps)
        b_new_max = tl.maximum(b_max, b_score)
        b_rescale = tl.exp(b_max - b_new_max)
        b_weight = tl.exp(b_score - b_new_max)
        b_acc = b_acc * b_rescale + b_weight * b_v
        b_sum = b_sum * b_rescale + b_weight
        b_max = b_new_max
    b_mixed = b_acc / b_sum
    b_out_w = tl.load(out_weight_ptr + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_normed = b_mixed * tl.rsqrt(tl.sum(b_mixed * b_mixed) / D + eps) * b_out_w
    tl.store(out_ptr + i_t.to(tl.int64) * D + o_d, b_normed.to(out_ptr.dtype.element_ty),
             mask=m_d)


def attn_res_triton(
    candidates: torch.Tensor, query: torch.Tensor, out_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """candidates: [B+1, T, D] (last dim dense); query, out_weight: [D] -> [T, D] in
    candidates.dtype."""
    if candidates.dim() != 3 or candidates.shape[0] < 1:
        raise ValueError("attn_res: candidates must be [B+1, T, D] with at least the prefix, "
                         f"got shape {tuple(candidates.shape)}")
    num_candidates, num_tokens, hidden_size = candidates.shape
    for name, vector in (("query", query), ("out_weight", out_weight)):
        if vector.shape != (hidden_size,):
            raise ValueError(f"attn_res: {name} must have shape [{hidden_size}] (D of the "
                             f"candidates), got {tuple(vector.shape)}")
    if candidates.stride(2) != 1:
        candidates = candidates.contiguous()
    out = torch.empty((num_tokens, hidden_size), dtype=candidates.dtype, device=candidates.device)
    if num_tokens:
        block_d = triton.next_power_of_2(hidden_size)
        attn_res_kernel[(num_tokens,)](
            candidates, query.contiguous(), out_weight.contiguous(), out,
            num_candidates, candidates.stride(0), candidates.stride(1), eps,
            D=hidden_size, BLOCK_D=block_d, num_warps=8 if block_d >= 4096 else 4,
        )
    return out
