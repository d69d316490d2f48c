"""Latent-MoE routing in Triton, and the sort of (token, slot) pairs by expert that the grouped
GEMMs read (MODEL_SPEC §4.7).

``moe_route``: contract of ``atomk31/ops/moe.py``. The router logits are one GEMM
(``x.float() @ router_weight.float().T``, fp32 as §8 #13 requires, left to cuBLAS); the
kernel then does, per token: sigmoid, + correction bias (selection only), top-k by repeated
arg-max (ties -> lower expert id), weights from the unbiased scores, renormalisation
(``/ (sum + 1e-20)``) and the routed scaling factor.

``sort_pairs_by_expert``: the T*k (token, slot) pairs grouped by expert, each expert's group
padded to a multiple of ``block_m`` rows, so that a grouped-GEMM program owns ``block_m``
rows of one expert. Built from device-side torch ops only (no host sync, CUDA-graph safe):
the grid is sized by the worst case and programs past the last used block exit at once.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# §4.7 / §8 #11: the renormalisation's epsilon.
RENORMALIZE_EPS = tl.constexpr(1e-20)


@triton.jit
def moe_route_kernel(
    # pointers: logits fp32 [T, E], bias [E], weights fp32 [T, k], ids int32 [T, k]
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    # scalars
    scaling_factor,
    # meta-parameters
    E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_e, o_k = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_K)
    m_e = o_e < E
    b_scores = tl.sigmoid(tl.load(logits_ptr + i_t * E + o_e, mask=m_e, other=0.0))
    b_bias = tl.load(bias_ptr + o_e, mask=m_e, other=0.0).to(tl.float32)
    b_biased = tl.where(m_e, b_scores + b_bias, float("-inf"))
    b_weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        b_best = tl.max(b_biased, axis=0)
        # Lowest id among the maxima: ties go to the lower expert id (§4.7).
        b_id = tl.min(tl.where(b_biased == b_best, o_e, BLOCK_E), axis=0)
        b_weight = tl.sum(tl.where(o_e == b_id, b_scores, 0.0), axis=0)
        b_weights = tl.where(o_k == j, b_weight, b_weights)
        b_ids = tl.where(o_k == j, b_id, b_ids)
        b_biased = tl.where(o_e == b_id, float("-inf"), b_biased)
    if RENORMALIZE:
        b_weights = b_weights / (tl.sum(b_weights, axis=0) + RENORMALIZE_EPS)
    m_k = o_k < TOP_K
    tl.store(weights_ptr + i_t * TOP_K + o_k, b_weights * scaling_factor, mask=m_k)
    tl.store(ids_ptr + i_t * TOP_K + o_k, b_ids, mask=m_k)


def moe_route_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, D]; router_weight: [E, D]; correction_bias: [E]
    -> (topk_weights fp32 [T, k], topk_ids int32 [T, k]), ids in descending biased score."""
    num_experts = router_weight.shape[0]
    if x.dim() != 2 or router_weight.shape != (num_experts, x.shape[1]):
        raise ValueError(f"moe_route: expected x [T, D] and router_weight [E, D], got "
                         f"{tuple(x.shape)} and {tuple(router_weight.shape)}")
    if correction_bias.shape != (num_experts,):
        raise ValueError(f"moe_route: correction_bias must be [E] = [{num_experts}], "
                         f"got {tuple(correction_bias.shape)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"moe_route: top_k must be in 1..{num_experts} (E), got {top_k}")
    num_tokens = x.shape[0]
    logits = (x.float() @ router_weight.float().T).contiguous()           # fp32 (§8 #13)
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=x.device)
    if num_tokens:
        moe_route_kernel[(num_tokens,)](
            logits, correction_bias.float().contiguous(), weights, ids, scaling_factor,
            E=num_experts, TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, num_warps=4,
        )
    return weights, ids


@dataclass(frozen=True)
class ExpertBlocks:
    """(token, slot) pairs grouped by expert in blocks of ``block_m`` rows.

    pair_ids: int32 [num_blocks_max * block_m], the flat pair index t*k + j of each row, or
    T*k for a padding row; block_expert: int32 [num_blocks_max], each block's expert (E for
    a block past the last used one).
    """

    pair_ids: torch.Tensor
    block_expert: torch.Tensor
    block_m: int

    @property
    def num_blocks_max(self) -> int:
        return self.block_expert.shape[0]


def sort_pairs_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Group the pairs of topk_ids [T, k] by expert, each group padded to block_m rows."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    device = flat.device
    # Worst case: every used expert wastes up to block_m - 1 rows.
    num_blocks_max = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    blocks = (counts + block_m - 1) // block_m
    block_end = blocks.cumsum(0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    group_start = counts.cumsum(0) - counts                       # first sorted pair of each expert
    rank = torch.arange(num_pairs, device=device) - group_start[sorted_experts]
    rows = (block_end - blocks)[sorted_experts] * block_m + rank
    pair_ids = torch.full((num_blocks_max * block_m,), num_pairs, dtype=torch.int32, device=device)
    pair_ids[rows] = order.to(torch.int32)
    block_expert = torch.searchsorted(block_end, torch.arange(num_blocks_max, device=device),
                                      right=True).to(torch.int32)
    return ExpertBlocks(pair_ids, block_expert, block_m)
