"""The trainer's KDA mixer (MODEL_SPEC §4.4): projections, short convolutions, gates, the scan,
the gated output norm. Parameters carry the checkpoint's names under `self_attn.`.

The scan is `kda_scan.kda_chunked_batched` (plain PyTorch), or fla's `chunk_kda` on a GPU when
the trainer selected it (`use_fla`): fla computes the same recurrence from the same gates, and
the trainer checks the two agree before using it (loop.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from atomk31.config import ModelConfig
from atomk31.demo.train.kda_scan import kda_chunked_batched
from atomk31.demo.train.layers import RMSNorm

# §4.4 / random_init.py: per-head rates exp(A_log) in [1, 16] and dt_bias in [-4, 0] give decays
# from "forget at once" to "remember hundreds of tokens" at initialisation.
A_LOG_RATE_RANGE = (1.0, 16.0)
DT_BIAS_RANGE = (-4.0, 0.0)


class KdaMixer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, heads, head_dim = config.hidden_size, config.kda_num_heads, config.kda_head_dim
        channels, width = heads * head_dim, config.short_conv_kernel_size
        self.num_heads, self.head_dim = heads, head_dim
        self.gate_lower_bound = config.gate_lower_bound
        for name in ("q_proj", "k_proj", "v_proj", "g_proj"):
            setattr(self, name, nn.Linear(hidden, channels, bias=False))
        for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
            setattr(self, name, nn.Conv1d(channels, channels, width, groups=channels, bias=False,
                                          padding=width - 1))
        self.f_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, channels, bias=False)
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(heads).uniform_(*A_LOG_RATE_RANGE).log())
        self.dt_bias = nn.Parameter(torch.empty(channels).uniform_(*DT_BIAS_RANGE))
        self.o_norm = RMSNorm(head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(channels, hidden, bias=False)
        self.use_fla = False

    def _conv(self, conv: nn.Conv1d, z: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv then SiLU over time: z [B, T, C] -> [B, T, C]."""
        y = conv(z.transpose(1, 2))[..., : z.shape[1]]     # weight[:, 0, Kc-1] hits z_t (§4.4)
        return F.silu(y).transpose(1, 2)

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """g [B, T, H, K] (log decay, float32) and beta [B, T, H] (float32)."""
        b, t, _ = x.shape
        f = self.f_b_proj(self.f_a_proj(x)).float().view(b, t, self.num_heads, self.head_dim)
        pre = f + self.dt_bias.float().view(self.num_heads, self.head_dim)
        rate = torch.exp(self.A_log.float()).view(self.num_heads, 1)
        if self.gate_lower_bound is None:
            g = -rate * F.softplus(pre)
        else:
            g = self.gate_lower_bound * torch.sigmoid(rate * pre)
        return g, torch.sigmoid(self.b_proj(x).float())

    def scan(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> torch.Tensor:
        if self.use_fla:
            from fla.ops.kda import chunk_kda

            o, _ = chunk_kda(q.float(), k.float(), v.float(), g, beta,
                             scale=self.head_dim**-0.5, use_qk_l2norm_in_kernel=True)
            return o.float()
        with torch.autocast(device_type=q.device.type, enabled=False):
            return kda_chunked_batched(q, k, v, g, beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] (normed layer input) -> [B, T, D]."""
        b, t, _ = x.shape
        heads = (b, t, self.num_heads, self.head_dim)
        q = self._conv(self.q_conv1d, self.q_proj(x)).reshape(heads)
        k = self._conv(self.k_conv1d, self.k_proj(x)).reshape(heads)
        v = self._conv(self.v_conv1d, self.v_proj(x)).reshape(heads)
        g, beta = self.gates(x)
        o = self.scan(q, k, v, g, beta)
        y = self.o_norm(o) * torch.sigmoid(self.g_proj(x).float()).view(heads)
        return self.o_proj(y.reshape(b, t, -1))


def init_kda_conv(conv: nn.Conv1d) -> None:
    """N(0, 1/Kc), the fan-in rule of random_init.py."""
    nn.init.normal_(conv.weight, std=1 / math.sqrt(conv.weight.shape[-1]))
