"""KDA state slots: a request's fixed-size recurrent state, one slot per running request.

Per KDA layer and slot (MODEL_SPEC §4.4, sizes in §7.3):
  conv:      [3, Kc-1, C] conv_dtype (BF16): the last Kc-1 *inputs* of the q, k and v short
             convolutions, C = H*K channels each.
  recurrent: [H, K, V] state_dtype (fp32): S per head, key-major as in §4.4.

Both are stored layer-major, `[num_kda_layers, num_slots, ...]`, so `conv[layer]` and
`recurrent[layer]` are the per-layer `[num_slots, ...]` tensors the KDA op indexes by slot.
Prefix-cache snapshots are slots of this same pool (snapshots.py).
"""

from collections import deque
from dataclasses import dataclass

import torch

NUM_CONV_INPUTS = 3  # q, k and v each have their own short convolution (§4.4)


class NoFreeSlotsError(RuntimeError):
    """Raised when every KDA state slot is taken (the scheduler should wait or preempt)."""


@dataclass(frozen=True)
class KDAStateSpec:
    """Shape of one request's KDA state (per TP rank: pass the rank's heads and channels)."""

    num_kda_layers: int
    num_heads: int  # H
    head_dim: int  # K = V
    conv_width: int  # Kc
    conv_channels: int  # C = num_heads * head_dim
    conv_dtype: torch.dtype = torch.bfloat16
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.num_kda_layers < 0:
            raise ValueError(f"num_kda_layers must be >= 0, got {self.num_kda_layers}")
        if self.num_heads < 1 or self.head_dim < 1:
            raise ValueError(
                f"num_heads and head_dim must be >= 1, got {self.num_heads} and {self.head_dim}"
            )
        if self.conv_width < 1:
            raise ValueError(f"conv_width must be >= 1, got {self.conv_width}")
        if self.conv_channels != self.num_heads * self.head_dim:
            raise ValueError(
                f"conv_channels must be num_heads * head_dim = "
                f"{self.num_heads * self.head_dim} (§4.4), got {self.conv_channels}"
            )

    @property
    def conv_shape(self) -> tuple[int, int]:
        """One slot's conv state in one layer: (Kc-1, 3C), the q | k | v histories side by
        side as the fused convolution reads them (so kernels read and write a slot where it
        lies)."""
        return (self.conv_width - 1, NUM_CONV_INPUTS * self.conv_channels)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        """One slot's recurrent state in one layer: (H, K, V)."""
        return (self.num_heads, self.head_dim, self.head_dim)

    def bytes_per_slot(self) -> int:
        """Bytes of one request's state over all KDA layers (§7.3: 449,372,160 for K3.1)."""
        conv = NUM_CONV_INPUTS * (self.conv_width - 1) * self.conv_channels
        recurrent = self.num_heads * self.head_dim * self.head_dim
        per_layer = conv * self.conv_dtype.itemsize + recurrent * self.state_dtype.itemsize
        return self.num_kda_layers * per_layer


class KDAStatePool:
    """`num_slots` KDA states on `device`, handed out zeroed, one per request or snapshot,
    and `num_scratch_slots` more that are never handed out (slots num_slots.. : the padding
    rows of CUDA-graph decode steps write there).

    conv:      [num_kda_layers, num_slots + num_scratch_slots, 3, Kc-1, C] conv_dtype
    recurrent: [num_kda_layers, num_slots + num_scratch_slots, H, K, V] state_dtype
    """

    def __init__(self, spec: KDAStateSpec, num_slots: int, device: torch.device | str,
                 num_scratch_slots: int = 0) -> None:
        if num_slots < 0 or num_scratch_slots < 0:
            raise ValueError(f"num_slots and num_scratch_slots must be >= 0, got {num_slots} "
                             f"and {num_scratch_slots}")
        self.spec = spec
        self.num_slots = num_slots
        self.num_scratch_slots = num_scratch_slots
        layers, total = spec.num_kda_layers, num_slots + num_scratch_slots
        self.conv = torch.zeros(
            layers, total, *spec.conv_shape, dtype=spec.conv_dtype, device=device
        )
        self.recurrent = torch.zeros(
            layers, total, *spec.recurrent_shape, dtype=spec.state_dtype, device=device
        )
        self._free_slots: deque[int] = deque(range(num_slots))
        self._is_used = [False] * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def usage(self) -> float:
        """Fraction of slots in use; 0.0 for an empty pool."""
        if self.num_slots == 0:
            return 0.0
        return 1.0 - self.num_free_slots / self.num_slots

    def allocate(self) -> int:
        """A free slot with zeroed state (a new request starts from zeros, §4.4)."""
        if not self._free_slots:
            raise NoFreeSlotsError(
                f"all {self.num_slots} KDA state slots are in use; finish or preempt a "
                "request, or lower the snapshot share of the cache plan"
            )
        slot = self._free_slots.popleft()
        self._is_used[slot] = True
        self.conv[:, slot].zero_()
        self.recurrent[:, slot].zero_()
        return slot

    def scratch_slot(self, i: int = 0) -> int:
        """The index of scratch slot `i` (never handed out, never checked)."""
        if not 0 <= i < self.num_scratch_slots:
            raise ValueError(f"scratch slot must be in 0..{self.num_scratch_slots - 1}, got {i}")
        return self.num_slots + i

    def free(self, slot: int) -> None:
        self._check_used(slot)
        self._is_used[slot] = False
        self._free_slots.append(slot)

    def copy(self, src: int, dst: int) -> None:
        """Copy slot `src`'s state (all layers) into slot `dst`: restore or take a snapshot.
        Either may be a scratch slot (the graph replay check keeps a backup there)."""
        for slot in (src, dst):
            if not self.num_slots <= slot < self.num_slots + self.num_scratch_slots:
                self._check_used(slot)
        self.copy_states(src, dst)

    def copy_states(self, src: int, dst: int) -> None:
        """The copy alone: no check that the slots are in use (a rank other than the first
        hands out none), and never recorded for the other ranks (`MirroredStatePool` records
        `copy`): what every rank does on its own states, such as a graph's snapshots."""
        if src == dst:
            return
        self.conv[:, dst].copy_(self.conv[:, src])
        self.recurrent[:, dst].copy_(self.recurrent[:, src])

    def is_used(self, slot: int) -> bool:
        self._check_slot(slot)
        return self._is_used[slot]

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"KDA state slot must be in 0..{self.num_slots - 1}, got {slot}")

    def _check_used(self, slot: int) -> None:
        self._check_slot(slot)
        if not self._is_used[slot]:
            raise ValueError(f"KDA state slot {slot} is free; allocate it first")
