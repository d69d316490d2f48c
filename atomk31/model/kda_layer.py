"""The KDA mixer in engine form (MODEL_SPEC.md §4.4): batched over requests, state in the pool.

Each request's KDA state (the q|k|v conv histories and the [H, K, V] recurrent state, per
layer) lives in one slot of the KDAStatePool. The convolution and the decode recurrence read
and update the slots of the batch's requests where they lie (`state_slots`): a decode step
moves each state byte once. A prefill step gathers the recurrent states of its requests (the
chunked prefill is compute-bound; the copy is small beside it) and writes them back. The step
also writes the prefix snapshots the batch asks for (the state after the first m tokens of a
request in this step) into their own slots. A speculative verify batch (`verify_rows`: the same
rows for every request, a state kept after each) runs `kda_verify`, which returns the state
after every row, and scatters those into the slots the batch names (MODEL_SPEC §5.7).

Tensor parallel: a rank holds the heads of its TP share (``layout.tp_range``): their rows of
q/k/v/f_b/b/g and of the conv weights and per-head vectors, their columns of o_proj (one
all-reduce at the output), and their slice of every request's state. f_a (rank 128) and
o_norm (shared by all heads) are replicated.
"""

from __future__ import annotations

import torch

from atomk31.checkpoint.slices import Shard
from atomk31.config import ModelConfig
from atomk31.distributed.parallel_context import ParallelContext
from atomk31.model.batch import ForwardBatch
from atomk31.model.parallel_linear import ColumnParallelLinear, RowParallelLinear
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable


class KDAMixer:
    OPS = ("short_conv_silu", "conv_state_after", "kda_gate", "kda_decode", "kda_prefill",
           "kda_verify", "gated_rms_norm", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str, kda_index: int,
                 parallel: ParallelContext | None = None):
        a = prefix + "self_attn."
        parallel = parallel or ParallelContext.single()
        self.kda_index = kda_index        # this layer's row in the state pool's tensors
        h0, h1 = parallel.layout.tp_range(config.kda_num_heads)    # this rank's heads
        self.num_heads = h1 - h0
        self.head_dim = K = config.kda_head_dim
        self.lower_bound = config.gate_lower_bound
        self.eps = config.rms_norm_eps
        channels = Shard(0, h0 * K, h1 * K)
        self.qkv_proj = ColumnParallelLinear(
            weights, [a + f"{n}_proj.weight" for n in ("q", "k", "v")], h0 * K, h1 * K)
        # conv weights [C, 1, Kc] -> one [3C, Kc] for the fused q|k|v convolution
        self.w_conv = torch.cat([weights.take_fp32(a + f"{n}_conv1d.weight", channels)[:, 0, :]
                                 for n in ("q", "k", "v")], dim=0)
        self.f_a_proj = weights.take_linear(a + "f_a_proj.weight")
        self.f_b_proj = ColumnParallelLinear(weights, a + "f_b_proj.weight", h0 * K, h1 * K)
        self.b_proj = ColumnParallelLinear(weights, a + "b_proj.weight", h0, h1)
        self.g_proj = ColumnParallelLinear(weights, a + "g_proj.weight", h0 * K, h1 * K)
        # A_log may be padded ([128], [1,1,96,1]): the first num_heads entries are used (§9 #16)
        a_log = weights.take_fp32(a + "A_log").flatten()[: config.kda_num_heads]
        self.a_log = a_log[h0:h1].contiguous()
        self.dt_bias = weights.take_fp32(a + "dt_bias", channels)
        self.o_norm = weights.take_fp32(a + "o_norm.weight")
        self.o_proj = RowParallelLinear(weights, a + "o_proj.weight", h0 * K, h1 * K, parallel.tp)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, conv_pool: torch.Tensor,
                state_pool: torch.Tensor, ops: OpTable) -> torch.Tensor:
        """x: [T, D] normed input -> [T, D]. conv_pool: [L_kda, slots, Kc-1, 3C];
        state_pool: [L_kda, slots, H, K, V] fp32 (both updated in place)."""
        H, K = self.num_heads, self.head_dim
        T = x.shape[0]
        slots = batch.state_slots
        conv_all, state_all = conv_pool[self.kda_index], state_pool[self.kda_index]
        z = self.qkv_proj(x, ops)                                           # [T, 3C]
        snapshots = batch.snapshots
        if snapshots.numel():
            conv_snap = ops.conv_state_after(z, conv_all, batch.cu_seqlens,
                                             batch.has_initial_state, snapshots[:, :2],
                                             state_slots=slots)
        qkv = ops.short_conv_silu(z, self.w_conv, conv_all, batch.cu_seqlens,
                                  batch.has_initial_state, state_slots=slots)
        q, k, v = qkv.view(T, 3, H, K).unbind(1)
        f = self.f_b_proj(self.f_a_proj(x, ops), ops)
        g = ops.kda_gate(f.view(T, H, K), self.a_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x, ops).float())                # fp32 (§4.4)
        scale = K ** -0.5
        if batch.is_decode_only and not snapshots.numel():
            # the pool's rows of this batch updated where they lie
            o = ops.kda_decode(q, k, v, g, beta, state_all, scale, state_slots=slots)
        elif batch.verify_rows:
            # speculative verification: the state after every row, each to its own slot (§5.7)
            n, rows = batch.num_requests, batch.verify_rows
            o, after_each = ops.kda_verify(*(t.view(n, rows, *t.shape[1:])
                                             for t in (q, k, v, g, beta)),
                                           state_all[slots], scale)
            o = o.reshape(T, H, -1)
            state_all[snapshots[:, 2]] = after_each.flatten(0, 1)
        else:
            o, state, snap_states = ops.kda_prefill(q, k, v, g, beta, state_all[slots],
                                                    batch.cu_seqlens, scale,
                                                    snapshot_at=snapshots[:, :2]
                                                    if snapshots.numel() else None)
            state_all[slots] = state
        if snapshots.numel():
            snap_slots = snapshots[:, 2]
            if not batch.verify_rows:
                state_all[snap_slots] = snap_states
            conv_all[snap_slots] = conv_snap.to(conv_all.dtype)
        gate = self.g_proj(x, ops).view(T, H, K)
        y = ops.gated_rms_norm(o.to(x.dtype), gate, self.o_norm, self.eps)
        return self.o_proj(y.reshape(T, H * K), ops)

