"""kv_write: store MLA latent rows and index keys into one layer's paged cache.

Contract
--------
Inputs (Nt = tokens written this forward):
  latent        [Nt, 576] float (fp32 or bf16): the row `[c 512 | k_r 64]` (§4.5, §7.1).
  index_key     [Nt, 128] float: the indexer key `k` after its LayerNorm (§4.6).
  slot_mapping  [Nt] int64: slot = block_id * block_size + offset; -1 = do not write.
                Slots other than -1 must be distinct.
  latent_cache  [num_blocks, block_size, 576] of float32 | bfloat16 | float8_e4m3fn |
                float8_e4m3fnuz. Any strides: the cache package hands out views of a
                uint8 pool row.
  latent_scale  float > 0: static per-layer scale of an fp8 latent (§7.1, §9 #15);
                ignored for float caches.
  index_values / index_scales: one layer's index-key cache (§4.6.1),
      "fp8":   values [num_blocks, block_size, 128] float8 of `fp8_variant`,
               scales [num_blocks, block_size] float32;
      "mxfp4": values [num_blocks, block_size, 64] uint8 (two E2M1 codes per byte,
               low nibble = even index), scales [num_blocks, block_size, 4] uint8 E8M0.
  index_format  "fp8" | "mxfp4";  fp8_variant "e4m3fn" | "e4m3fnuz" (§6.1).
Output: none; the caches are written in place.

Storage rules:
  fp8 latent   stored = e4m3(clamp(x / latent_scale, ±fmax)), round-to-nearest-even,
               saturating (torch's cast does not saturate, hence the clamp); read = stored * scale.
  float latent stored = x cast to the cache dtype (RNE).
  fp8 key      s = max(amax(k), 1e-4) / fmax over the 128 values, k̂ = e4m3(clamp(k / s, ±fmax))
               (§4.6.1, §9 #4).
  mxfp4 key    the §6.3 quantizer, one E8M0 scale per 32 values (atomk31.quant).

Also here: `read_latent` and `read_index_keys` (the dequantizing readers the other ops and
the tests use). The one index-key quantizer, `quantize_index_keys` / `dequantize_index_keys`
(shared with the indexer's query side, §4.6 "Quantized evaluation"), lives in
atomk31/quant/index_keys.py, where kernels may import it too; it is re-exported here.

Accumulation: none (elementwise, fp32). Tests: bit-exact round trips against the quantizers.
"""

import torch

from atomk31.ops.registry import register
from atomk31.ops.requirements import READS_DEVICE, needs_gpu
from atomk31.quant import quantize_fp8
from atomk31.quant.index_keys import (  # noqa: F401 (re-exported: part of this op's API)
    FP8_INDEX_AMAX_FLOOR, INDEX_DIM, INDEX_FORMATS, dequantize_index_keys, quantize_index_keys,
)

LATENT_DIM = 576  # [c 512 | k_r 64], §4.5
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
LATENT_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def fp8_variant_of(dtype: torch.dtype) -> str | None:
    """The §6.1 variant name of an fp8 dtype, or None for any other dtype."""
    for name, fp8_dtype in FP8_DTYPES.items():
        if dtype == fp8_dtype:
            return name
    return None


def check_latent_cache(latent_cache: torch.Tensor, latent_scale: float) -> None:
    """Raise ValueError unless `latent_cache` is [num_blocks, block_size, 576] of a cache dtype."""
    if latent_cache.dim() != 3 or latent_cache.shape[-1] != LATENT_DIM:
        raise ValueError(
            f"latent_cache must be [num_blocks, block_size, {LATENT_DIM}], got "
            f"{list(latent_cache.shape)}; pass one MLA layer's latent page view"
        )
    if latent_cache.dtype not in LATENT_DTYPES:
        raise ValueError(
            f"latent_cache dtype must be one of {LATENT_DTYPES}, got {latent_cache.dtype}"
        )
    if not latent_scale > 0:
        raise ValueError(f"latent_scale must be a positive float, got {latent_scale}")


def check_index_cache(
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
) -> None:
    """Raise ValueError unless the index-key cache matches `index_format` (§4.6.1)."""
    if index_format not in INDEX_FORMATS:
        raise ValueError(f"index_format must be one of {INDEX_FORMATS}, got {index_format!r}")
    if fp8_variant not in FP8_DTYPES:
        raise ValueError(
            f"fp8_variant must be one of {tuple(FP8_DTYPES)}, got {fp8_variant!r}"
        )
    if index_format == "fp8":
        values_dtype, values_width = FP8_DTYPES[fp8_variant], INDEX_DIM
        scales_dtype, scales_tail = torch.float32, ()
    else:
        values_dtype, values_width = torch.uint8, INDEX_DIM // 2
        scales_dtype, scales_tail = torch.uint8, (INDEX_DIM // 32,)
    if (
        index_values.dim() != 3
        or index_values.shape[-1] != values_width
        or index_values.dtype != values_dtype
    ):
        raise ValueError(
            f"index_values for format {index_format!r} must be [num_blocks, block_size, "
            f"{values_width}] {values_dtype}, got {list(index_values.shape)} "
            f"{index_values.dtype}"
        )
    expected_scales = (*index_values.shape[:2], *scales_tail)
    if tuple(index_scales.shape) != expected_scales or index_scales.dtype != scales_dtype:
        raise ValueError(
            f"index_scales for format {index_format!r} must be {list(expected_scales)} "
            f"{scales_dtype}, got {list(index_scales.shape)} {index_scales.dtype}"
        )


def _block_and_offset(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split slots (-1 mapped to slot 0, to be masked by the caller) into (block, offset)."""
    safe = slots.long().clamp_min(0)
    return safe // block_size, safe % block_size


def read_latent(
    latent_cache: torch.Tensor, latent_scale: float, slots: torch.Tensor
) -> torch.Tensor:
    """Dequantized latent rows: slots [...] int -> fp32 [..., 576]; slot -1 reads zeros."""
    check_latent_cache(latent_cache, latent_scale)
    num_blocks, block_size, _ = latent_cache.shape
    if num_blocks == 0:
        return torch.zeros(*slots.shape, LATENT_DIM, device=latent_cache.device)
    block, offset = _block_and_offset(slots, block_size)
    rows = latent_cache[block, offset].float()
    if fp8_variant_of(latent_cache.dtype) is not None:
        rows = rows * latent_scale
    return rows.masked_fill((slots < 0)[..., None], 0.0)


def read_index_keys(
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Dequantized index keys: slots [...] int -> fp32 [..., 128]; slot -1 reads zeros."""
    num_blocks, block_size = index_values.shape[:2]
    if num_blocks == 0:
        return torch.zeros(*slots.shape, INDEX_DIM, device=index_values.device)
    block, offset = _block_and_offset(slots, block_size)
    keys = dequantize_index_keys(
        index_values[block, offset], index_scales[block, offset], index_format
    )
    return keys.masked_fill((slots < 0)[..., None], 0.0)


def kv_write_torch(
    latent: torch.Tensor,
    index_key: torch.Tensor,
    slot_mapping: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    index_values: torch.Tensor,
    index_scales: torch.Tensor,
    index_format: str,
    fp8_variant: str,
) -> None:
    """Write latent rows and index keys of Nt tokens into their slots (see module docstring).

    latent [Nt, 576], index_key [Nt, 128], slot_mapping [Nt] (-1 skipped).
    """
    check_latent_cache(latent_cache, latent_scale)
    check_index_cache(index_values, index_scales, index_format, fp8_variant)
    if index_values.shape[:2] != latent_cache.shape[:2]:
        raise ValueError(
            f"latent_cache and index_values must share [num_blocks, block_size], got "
            f"{list(latent_cache.shape[:2])} and {list(index_values.shape[:2])}"
        )
    num_tokens = slot_mapping.shape[0]
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be [Nt], got {list(slot_mapping.shape)}")
    if tuple(latent.shape) != (num_tokens, LATENT_DIM):
        raise ValueError(
            f"latent must be [Nt={num_tokens}, {LATENT_DIM}], got {list(latent.shape)}"
        )
    if tuple(index_key.shape) != (num_tokens, INDEX_DIM):
        raise ValueError(
            f"index_key must be [Nt={num_tokens}, {INDEX_DIM}], got {list(index_key.shape)}"
        )
    is_written = slot_mapping >= 0
    slots = slot_mapping[is_written]
    block, offset = _block_and_offset(slots, latent_cache.shape[1])

    rows = latent[is_written].float()
    latent_variant = fp8_variant_of(latent_cache.dtype)
    if latent_variant is not None:
        rows = quantize_fp8(rows, latent_scale, latent_variant)  # clamp, then RNE cast (§6.1)
    # Advanced-index assignment writes through any strided view of the pool.
    latent_cache[block, offset] = rows.to(latent_cache.dtype)

    values, scales = quantize_index_keys(index_key[is_written], index_format, fp8_variant)
    index_values[block, offset] = values
    index_scales[block, offset] = scales


kv_write = kv_write_torch


register("kv_write", "torch", kv_write_torch, not_in_graph=READS_DEVICE)
register("kv_write", "triton", "atomk31.triton_kernels.kv_write:kv_write_triton",
         why_not=needs_gpu)
