"""The packed cache row: one contiguous byte range per block holding every MLA layer's pages.

A block of `block_size` tokens owns one row of the uint8 pool `[num_blocks, row_bytes]`. The
row holds, in order (DESIGN.md §4, MODEL_SPEC §7):

    target MLA layer 0:  latent page | index-key page
    target MLA layer 1:  latent page | index-key page
    ...
    draft layer 0:       latent page              (DSpark rows carry no index key, §5.4)
    ...

* latent page: `[block_size, latent_dim]` of `latent_dtype` (576 = `c 512 | k_r 64`, §7.1).
  An fp8 latent has one static per-layer scale (1.0, §8 #8), not stored in the page.
* index-key page (§4.6.1), values of all the page's tokens first, then their scales:
    "fp8":   `[block_size, 128]` fp8 values | `[block_size]` fp32 scales     (132 B/token)
    "mxfp4": `[block_size, 64]` packed E2M1  | `[block_size, 4]` E8M0 scales (68 B/token)

Every page starts on a 256-byte boundary of the row and the row is a multiple of 256 bytes,
so each page is aligned for wide vector loads; for `block_size >= 64` no padding is needed at
all. A whole block (all layers) is the one range `pool[b]`, so it moves with one copy.

Views are slices of the uint8 pool reinterpreted with `.view(dtype)`: no copies; the block
stride of every view is `row_bytes` (in bytes).
"""

from dataclasses import dataclass

import torch

from atomk31.quant.fp8 import fp8_dtype

PAGE_ALIGNMENT = 256  # bytes; every page starts at a multiple of this inside the row
LATENT_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
INDEX_FORMATS = ("fp8", "mxfp4")
FP8_VARIANT_NAMES = ("e4m3fn", "e4m3fnuz")
INDEX_HEAD_DIM = 128  # d_I: one fp8 scale or four MXFP4 scales per key (§4.6.1)
MXFP4_GROUP = 32  # values per E8M0 scale (§6.3)
FP8_LATENT_SCALE = 1.0  # static per-layer latent scale, not calibrated (§7.1, §8 #8)


def _align_up(num_bytes: int, alignment: int = PAGE_ALIGNMENT) -> int:
    return -(-num_bytes // alignment) * alignment


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class CacheLayoutSpec:
    """What one block row holds. Validated on construction (ValueError says what to pass)."""

    block_size: int  # tokens per block, a power of two (--block-size)
    num_mla_layers: int  # target MLA layers (24 for K3.1), each with latent + index-key page
    num_draft_layers: int = 0  # DSpark draft layers: latent page only (§5.4)
    latent_dim: int = 576
    latent_dtype: torch.dtype = torch.float8_e4m3fn
    index_format: str | None = "fp8"  # "fp8" | "mxfp4" | None (plain K3: no index pages)
    index_head_dim: int = INDEX_HEAD_DIM
    fp8_variant: str = "e4m3fn"  # the fp8 dtype of index keys (§6.1)

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or not is_power_of_two(self.block_size):
            raise ValueError(
                f"block_size must be a power of two, got {self.block_size}; "
                "pass --block-size 64 or 128"
            )
        if self.num_mla_layers < 0 or self.num_draft_layers < 0:
            raise ValueError(
                f"layer counts must be >= 0, got num_mla_layers={self.num_mla_layers}, "
                f"num_draft_layers={self.num_draft_layers}"
            )
        if self.num_mla_layers + self.num_draft_layers == 0:
            raise ValueError("a cache layout needs at least one MLA or draft layer, got none")
        if self.latent_dim < 1:
            raise ValueError(f"latent_dim must be >= 1, got {self.latent_dim}")
        if self.latent_dtype not in LATENT_DTYPES:
            raise ValueError(
                f"latent_dtype must be one of {LATENT_DTYPES}, got {self.latent_dtype}"
            )
        if self.index_format not in (*INDEX_FORMATS, None):
            raise ValueError(
                f"index_format must be 'fp8', 'mxfp4' or None, got {self.index_format!r}"
            )
        if self.fp8_variant not in FP8_VARIANT_NAMES:
            raise ValueError(
                f"fp8_variant must be one of {FP8_VARIANT_NAMES}, got {self.fp8_variant!r}"
            )
        if self.index_format is not None and self.index_head_dim != INDEX_HEAD_DIM:
            raise ValueError(
                f"index_head_dim must be {INDEX_HEAD_DIM} (one key scale group per token, "
                f"§4.6.1), got {self.index_head_dim}"
            )
        # One device speaks one FP8 dialect (§6.1): an fnuz latent with fn keys is a mix-up.
        latent_is_fp8 = self.latent_dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
        if latent_is_fp8 and self.latent_dtype != fp8_dtype(self.fp8_variant):
            raise ValueError(
                f"latent_dtype {self.latent_dtype} and fp8_variant {self.fp8_variant!r} "
                "disagree; use the device's one FP8 variant for both (e4m3fnuz on gfx942)"
            )

    @property
    def num_layers(self) -> int:
        """Target MLA layers plus draft layers: the range of `PackedLayout.layer_view`."""
        return self.num_mla_layers + self.num_draft_layers

    @property
    def latent_bytes_per_token(self) -> int:
        return self.latent_dim * self.latent_dtype.itemsize

    @property
    def index_value_bytes_per_token(self) -> int:
        if self.index_format == "fp8":
            return self.index_head_dim
        if self.index_format == "mxfp4":
            return self.index_head_dim // 2  # two E2M1 codes per byte
        return 0

    @property
    def index_scale_bytes_per_token(self) -> int:
        if self.index_format == "fp8":
            return 4  # one fp32 scale
        if self.index_format == "mxfp4":
            return self.index_head_dim // MXFP4_GROUP  # one E8M0 byte per 32 values
        return 0


@dataclass
class MLACacheView:
    """One layer's cache as the ops receive it; every tensor is a view into the pool.

    latent:       [num_blocks, block_size, latent_dim] latent_dtype
    latent_scale: static per-layer scale of an fp8 latent (1.0, §7.1, §8 #8)
    index_values: fp8: [num_blocks, block_size, 128] float8; mxfp4: [num_blocks, block_size, 64]
                  uint8; None for draft layers and for a layout without index keys
    index_scales: fp8: [num_blocks, block_size] float32; mxfp4: [num_blocks, block_size, 4]
                  uint8; None where index_values is None
    """

    latent: torch.Tensor
    latent_scale: float
    index_values: torch.Tensor | None
    index_scales: torch.Tensor | None


@dataclass(frozen=True)
class _LayerOffsets:
    """Byte offsets inside a row of one layer's regions (index_* are None without keys)."""

    latent: int
    index_values: int | None
    index_scales: int | None


class PackedLayout:
    """Byte layout of a block row, the pool allocator and the per-layer views (module doc)."""

    def __init__(self, spec: CacheLayoutSpec) -> None:
        self.spec = spec
        bs = spec.block_size
        self.latent_page_bytes = bs * spec.latent_bytes_per_token
        self.index_page_bytes = bs * (
            spec.index_value_bytes_per_token + spec.index_scale_bytes_per_token
        )
        offsets: list[_LayerOffsets] = []
        cursor = 0
        for layer in range(spec.num_layers):
            latent_offset = cursor
            cursor = _align_up(cursor + self.latent_page_bytes)
            has_index = spec.index_format is not None and layer < spec.num_mla_layers
            if not has_index:
                offsets.append(_LayerOffsets(latent_offset, None, None))
                continue
            values_offset = cursor
            scales_offset = values_offset + bs * spec.index_value_bytes_per_token
            cursor = _align_up(cursor + self.index_page_bytes)
            offsets.append(_LayerOffsets(latent_offset, values_offset, scales_offset))
        self._offsets = tuple(offsets)
        self.row_bytes: int = cursor  # already a multiple of PAGE_ALIGNMENT

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def bytes_per_token(self) -> float:
        """Logical cache bytes per token over all layers, without alignment padding (§7.2).

        K3.1 fp8 latent + fp8 keys: 576 + 132 = 708 per MLA layer, 16,992 for 24 layers;
        each draft layer adds one latent (576 fp8). Equals `row_bytes / block_size` whenever
        the pages need no padding (every layout at block_size >= 64).
        """
        spec = self.spec
        index_bytes = spec.index_value_bytes_per_token + spec.index_scale_bytes_per_token
        per_mla_layer = spec.latent_bytes_per_token + index_bytes
        return float(
            spec.num_mla_layers * per_mla_layer
            + spec.num_draft_layers * spec.latent_bytes_per_token
        )

    def allocate(self, num_blocks: int, device: torch.device | str) -> torch.Tensor:
        """A zeroed pool: uint8 [num_blocks, row_bytes] on `device`."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        return torch.zeros(num_blocks, self.row_bytes, dtype=torch.uint8, device=device)

    def layer_view(self, pool: torch.Tensor, layer: int) -> MLACacheView:
        """Views of layer `layer`'s pages in `pool` (draft layers follow the target's)."""
        if pool.dtype != torch.uint8 or pool.dim() != 2 or pool.shape[1] != self.row_bytes:
            raise ValueError(
                f"pool must be uint8 [num_blocks, {self.row_bytes}] from PackedLayout.allocate, "
                f"got {pool.dtype} {list(pool.shape)}"
            )
        if pool.stride() != (self.row_bytes, 1):
            raise ValueError("pool must be contiguous; pass the tensor PackedLayout.allocate made")
        if not 0 <= layer < self.spec.num_layers:
            raise ValueError(
                f"layer must be in 0..{self.spec.num_layers - 1} (target MLA layers, then "
                f"draft layers), got {layer}"
            )
        spec, bs = self.spec, self.spec.block_size
        offsets = self._offsets[layer]
        latent = self._region(pool, offsets.latent, self.latent_page_bytes, spec.latent_dtype)
        latent = latent.unflatten(1, (bs, spec.latent_dim))
        if offsets.index_values is None or offsets.index_scales is None:
            return MLACacheView(latent, FP8_LATENT_SCALE, None, None)
        value_bytes = bs * spec.index_value_bytes_per_token
        scale_bytes = bs * spec.index_scale_bytes_per_token
        if spec.index_format == "fp8":
            values_dtype, scales_dtype = fp8_dtype(spec.fp8_variant), torch.float32
        else:
            values_dtype, scales_dtype = torch.uint8, torch.uint8
        index_values = self._region(pool, offsets.index_values, value_bytes, values_dtype)
        index_values = index_values.unflatten(1, (bs, spec.index_value_bytes_per_token))
        index_scales = self._region(pool, offsets.index_scales, scale_bytes, scales_dtype)
        if spec.index_format == "mxfp4":
            index_scales = index_scales.unflatten(1, (bs, spec.index_scale_bytes_per_token))
        return MLACacheView(latent, FP8_LATENT_SCALE, index_values, index_scales)

    @staticmethod
    def _region(
        pool: torch.Tensor, offset: int, num_bytes: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """[num_blocks, num_bytes / itemsize] of `dtype`: a strided view, never a copy."""
        return pool[:, offset : offset + num_bytes].view(dtype)
