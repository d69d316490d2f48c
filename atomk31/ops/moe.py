"""Latent-MoE routing and routed experts (MODEL_SPEC §4.7, §3.3).

Contracts (T = tokens, D = hidden size, E = routed experts, k = top_k, Dl = latent width
``routed_expert_hidden_size``, F = ``moe_intermediate_size``):

* ``moe_route(x [T, D], router_weight [E, D], correction_bias [E], top_k, renormalize,
  scaling_factor) -> (topk_weights fp32 [T, k], topk_ids int32 [T, k])``.
  Scores ``sigmoid(x @ router_weight.T)`` in fp32 (fp32 logits, §8 #13); the correction bias
  steers the selection only; ties between equal biased scores go to the lower expert id;
  weights are the unbiased scores of the chosen experts, divided by ``sum + 1e-20`` when
  ``renormalize`` and always multiplied by ``scaling_factor`` (§9 #11). ``topk_ids[t]`` is in
  descending order of biased score.
* ``moe_experts_mxfp4(z [T, Dl], topk_weights [T, k], topk_ids [T, k], w13_packed uint8
  [E, 2F, Dl/2], w13_scales uint8 [E, 2F, Dl/32], w2_packed uint8 [E, Dl, F/2], w2_scales
  uint8 [E, Dl, F/32], beta, linear_beta) -> u fp32 [T, Dl]``:
  ``u[t] = sum_j topk_weights[t, j] * W2_e (situ_glu(W1_e z_t, W3_e z_t))`` with
  ``e = topk_ids[t, j]``. ``w13`` fuses gate (rows 0..F-1 = ``w1``) over up (rows F..2F-1 =
  ``w3``); MXFP4 per §3.3 (low nibble = even input index, one E8M0 scale per 32 inputs).
  ``one_factor_exact`` (default False): a promise about the weights, not a choice of result:
  True only when ``mxfp4_scales_allow_one_factor(w13_scales, w2_scales)`` (computed once per
  layer when the weights are loaded, never per call). The BF16 kernels then decode each
  weight pair with one multiply instead of two, to the same weights (see below).
* ``moe_experts_dense(z, topk_weights, topk_ids, w13 [E, 2F, Dl], w2 [E, Dl, F], beta,
  linear_beta) -> u fp32 [T, Dl]``: the same for a dequantized (BF16 or fp32) checkpoint.

One-multiply decode (DECIDED HERE): the BF16 Triton kernels build a weight as
E2M1 * 2^-126 (a BF16 subnormal for code 0.5) and scale it by the E8M0 factor 2^(s-127). Two
exact BF16 multiplies (by 2^126, then by 2^(s-127)) work for every byte; one multiply by
2^(s-1-64) gives the weight times 2^-64 (undone on the fp32 accumulator) and is exact only
when the factor is a BF16 (s <= 192) and the weight's lowest bit, 0.5 * 2^(s-127) * 2^-64,
is no finer than BF16's smallest subnormal 2^-133 (s >= 59). Byte 0 (the quantizer's byte
for an all-zero block) gives 0 in both decodes (2^-127 flushes: the kernels' documented
treatment), so it is allowed too. In that range the decoded weights are the two-multiply
decode's, bit for bit; the products a * w then carry the 2^-64, so one smaller than 2^-62 in
magnitude lands in fp32's subnormal range (it keeps its bits down to 2^-149, or is flushed if
the tensor cores flush): at most 2^-62 absolute per product, far below the fp32
accumulator's own rounding for any output above ~2^-26. A block quantized by
``quantize_mxfp4`` is in range when its largest magnitude lies in [2^-66, 2^67) or is 0 (random
weights of scale 0.05: bytes near 120). fp32 activations always take the two-multiply decode
(float32 exactness), and so does every backend without the word decode.

Accumulation: every matmul and the weighted sum over the k experts in fp32. The SiTU-GLU
output is rounded to ``z.dtype`` before the down projection (the engine stores activations
as BF16, §4.8; exact fp32 when z is fp32). The torch implementation groups the (token, slot)
pairs by expert and dequantizes each used expert once. The routed sum is returned before
``routed_expert_norm`` (under TP it must be all-reduced first, §4.7). Tests: fp32 within
1e-5 relative of a per-token loop; routing ids exact.

Shape classes of ``moe_experts_mxfp4`` (by the call's shapes: T tokens, k slots, E experts;
the measurements behind them: benchmarks/NOTES.md, "MoE"):
* ``few_tokens`` (T <= 64, decode): weight-streaming GEMVs, bound by reading each used
  expert's weights once (moe_gemv.py; the word decode on NVIDIA with BF16 activations);
* ``small_groups`` (T > 64, at most 32 pairs per expert on average): the grouped GEMMs in
  16- or 32-pair blocks, byte decode;
* ``large_groups`` (more than 32 pairs per expert: 128-pair blocks, prefill): the grouped GEMMs
  with the word decode on NVIDIA with BF16 activations, else the byte decode.
FlyDSL (gfx950) serves every class.
"""

from collections.abc import Callable

import torch

from atomk31.ops.activation import situ_glu_torch
from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import READS_DEVICE, all_of, needs_compute, needs_gpu, needs_rocm
from atomk31.ops.target import KernelContext
from atomk31.quant import dequantize_mxfp4

# §4.7: the renormalisation's epsilon (DEFINED HERE in §8 #11).
RENORMALIZE_EPS = 1e-20
# E8M0 scale bytes for which the one-multiply decode is exact (see the module docstring):
# 59..192 for the kernels' shift of 64 (moe_mxfp4_decode.ONE_FACTOR_SHIFT: SHIFT - 5 ..
# 128 + SHIFT), and byte 0, which both decodes turn into 0.
ONE_FACTOR_SCALE_BYTES = (59, 192)


def moe_route_torch(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid router with bias-corrected top-k. x: [T, D] -> (weights fp32 [T, k], ids int32 [T, k])."""
    check_moe_route(x, router_weight, correction_bias, top_k)
    scores = torch.sigmoid(x.float() @ router_weight.float().T)              # [T, E]
    biased = scores + correction_bias.float()
    # A stable descending sort keeps equal scores in id order: ties go to the lower id (§4.7).
    order = torch.sort(biased, dim=-1, descending=True, stable=True).indices
    topk_ids = order[:, :top_k]
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + RENORMALIZE_EPS)
    return topk_weights * scaling_factor, topk_ids.to(torch.int32)


def check_moe_route(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor,
                    top_k: int, *args, **kwargs) -> None:
    """The host-side argument check of `moe_route` (shapes only)."""
    num_experts = router_weight.shape[0]
    if x.dim() != 2 or router_weight.shape != (num_experts, x.shape[1]):
        raise ValueError(
            f"moe_route: expected x [T, D] and router_weight [E, D], got {tuple(x.shape)} "
            f"and {tuple(router_weight.shape)}"
        )
    if correction_bias.shape != (num_experts,):
        raise ValueError(
            f"moe_route: correction_bias must be [E] = [{num_experts}], "
            f"got {tuple(correction_bias.shape)}"
        )
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"moe_route: top_k must be in 1..{num_experts} (E), got {top_k}")


def mxfp4_scales_allow_one_factor(*scales: torch.Tensor) -> bool:
    """Whether every E8M0 byte of the given scale tensors is 0 or in ONE_FACTOR_SCALE_BYTES:
    the ``one_factor_exact`` promise of ``moe_experts_mxfp4``. One reduction and one host
    sync per tensor: call it once when the weights are loaded, never per step."""
    low, high = ONE_FACTOR_SCALE_BYTES
    for tensor in scales:
        if tensor.dtype != torch.uint8:
            raise ValueError(f"mxfp4_scales_allow_one_factor: expected uint8 E8M0 scale "
                             f"bytes, got {tensor.dtype}")
        outside = (tensor != 0) & ((tensor < low) | (tensor > high))
        if bool(outside.any()):
            return False
    return True


def moe_experts_mxfp4_torch(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scales: torch.Tensor,
    beta: float,
    linear_beta: float | None,
    one_factor_exact: bool = False,
) -> torch.Tensor:
    """Routed experts from MXFP4 weights. z: [T, Dl] -> u fp32 [T, Dl] (see module docstring).

    one_factor_exact: the weights' promise (module docstring); this exact fp32 dequantization
    needs no such promise and ignores it."""
    check_moe_experts_mxfp4(z, topk_weights, topk_ids, w13_packed, w13_scales, w2_packed,
                            w2_scales)
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size = 2 * half_latent

    def expert_weights(e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (dequantize_mxfp4(w13_packed[e], w13_scales[e]),
                dequantize_mxfp4(w2_packed[e], w2_scales[e]))

    return _run_experts(z, topk_weights, topk_ids, num_experts, latent_size,
                        expert_weights, beta, linear_beta, "moe_experts_mxfp4")


def check_moe_experts_mxfp4(z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                            w13_packed: torch.Tensor, w13_scales: torch.Tensor,
                            w2_packed: torch.Tensor, w2_scales: torch.Tensor,
                            *args, **kwargs) -> None:
    """The host-side argument check of `moe_experts_mxfp4` (shapes and dtypes; the expert ids'
    range is not checked: that would read the device)."""
    num_experts, two_f, half_latent = w13_packed.shape
    latent_size, intermediate_size = 2 * half_latent, two_f // 2
    expected = {
        "w13_packed": (num_experts, 2 * intermediate_size, latent_size // 2),
        "w13_scales": (num_experts, 2 * intermediate_size, latent_size // 32),
        "w2_packed": (num_experts, latent_size, intermediate_size // 2),
        "w2_scales": (num_experts, latent_size, intermediate_size // 32),
    }
    arrived = {"w13_packed": w13_packed, "w13_scales": w13_scales,
               "w2_packed": w2_packed, "w2_scales": w2_scales}
    for name, shape in expected.items():
        if tuple(arrived[name].shape) != shape or arrived[name].dtype != torch.uint8:
            raise ValueError(
                f"moe_experts_mxfp4: {name} must be uint8 {list(shape)} for E={num_experts}, "
                f"F={intermediate_size}, Dl={latent_size}; got {arrived[name].dtype} "
                f"{list(arrived[name].shape)}"
            )
    if latent_size % 32 or intermediate_size % 32 or two_f % 2:
        raise ValueError(
            f"moe_experts_mxfp4: Dl and F must be multiples of 32 (MXFP4 blocks), "
            f"got Dl={latent_size}, F={intermediate_size}"
        )
    _check_routed(z, topk_weights, topk_ids, latent_size, "moe_experts_mxfp4")


def moe_experts_dense_torch(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    beta: float,
    linear_beta: float | None,
) -> torch.Tensor:
    """Routed experts from dequantized weights. w13: [E, 2F, Dl]; w2: [E, Dl, F] -> fp32 [T, Dl]."""
    num_experts, two_f, latent_size = w13.shape
    if two_f % 2 or w2.shape != (num_experts, latent_size, two_f // 2):
        raise ValueError(
            f"moe_experts_dense: expected w13 [E, 2F, Dl] and w2 [E, Dl, F], got "
            f"{tuple(w13.shape)} and {tuple(w2.shape)}"
        )

    def expert_weights(e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return w13[e].float(), w2[e].float()

    return _run_experts(z, topk_weights, topk_ids, num_experts, latent_size,
                        expert_weights, beta, linear_beta, "moe_experts_dense")


def _run_experts(
    z: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    latent_size: int,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    beta: float,
    linear_beta: float | None,
    op: str,
) -> torch.Tensor:
    """Group (token, slot) pairs by expert; run each used expert once on its tokens."""
    _check_routed(z, topk_weights, topk_ids, latent_size, op)
    num_tokens = z.shape[0]
    out = torch.zeros(num_tokens, latent_size, dtype=torch.float32, device=z.device)
    if topk_ids.numel() == 0:
        return out
    flat_ids = topk_ids.reshape(-1).long()
    low, high = int(flat_ids.min()), int(flat_ids.max())
    if low < 0 or high >= num_experts:
        raise ValueError(f"{op}: topk_ids must be in 0..{num_experts - 1}, got {low}..{high}")
    flat_weights = topk_weights.reshape(-1).float()
    top_k = topk_ids.shape[1]
    token_of_slot = torch.arange(num_tokens, device=z.device).repeat_interleave(top_k)
    slots_by_expert = torch.argsort(flat_ids, stable=True)
    experts, counts = torch.unique_consecutive(flat_ids[slots_by_expert], return_counts=True)
    start = 0
    for expert, count in zip(experts.tolist(), counts.tolist()):
        slots = slots_by_expert[start:start + count]
        start += count
        tokens = token_of_slot[slots]
        w13, w2 = expert_weights(expert)                       # [2F, Dl], [Dl, F] fp32
        gate_up = z[tokens].float() @ w13.T                    # [n, 2F]
        gate, up = gate_up.chunk(2, dim=-1)                    # [gate | up] order (§4.8)
        hidden = situ_glu_torch(gate, up, beta, linear_beta).to(z.dtype).float()
        out.index_add_(0, tokens, (hidden @ w2.T) * flat_weights[slots, None])
    return out


def _check_routed(z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  latent_size: int, op: str) -> None:
    if z.dim() != 2 or z.shape[1] != latent_size:
        raise ValueError(f"{op}: z must be [T, Dl] = [T, {latent_size}], got {tuple(z.shape)}")
    num_tokens = z.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != num_tokens or \
            topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"{op}: topk_weights and topk_ids must both be [T, k] with T={num_tokens}, got "
            f"{tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}"
        )


# The shape classes of moe_experts_mxfp4 (module docstring): the GEMVs' most tokens, and the
# mean pairs per expert past which the grouped GEMMs take 128-pair blocks.
GEMV_MAX_TOKENS = 64
SMALL_GROUP_MAX_PAIRS = 32
MOE_SHAPES = {
    "few_tokens": f"up to {GEMV_MAX_TOKENS} tokens (decode)",
    "small_groups": f"more than {GEMV_MAX_TOKENS} tokens, up to {SMALL_GROUP_MAX_PAIRS} "
                    "(token, slot) pairs per expert",
    "large_groups": f"more than {SMALL_GROUP_MAX_PAIRS} (token, slot) pairs per expert "
                    "(prefill)",
}


def moe_experts_shape(z: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      w13_packed: torch.Tensor, *args, **kwargs) -> str:
    num_tokens = topk_ids.shape[0]
    if num_tokens <= GEMV_MAX_TOKENS:
        return "few_tokens"
    pairs_per_expert = topk_ids.numel() / max(w13_packed.shape[0], 1)
    return "small_groups" if pairs_per_expert <= SMALL_GROUP_MAX_PAIRS else "large_groups"


def needs_nvidia(context: KernelContext) -> str | None:
    """Kernels with inline PTX (the MXFP4 word decode): NVIDIA GPUs."""
    reason = needs_gpu(context)
    if reason is None and context.target.vendor != "nvidia":
        reason = f"needs an NVIDIA GPU (inline PTX), got {context.target.name}"
    return reason


_MOE = "atomk31.triton_kernels"
_WORD_DECODE = all_of(needs_nvidia, needs_compute(torch.bfloat16))

define_op("moe_route", check=check_moe_route)
register("moe_route", "torch", moe_route_torch)
register("moe_route", "triton", f"{_MOE}.moe_routing:moe_route_triton", why_not=needs_gpu)
define_op("moe_experts_mxfp4", shapes=MOE_SHAPES, classify=moe_experts_shape,
          check=check_moe_experts_mxfp4)
register("moe_experts_mxfp4", "torch", moe_experts_mxfp4_torch, not_in_graph=READS_DEVICE)
register("moe_experts_mxfp4", "triton", f"{_MOE}.moe_gemv:moe_experts_mxfp4_gemv_words_triton",
         why_not=_WORD_DECODE, shapes=("few_tokens",))
register("moe_experts_mxfp4", "triton", f"{_MOE}.moe_gemv:moe_experts_mxfp4_gemv_triton",
         why_not=needs_gpu, shapes=("few_tokens",))
register("moe_experts_mxfp4", "triton",
         f"{_MOE}.moe_grouped_words:moe_experts_mxfp4_grouped_words_triton",
         why_not=_WORD_DECODE, shapes=("large_groups",))
register("moe_experts_mxfp4", "triton",
         f"{_MOE}.moe_grouped_gemm:moe_experts_mxfp4_grouped_triton", why_not=needs_gpu,
         shapes=("small_groups", "large_groups"))
register("moe_experts_mxfp4", "amd", "atomk31.ops.amd_adapters:moe_experts_mxfp4_flydsl",
         why_not=all_of(needs_rocm(("gfx950",), "flydsl"), needs_compute(torch.bfloat16)))
register("moe_experts_dense", "torch", moe_experts_dense_torch, not_in_graph=READS_DEVICE)
