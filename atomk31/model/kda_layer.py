"""The KDA mixer in engine form (MODEL_SPEC.md §4.4): batched over requests, state in the pool.

Each request's KDA state (the q|k|v conv histories and the [H, K, V] recurrent state, per
layer) lives in one slot of the KDAStatePool. The convolution and the decode recurrence read
and update the slots of the batch's requests where they lie (`state_slots`): a decode step
moves each state byte once. A prefill step gathers the recurrent states of its requests (the
chunked prefill is compute-bound; the copy is small beside it) and writes them back. The step
also writes the prefix snapshots the batch asks for (the state after the first m tokens of a
request in this step) into their own slots.
"""

from __future__ import annotations

import torch

from atomk31.config import ModelConfig
from atomk31.model.batch import ForwardBatch
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable


class KDAMixer:
    OPS = ("short_conv_silu", "conv_state_after", "kda_gate", "kda_decode", "kda_prefill",
           "gated_rms_norm", "ptpc_linear")

    def __init__(self, config: ModelConfig, weights: WeightSource, prefix: str, kda_index: int):
        a = prefix + "self_attn."
        self.kda_index = kda_index        # this layer's row in the state pool's tensors
        self.num_heads = config.kda_num_heads
        self.head_dim = config.kda_head_dim
        self.lower_bound = config.gate_lower_bound
        self.eps = config.rms_norm_eps
        self.qkv_proj = weights.take_linear(
            [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"])
        # conv weights [C, 1, Kc] -> one [3C, Kc] for the fused q|k|v convolution
        self.w_conv = torch.cat([weights.take_fp32(a + f"{n}_conv1d.weight")[:, 0, :]
                                 for n in ("q", "k", "v")], dim=0)
        self.f_a_proj = weights.take_linear(a + "f_a_proj.weight")
        self.f_b_proj = weights.take_linear(a + "f_b_proj.weight")
        self.b_proj = weights.take_linear(a + "b_proj.weight")
        self.g_proj = weights.take_linear(a + "g_proj.weight")
        # A_log may be padded ([128], [1,1,96,1]): the first num_heads entries are used (§9 #16)
        self.a_log = weights.take_fp32(a + "A_log").flatten()[: self.num_heads]
        self.dt_bias = weights.take_fp32(a + "dt_bias")
        self.o_norm = weights.take_fp32(a + "o_norm.weight")
        self.o_proj = weights.take_linear(a + "o_proj.weight")

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
        else:
            o, state, snap_states = ops.kda_prefill(q, k, v, g, beta, state_all[slots],
                                                    batch.cu_seqlens, scale,
                                                    snapshot_at=snapshots[:, :2]
                                                    if snapshots.numel() else None)
            state_all[slots] = state
        if snapshots.numel():
            snap_slots = snapshots[:, 2]
            state_all[snap_slots] = snap_states
            conv_all[snap_slots] = conv_snap.to(conv_all.dtype)
        gate = self.g_proj(x, ops).view(T, H, K)
        y = ops.gated_rms_norm(o.to(x.dtype), gate, self.o_norm, self.eps)
        return self.o_proj(y.reshape(T, H * K), ops)

