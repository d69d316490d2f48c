"""The linears of a tensor-parallel model: which share of each weight a rank holds, and why.

Megatron's pairing (nano-vllm's ``layers/linear.py`` is the model of clarity): a block opens
with column-parallel linears and closes with one row-parallel linear, so its activations stay
split between the two and the block costs one all-reduce at its output.

* `ColumnParallelLinear`: this rank's rows of ``W`` (output features): its heads, its
  intermediate channels. No communication: whatever follows (attention of those heads, the
  SiTU-GLU of those channels) needs exactly these features.
* `RowParallelLinear`: this rank's columns of ``W`` (input features), matching the split the
  column-parallel side left; each rank's product is a partial sum of the full output, summed by
  one all-reduce. ``reduce=False`` returns the partial, for a block that adds two branches
  before its one all-reduce (the latent MoE: shared experts + routed output).
* `VocabParallelLMHead`: this rank's vocabulary rows of ``lm_head``; the rank's logits
  ``[M, V/TP]`` are gathered to the first rank, which samples (only it needs them), in
  vocabulary order. A [V, D] head is the largest BF16 matrix of the model (2.35 GB).

Replicated linears (the MLA latent projections, the indexer, the router, the MoE latent
projections) are plain `Linear`s: every rank computes them whole, since every rank needs the
whole result (the latent cache rows, the selection, the routing).
"""

from __future__ import annotations

import torch

from atomk31.checkpoint.slices import Shard
from atomk31.distributed.communicator import LocalCommunicator, TorchCommunicator
from atomk31.model.linear import Linear
from atomk31.model.weights import WeightSource
from atomk31.ops import OpTable

Communicator = LocalCommunicator | TorchCommunicator


class ColumnParallelLinear:
    """Rows ``[start, stop)`` of each of ``names`` (fused along the output dim, in order)."""

    def __init__(self, weights: WeightSource, names: str | list[str], start: int, stop: int):
        self.linear = weights.take_linear(names, Shard(0, start, stop))

    @property
    def is_fp8(self) -> bool:
        return self.linear.is_fp8

    def __call__(self, x: torch.Tensor, ops: OpTable) -> torch.Tensor:
        return self.linear(x, ops)


class RowParallelLinear:
    """Columns ``[start, stop)`` of ``name``; the output all-reduced over ``comm``."""

    def __init__(self, weights: WeightSource, name: str, start: int, stop: int,
                 comm: Communicator):
        self.linear = weights.take_linear(name, Shard(1, start, stop))
        self.comm = comm

    @property
    def is_fp8(self) -> bool:
        return self.linear.is_fp8

    def __call__(self, x: torch.Tensor, ops: OpTable, reduce: bool = True) -> torch.Tensor:
        partial = self.linear(x, ops)
        return self.comm.all_reduce(partial) if reduce else partial


class VocabParallelLMHead:
    """Vocabulary rows ``[start, stop)`` of the LM head; logits gathered to the first rank."""

    def __init__(self, weights: WeightSource, name: str, start: int, stop: int,
                 comm: Communicator):
        self.weight = weights.take(name, shard=Shard(0, start, stop))
        self.comm = comm
        self.vocab_size = self.weight.shape[0] * comm.world_size

    @property
    def shape(self) -> tuple[int, int]:
        """The whole head's [V, D]: V is the width of the logits the first rank gets."""
        return self.vocab_size, self.weight.shape[1]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [M, D] -> float32 logits [M, V] on the first rank (the local [M, V/TP] slice on
        the others, which nothing reads)."""
        local = (h @ self.weight.T).float()
        if self.comm.world_size == 1:
            return local
        parts = self.comm.gather_to_first(local)      # [TP, M, V/TP]
        if parts is None:
            return local
        return parts.permute(1, 0, 2).reshape(local.shape[0], parts.shape[0] * local.shape[1])
