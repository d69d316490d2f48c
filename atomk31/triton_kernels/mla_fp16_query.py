"""mla_fp16_query in Triton: absorbed MLA queries scaled into FP16's range for FP16 products.

Over an FP8 (e4m3) latent, `sparse_mla_kernel` can run its products in FP16 instead of BF16:
e4m3 values are exact in FP16 and convert in one instruction per two values (BF16 takes one
more per value). Queries arrive in BF16 (or FP16), whose range FP16 lacks, so each query vector
is scaled by a power of two 2^e that brings its largest |element| into [2^14, 2^15); the
scores are multiplied back by 2^-e in fp32. Both factors are exact (built from exponent bits).
A BF16 element (8-bit significand) stays exact in FP16 down to 2^-17 after scaling (FP16's
subnormal spacing is 2^-24), i.e. down to 2^-31 of the vector's largest; smaller ones round
to that grid, an absolute error of at most 2^-39 of the largest: far below the products' fp32
accumulation error.
"""

import torch
import triton
import triton.language as tl

LATENT_DIM = 576


@triton.jit
def mla_fp16_query_kernel(
    # pointers
    q_ptr, q16_ptr, unscale_ptr,
    # strides (elements)
    stride_q_row, stride_q_head, stride_q16_row, stride_q16_head,
    # meta-parameters
    DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One query vector (row, head): q16 = q * 2^e in FP16, unscale = 2^-e."""
    i_row = tl.program_id(0).to(tl.int64)
    i_head = tl.program_id(1)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < DIM
    b_q = tl.load(q_ptr + i_row * stride_q_row + i_head * stride_q_head + o_d, mask=m_d,
                  other=0.0).to(tl.float32)
    b_amax = tl.max(tl.abs(b_q), axis=0)
    b_exponent = ((b_amax.to(tl.int32, bitcast=True) >> 23) & 255) - 127  # floor(log2 amax)
    b_e = tl.minimum(tl.maximum(14 - b_exponent, -126), 126)  # amax = 0: any e will do
    b_scale = ((b_e + 127) << 23).to(tl.float32, bitcast=True)
    b_unscale = ((127 - b_e) << 23).to(tl.float32, bitcast=True)
    tl.store(q16_ptr + i_row * stride_q16_row + i_head * stride_q16_head + o_d,
             (b_q * b_scale).to(tl.float16), mask=m_d)
    tl.store(unscale_ptr + i_row * tl.num_programs(1) + i_head, b_unscale)


def mla_fp16_query(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Nq, H, 576] (bf16 / fp16, last dim contiguous) -> (q16 [Nq, H, 576] fp16,
    unscale [Nq, H] fp32) with q = q16 * unscale[..., None] up to the rounding above."""
    num_rows, num_heads, dim = q.shape
    q16 = torch.empty(num_rows, num_heads, dim, dtype=torch.float16, device=q.device)
    unscale = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
    if num_rows == 0 or num_heads == 0:
        return q16, unscale
    mla_fp16_query_kernel[(num_rows, num_heads)](
        q, q16, unscale, q.stride(0), q.stride(1), q16.stride(0), q16.stride(1),
        DIM=dim, BLOCK_D=triton.next_power_of_2(dim), num_warps=4)
    return q16, unscale
