"""mla_combine in Triton: merge key-split partial MLA outputs by their log-sum-exp.

Split-KV (flash-decoding) runs of `sparse_mla_kernel` leave, per (row, head) and split j, a
normalized partial output out_j [512] and its natural lse_j over the split's keys. The exact
result over the union of the splits is out = sum_j exp(lse_j - lse) out_j with
lse = log sum_j exp(lse_j): the same rule that merges DCP ranks (MODEL_SPEC §4.6). A split
with no valid key has lse_j = -inf and weighs 0; a (row, head) with none at all gets 0, -inf.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def mla_combine_kernel(
    # pointers
    partial_out_ptr, partial_lse_ptr, out_ptr, lse_ptr,
    # sizes
    num_splits,
    # strides (elements)
    stride_partial_row, stride_partial_head, stride_partial_split,
    stride_plse_row, stride_plse_head,
    stride_out_row, stride_out_head, stride_lse_row,
    # meta-parameters
    SPLITS_PAD: tl.constexpr, VALUE_DIM: tl.constexpr,
):
    """One (row, head): weights exp(lse_j - max) over the splits, then the weighted sum."""
    i_row = tl.program_id(0).to(tl.int64)
    i_head = tl.program_id(1)
    o_j = tl.arange(0, SPLITS_PAD)
    m_j = o_j < num_splits
    o_c = tl.arange(0, VALUE_DIM)
    b_lse = tl.load(partial_lse_ptr + i_row * stride_plse_row + i_head * stride_plse_head + o_j,
                    mask=m_j, other=float("-inf"))
    b_max = tl.max(b_lse, axis=0)
    b_shift = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_weight = tl.exp(b_lse - b_shift)
    b_total = tl.sum(b_weight, axis=0)
    b_parts = tl.load(partial_out_ptr + i_row * stride_partial_row
                      + i_head * stride_partial_head + o_j[:, None] * stride_partial_split
                      + o_c[None, :], mask=m_j[:, None], other=0.0)
    b_has_keys = b_total > 0
    b_out = tl.sum(b_parts * b_weight[:, None], axis=0) / tl.where(b_has_keys, b_total, 1.0)
    tl.store(out_ptr + i_row * stride_out_row + i_head * stride_out_head + o_c, b_out)
    tl.store(lse_ptr + i_row * stride_lse_row + i_head,
             tl.where(b_has_keys, b_shift + tl.log(tl.where(b_has_keys, b_total, 1.0)),
                      float("-inf")))


def mla_combine(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor) -> None:
    """Merge partial_out [Nq, H, splits, 512] / partial_lse [Nq, H, splits] (last dims
    contiguous) into out [Nq, H, 512] and lse [Nq, H], in place."""
    num_rows, num_heads, num_splits, value_dim = partial_out.shape
    if num_rows == 0 or num_heads == 0:
        return
    mla_combine_kernel[(num_rows, num_heads)](
        partial_out, partial_lse, out, lse, num_splits,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        SPLITS_PAD=triton.next_power_of_2(num_splits), VALUE_DIM=value_dim, num_warps=4,
    )
