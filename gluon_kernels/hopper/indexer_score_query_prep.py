"""The Hopper Gluon indexer's query operands (indexer_score_kernel.py) in one Triton launch:
each query head through the keys' quantizer, the codes in FP16 (every e4m3 value is one), the
per-head query scale folded into the head weights.

One launch with no host values, so that it captures in a CUDA graph (it replaced several small
torch kernels); a Triton kernel, so it also runs under the interpreter (the CPU tests).
"""

import torch
import triton
import triton.language as tl

from atomk31.quant.index_keys import FP8_INDEX_AMAX_FLOOR
from atomk31.triton_kernels.kv_write import FP8_MAX, fp8_group_quantize
from gluon_kernels.hopper.indexer_score_work_split import INDEX_DIM


@triton.jit
def query_prep_kernel(
    q_ptr, head_weights_ptr, codes_ptr, weights_ptr,
    num_heads, stride_q_row, stride_q_head, stride_q_d, stride_w_row, stride_w_head,
    HEADS_PAD: tl.constexpr, FP8_MAX_VALUE: tl.constexpr, MIN_AMAX: tl.constexpr,
):
    """One query row (a program): its heads through the keys' quantizer (`fp8_group_quantize`,
    bit-exact with `quantize_index_keys`), codes [HEADS_PAD, 128] as FP16 (exact) and the
    weights x query scales [HEADS_PAD] fp32; padded heads get zero codes and
    zero weights."""
    row = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, HEADS_PAD)
    o_d = tl.arange(0, 128)
    m_h = o_h < num_heads
    x = tl.load(q_ptr + row * stride_q_row + o_h[:, None] * stride_q_head
                + o_d[None, :] * stride_q_d, mask=m_h[:, None], other=0.0).to(tl.float32)
    values, scale = fp8_group_quantize(x, FP8_MAX_VALUE, MIN_AMAX)
    w = tl.load(head_weights_ptr + row * stride_w_row + o_h * stride_w_head, mask=m_h,
                other=0.0).to(tl.float32)
    tl.store(codes_ptr + (row * HEADS_PAD + o_h[:, None]) * 128 + o_d[None, :],
             values.to(codes_ptr.dtype.element_ty))
    tl.store(weights_ptr + row * HEADS_PAD + o_h, tl.where(m_h, w * scale, 0.0))


def prepare_queries(q: torch.Tensor, head_weights: torch.Tensor,
                    heads_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's query operands in one launch (CUDA-graph friendly: no host values):
    codes [Nq, heads_pad, 128] FP16, bit-exact with `quantize_index_keys(q, "fp8", "e4m3fn")`,
    and the head weights x query scales [Nq, heads_pad] fp32 (zero past H_I). A Triton
    kernel: runs under the interpreter too."""
    num_rows, num_heads = q.shape[0], q.shape[1]
    codes = torch.empty(num_rows, heads_pad, INDEX_DIM.value, dtype=torch.float16,
                        device=q.device)
    weights = torch.empty(num_rows, heads_pad, dtype=torch.float32, device=q.device)
    if num_rows:
        query_prep_kernel[(num_rows,)](
            q, head_weights, codes, weights, num_heads, q.stride(0), q.stride(1), q.stride(2),
            head_weights.stride(0), head_weights.stride(1), HEADS_PAD=heads_pad,
            FP8_MAX_VALUE=FP8_MAX[torch.float8_e4m3fn], MIN_AMAX=FP8_INDEX_AMAX_FLOOR,
            num_warps=4)
    return codes, weights
