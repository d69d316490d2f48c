"""The index-key quantizer (MODEL_SPEC §4.6.1, §9 #4): one per code base, shared by the cache
write (`atomk31.ops.kv_write`), the indexer's query side (§4.6 "Quantized evaluation": queries
go through the keys' quantizer) and the kernels that prepare those queries on the host.

Here rather than in the ops layer so that kernel packages may import it (kernels import no
engine code, tests/test_import_graph.py).

  "fp8":   one group of 128 values per key: s = max(amax, 1e-4) / fmax,
           k̂ = e4m3(clamp(k / s, ±fmax)), round to nearest even, saturating; values [..., 128]
           float8 of the variant, scales [...] float32.
  "mxfp4": the §6.3 quantizer, one E8M0 scale per 32 values; values [..., 64] uint8 (two E2M1
           codes per byte, low nibble = even index), scales [..., 4] uint8.
"""

import torch

from atomk31.quant.fp8 import quantize_fp8_per_row
from atomk31.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4

INDEX_DIM = 128  # d_I, one FP8 scale or four MXFP4 scales per key (§4.6.1)
INDEX_FORMATS = ("fp8", "mxfp4")
# V3.2's floor on the amax of an FP8 index key (§4.6.1): keeps an all-zero key finite.
FP8_INDEX_AMAX_FLOOR = 1e-4


def quantize_index_keys(
    x: torch.Tensor, index_format: str, fp8_variant: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize index keys (or indexer queries) per group of 128 values (module docstring).

    x: [..., 128] float. Returns (values, scales):
      "fp8":   values [..., 128] float8 of `fp8_variant`, scales [...] float32;
      "mxfp4": values [..., 64] uint8 packed E2M1, scales [..., 4] uint8 E8M0.
    """
    if x.shape[-1] != INDEX_DIM:
        raise ValueError(f"index keys must have {INDEX_DIM} values, got shape {list(x.shape)}")
    x = x.float()
    if index_format == "mxfp4":
        return quantize_mxfp4(x)
    if index_format != "fp8":
        raise ValueError(f"index_format must be one of {INDEX_FORMATS}, got {index_format!r}")
    return quantize_fp8_per_row(x, fp8_variant, min_amax=FP8_INDEX_AMAX_FLOOR)


def dequantize_index_keys(
    values: torch.Tensor, scales: torch.Tensor, index_format: str
) -> torch.Tensor:
    """Inverse of `quantize_index_keys`: fp32 [..., 128]."""
    if index_format == "mxfp4":
        return dequantize_mxfp4(values, scales, dtype=torch.float32)
    return values.float() * scales[..., None].float()
