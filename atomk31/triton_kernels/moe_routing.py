"""Latent-MoE routing in Triton, and the sort of (token, slot) pairs by expert that the grouped
GEMMs read (MODEL_SPEC §4.7).

``moe_route``: contract of ``atomk31/ops/moe.py``. The router logits are fp32 (§8 #13), formed
one of three ways (``RouteConfig.logits``; the default by token count):
* "split" (NVIDIA, up to SPLIT_ROUTER_MAX_TOKENS tokens): ``moe_router_logits_kernel`` spreads
  the logits over E / 4 programs per token, then the top-k kernel reads them: two launches, but
  the router weight is read by many SMs at once instead of by one program per token;
* "fused" (up to FUSED_ROUTER_MAX_TOKENS tokens): the top-k kernel computes them itself (one
  launch: reading the router weight beats three launches of cast, cuBLAS GEMM and kernel);
* "gemm" (above): one cuBLAS GEMM (``x.float() @ router_weight.float().T``).
AMD keeps "fused" at few tokens (the split router was measured on NVIDIA only; figures:
benchmarks/NOTES.md, "MoE routing"). ``moe_route_kernel`` then does, per token: sigmoid, + correction bias (selection only), top-k by repeated
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
# Up to this many tokens the routing kernel computes the router logits itself (every program
# reads the whole router weight, E x D fp32: from L2 after the first).
FUSED_ROUTER_MAX_TOKENS = 64


@triton.jit
def _router_logits(x_ptr, router_ptr, i_t, e0, stride_x, E: tl.constexpr, D: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """fp32 logits [BLOCK_E] of token i_t for experts e0..e0+BLOCK_E-1: x[i_t] .
    router_weight[e] (fp32 products)."""
    o_e, o_d = e0 + tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D)
    m_e = o_e < E
    b_acc = tl.zeros([BLOCK_E, BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        m_d = d0 + o_d < D
        b_x = tl.load(x_ptr + i_t * stride_x + d0 + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_w = tl.load(router_ptr + o_e.to(tl.int64)[:, None] * D + (d0 + o_d)[None, :],
                      mask=m_e[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_acc += b_w * b_x[None, :]
    return tl.sum(b_acc, axis=1)


@triton.jit
def moe_route_kernel(
    # pointers: logits fp32 [T, E] (or x [T, D] and router weight [E, D] when FUSED),
    # bias [E], weights fp32 [T, k], ids int32 [T, k]
    logits_ptr, x_ptr, router_ptr, bias_ptr, weights_ptr, ids_ptr,
    # scalars
    scaling_factor, stride_x,
    # meta-parameters
    E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RENORMALIZE: tl.constexpr, FUSED: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_e, o_k = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_K)
    m_e = o_e < E
    if FUSED:
        b_logits = _router_logits(x_ptr, router_ptr, i_t, 0, stride_x, E, D, BLOCK_E, BLOCK_D)
    else:
        b_logits = tl.load(logits_ptr + i_t * E + o_e, mask=m_e, other=0.0)
    b_scores = tl.sigmoid(b_logits)
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


@triton.jit
def moe_router_logits_kernel(x_ptr, router_ptr, logits_ptr, stride_x, E: tl.constexpr,
                             D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """logits fp32 [T, E]: program (t, j) computes experts j BLOCK_E .. (j+1) BLOCK_E - 1 of
    token t, so the router weight is read by many SMs at once (split_router)."""
    i_t, e0 = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK_E
    b_logits = _router_logits(x_ptr, router_ptr, i_t, e0, stride_x, E, D, BLOCK_E, BLOCK_D)
    o_e = e0 + tl.arange(0, BLOCK_E)
    tl.store(logits_ptr + i_t * E + o_e, b_logits, mask=o_e < E)


# "split": experts per program of moe_router_logits_kernel (64 experts: 16 programs).
SPLIT_ROUTER_EXPERTS = 4
# Up to this many tokens on NVIDIA the split router replaces the fused one.
SPLIT_ROUTER_MAX_TOKENS = 16
ROUTER_LOGITS = ("split", "fused", "gemm")


@dataclass(frozen=True)
class RouteConfig:
    """How the router logits are formed: one of ROUTER_LOGITS (module docstring); None: the
    default for the call's token count."""

    logits: str | None = None


def default_router_logits(num_tokens: int, device: torch.device) -> str:
    if num_tokens <= SPLIT_ROUTER_MAX_TOKENS and device.type == "cuda" and \
            torch.version.hip is None:
        return "split"
    return "fused" if num_tokens <= FUSED_ROUTER_MAX_TOKENS else "gemm"


def moe_route_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scaling_factor: float,
    config: RouteConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, D]; router_weight: [E, D]; correction_bias: [E]
    -> (topk_weights fp32 [T, k], topk_ids int32 [T, k]), ids in descending biased score
    (contract and argument check: ops/moe.py). ``config``: how the logits are formed."""
    num_experts = router_weight.shape[0]
    num_tokens, hidden_size = x.shape
    logits_by = (config.logits if config is not None else None) or \
        default_router_logits(num_tokens, x.device)
    if logits_by not in ROUTER_LOGITS:
        raise ValueError(f"moe_route: RouteConfig.logits must be one of {ROUTER_LOGITS}, got "
                         f"{logits_by!r}")
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=x.device)
    if not num_tokens:
        return weights, ids
    block_e = triton.next_power_of_2(num_experts)
    if logits_by == "gemm":
        logits = (x.float() @ router_weight.float().T).contiguous()       # fp32 (§8 #13)
    else:
        x = x if x.stride(-1) == 1 else x.contiguous()
        router_weight = router_weight.contiguous()
        logits = weights                                   # not read when fused
    if logits_by == "split":
        logits = torch.empty((num_tokens, num_experts), dtype=torch.float32, device=x.device)
        moe_router_logits_kernel[(num_tokens, triton.cdiv(num_experts, SPLIT_ROUTER_EXPERTS))](
            x, router_weight, logits, x.stride(0), E=num_experts, D=hidden_size,
            BLOCK_E=SPLIT_ROUTER_EXPERTS, BLOCK_D=min(triton.next_power_of_2(hidden_size), 1024),
            num_warps=4)
    fused = logits_by == "fused"
    moe_route_kernel[(num_tokens,)](
        logits, x, router_weight, correction_bias.float().contiguous(), weights, ids,
        scaling_factor, x.stride(0),
        E=num_experts, TOP_K=top_k, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
        RENORMALIZE=renormalize, FUSED=fused, D=hidden_size,
        # [BLOCK_E, BLOCK_D] fp32 partial products: 32 per thread at 8 warps.
        BLOCK_D=max(16, min(triton.next_power_of_2(hidden_size), 8192 // block_e)),
        num_warps=8 if fused else 4,
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
