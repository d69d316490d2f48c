"""The feed-forward sublayers in engine form: the dense SiTU-GLU MLP (§4.9, §9 #12) and the
latent MoE (§4.7) with MXFP4 (or dequantized BF16) routed experts and the shared experts.

Tensor parallel: the dense MLP and the shared experts split their intermediate channels
(column-parallel gate|up, row-parallel down). Routed experts split each expert's intermediate
channels the same way, or, under expert parallelism, are partitioned whole (E/TP per rank).
Either way every rank holds every token (attention is tensor-parallel, so the activations are
replicated after each block's all-reduce): the dispatch is local, each rank running the
(token, expert) pairs it holds, and the combine is one all-reduce of the routed sum u
[T, Dl] fp32, which §4.7 needs whole before ``routed_expert_norm``. An all-to-all dispatch
would only pay off with token-sharded activations (data-parallel attention); here it would
send each token's latent to up to min(k, TP) ranks and back, 2 x 8 x Dl x 2 B = 115 kB per
token at TP8 against the all-reduce's 2 (TP-1)/TP x Dl x 4 B = 25 kB
(``distributed/collective_bytes.py``). The router, the latent projections and the latent norm
are replicated. The block's output (routed + shared) costs the second all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atomk31.checkpoint.slices import Shard
from atomk31.config import ModelConfig
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.parallel_linear import ColumnParallelLinear, RowParallelLinear
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable
from atomk31.ops.moe import mxfp4_scales_allow_one_factor
from atomk31.quant import dequantize_mxfp4

ROUTED_NORM_NAME = "routed_expert_norm.weight"
# one routed expert's tensors, MXFP4 or dequantized (§3.2)
_EXPERT_TENSORS = tuple(f"{m}.{s}" for m in ("w1", "w2", "w3")
                        for s in ("weight_packed", "weight_scale", "weight"))


class DenseMLP:
    """y = W_down · situ_glu(W_gate x, W_up x); gate and up fused as [gate | up] (§4.8)."""

    OPS = ("situ_glu", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str, width: int,
                 parallel: ParallelContext | None = None):
        self.beta = config.activation_situ_beta
        self.linear_beta = config.activation_situ_linear_beta
        parallel = parallel or ParallelContext.single()
        start, stop = parallel.layout.tp_range(width)
        self.gate_up_proj = ColumnParallelLinear(
            weights, [prefix + "gate_proj.weight", prefix + "up_proj.weight"], start, stop)
        self.down_proj = RowParallelLinear(weights, prefix + "down_proj.weight", start, stop,
                                           parallel.tp)

    def forward(self, x: torch.Tensor, ops: OpTable, reduce: bool = True) -> torch.Tensor:
        """x [T, D] -> [T, D]; ``reduce=False``: this rank's partial sum (see the module doc)."""
        gate, up = self.gate_up_proj(x, ops).chunk(2, dim=-1)
        return self.down_proj(ops.situ_glu(gate, up, self.beta, self.linear_beta), ops, reduce)


class LatentMoE:
    """Router -> experts on the latent z = W_down x -> RMSNorm -> W_up, plus shared experts (§4.7).

    Experts are kept as the checkpoint stores them: MXFP4 bytes + E8M0 scales stacked over
    experts ([E, 2F, Dl/2] for w1|w3, [E, Dl, F/2] for w2), or dequantized BF16 when the
    checkpoint is the dequantized variant (§3.2). ``dequantize_experts`` decodes MXFP4 experts
    once here into the compute dtype (exact: an E2M1 code times a power of two has one mantissa
    bit), for kernels that would otherwise decode them at every call (the torch op).
    """

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str,
                 parallel: ParallelContext | None = None, dequantize_experts: bool = False):
        e = prefix + "block_sparse_moe."
        parallel = parallel or ParallelContext.single()
        self.comm = parallel.tp
        self.is_first_rank = parallel.layout.tp_rank == 0
        self.expert_start, expert_stop = parallel.layout.expert_range(config.num_experts)
        self.num_local_experts = expert_stop - self.expert_start
        self.is_partitioned = self.num_local_experts < config.num_experts
        f0, f1 = parallel.layout.expert_channel_range(config.moe_intermediate_size)
        self.top_k = config.num_experts_per_token
        self.renormalize = config.moe_renormalize
        self.scaling = config.routed_scaling_factor
        self.beta = config.activation_situ_beta
        self.linear_beta = config.activation_situ_linear_beta
        self.eps = config.rms_norm_eps
        self.w_router = weights.take_fp32(e + "gate.weight")          # fp32 logits (§4.7)
        self.correction_bias = weights.take_fp32(e + "gate.e_score_correction_bias")
        self.is_latent = config.routed_expert_hidden_size is not None   # §9 #10
        if self.is_latent:
            self.w_latent_down = weights.take(e + "routed_expert_down_proj.weight")
            self.w_latent_up = weights.take(e + "routed_expert_up_proj.weight")
        self.latent_norm = (weights.take_fp32(e + ROUTED_NORM_NAME)
                            if self.is_latent and config.latent_moe_use_norm else None)
        self.shared = (DenseMLP(config, weights, e + "shared_experts.",
                                config.moe_intermediate_size * config.num_shared_experts,
                                parallel) if config.num_shared_experts else None)
        experts = [f"{e}experts.{i}." for i in range(config.num_experts)]
        self.is_mxfp4 = weights.has(experts[0] + "w1.weight_packed")
        held = experts[self.expert_start:expert_stop]
        for p in experts[:self.expert_start] + experts[expert_stop:]:   # other ranks' experts
            for name in _EXPERT_TENSORS:
                weights.discard(p + name)
        # an expert's channels [f0, f1): rows of w1 / w3, columns of w2 (two E2M1 codes a
        # byte, one scale per 32: the layout checks keep f0, f1 multiples of 32)
        rows, packed_cols, scale_cols = (Shard(0, f0, f1), Shard(1, f0 // 2, f1 // 2),
                                         Shard(1, f0 // 32, f1 // 32))
        if self.is_mxfp4:
            self.w13_packed = _stack_experts(lambda n: weights.take_raw(n, rows), held,
                                             ("w1.weight_packed", "w3.weight_packed"))
            self.w13_scales = _stack_experts(lambda n: weights.take_raw(n, rows), held,
                                             ("w1.weight_scale", "w3.weight_scale"))
            self.w2_packed = _stack_experts(lambda n: weights.take_raw(n, packed_cols), held,
                                            ("w2.weight_packed",))
            self.w2_scales = _stack_experts(lambda n: weights.take_raw(n, scale_cols), held,
                                            ("w2.weight_scale",))
            # Once per layer, at load (one host sync here, none per step): whether every
            # scale byte allows the kernels' one-multiply decode (ops/moe.py's docstring).
            self.one_factor_exact = mxfp4_scales_allow_one_factor(self.w13_scales,
                                                                  self.w2_scales)
            if dequantize_experts:
                self._dequantize(weights.dtype)
        else:
            self.w13 = _stack_experts(lambda n: weights.take(n, shard=rows), held,
                                      ("w1.weight", "w3.weight"))
            self.w2 = _stack_experts(lambda n: weights.take(n, shard=Shard(1, f0, f1)), held,
                                     ("w2.weight",))

    def _dequantize(self, dtype: torch.dtype) -> None:
        """MXFP4 experts -> w13 [E, 2F, Dl], w2 [E, Dl, F] in ``dtype``, one expert at a time
        (the fp32 decode of a whole layer's experts at once would be their size times 8)."""
        def decoded(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
            out = torch.empty(*packed.shape[:-1], 2 * packed.shape[-1], dtype=dtype,
                              device=packed.device)
            for e in range(packed.shape[0]):
                out[e] = dequantize_mxfp4(packed[e], scales[e], dtype)
            return out

        self.w13 = decoded(self.w13_packed, self.w13_scales)
        self.w2 = decoded(self.w2_packed, self.w2_scales)
        del self.w13_packed, self.w13_scales, self.w2_packed, self.w2_scales
        self.is_mxfp4 = False

    @property
    def ops_called(self) -> tuple[str, ...]:
        """The ops ``forward`` calls (which graph steps must be able to capture)."""
        experts = "moe_experts_mxfp4" if self.is_mxfp4 else "moe_experts_dense"
        shared = DenseMLP.OPS if self.shared is not None else ()
        return ("moe_route", experts, "rms_norm") + shared

    def forward(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        weights, ids = ops.moe_route(x, self.w_router, self.correction_bias, self.top_k,
                                     self.renormalize, self.scaling)
        z = x @ self.w_latent_down.T if self.is_latent else x
        if self.is_partitioned:
            u = self._held_experts(z, weights, ids, ops)
        else:
            u = self._experts(z, weights, ids, ops)
        u = self.comm.all_reduce(u)            # whole before the (nonlinear) latent norm, §4.7
        if self.latent_norm is not None:
            u = ops.rms_norm(u, self.latent_norm, self.eps)
        u = u.to(x.dtype)
        y = u @ self.w_latent_up.T if self.is_latent else u
        if self.shared is None:
            return y
        if self.comm.world_size == 1:
            return y + self.shared.forward(x, ops)
        # one all-reduce for the block: the shared experts' partial sums, the routed output
        # (already whole on every rank) added once, by the first rank
        partial = self.shared.forward(x, ops, reduce=False)
        return self.comm.all_reduce(partial + y if self.is_first_rank else partial)

    def _experts(self, z: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 ops: OpTable) -> torch.Tensor:
        """u fp32 [T, Dl] of the experts held here over every (token, expert) pair."""
        if self.is_mxfp4:
            return ops.moe_experts_mxfp4(z, weights, ids, self.w13_packed, self.w13_scales,
                                         self.w2_packed, self.w2_scales, self.beta,
                                         self.linear_beta, one_factor_exact=self.one_factor_exact)
        return ops.moe_experts_dense(z, weights, ids, self.w13, self.w2, self.beta,
                                     self.linear_beta)

    def _held_experts(self, z: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                      ops: OpTable) -> torch.Tensor:
        """Expert parallelism: only the (token, expert) pairs whose expert this rank holds,
        each as its own row of one expert; their outputs summed back per token."""
        local = ids.long() - self.expert_start
        token, slot = torch.nonzero((local >= 0) & (local < self.num_local_experts),
                                    as_tuple=True)
        u = torch.zeros(z.shape[0], z.shape[1], dtype=torch.float32, device=z.device)
        if token.numel():
            pairs = self._experts(z[token], weights[token, slot][:, None],
                                  local[token, slot][:, None].to(torch.int32), ops)
            u.index_add_(0, token, pairs)
        return u


def _stack_experts(take: Callable[[str], torch.Tensor], prefixes: list[str],
                   parts: tuple[str, ...]) -> torch.Tensor:
    """[E, rows, ...]: each expert's ``parts`` concatenated along their rows, written expert by
    expert into one tensor while each source tensor is dropped after its copy, so one layer's
    experts are never held twice (a list of per-expert tensors then a stack would)."""
    out = None
    for e, prefix in enumerate(prefixes):
        pieces = [take(prefix + part) for part in parts]
        if out is None:
            rows = sum(piece.shape[0] for piece in pieces)
            out = torch.empty((len(prefixes), rows, *pieces[0].shape[1:]),
                              dtype=pieces[0].dtype, device=pieces[0].device)
        torch.cat(pieces, out=out[e])
    return out
