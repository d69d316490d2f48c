"""Number formats: FP8 E4M3 (fn/fnuz), E8M0, E2M1, MXFP4 and NVFP4 (MODEL_SPEC §6)."""

from atomk31.quant.e2m1 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1
from atomk31.quant.e8m0 import e8m0_to_float, float_to_e8m0
from atomk31.quant.fp8 import (
    FP8_VARIANTS,
    convert_e4m3fn_to_e4m3fnuz,
    decode_e4m3,
    dequantize_fp8,
    dequantize_fp8_per_group,
    encode_e4m3,
    fp8_dtype,
    fp8_max,
    fp8_scale,
    quantize_fp8,
    quantize_fp8_per_group,
    quantize_fp8_per_row,
    quantize_fp8_per_tensor,
)
from atomk31.quant.mxfp4 import (
    MXFP4_BLOCK_SIZE,
    dequantize_mxfp4,
    mxfp4_scale_exponent,
    quantize_mxfp4,
)
from atomk31.quant.nvfp4 import NVFP4_BLOCK_SIZE, dequantize_nvfp4, quantize_nvfp4

__all__ = [
    "FP8_VARIANTS",
    "MXFP4_BLOCK_SIZE",
    "NVFP4_BLOCK_SIZE",
    "convert_e4m3fn_to_e4m3fnuz",
    "decode_e2m1",
    "decode_e4m3",
    "dequantize_fp8",
    "dequantize_fp8_per_group",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "e8m0_to_float",
    "encode_e2m1",
    "encode_e4m3",
    "float_to_e8m0",
    "fp8_dtype",
    "fp8_max",
    "fp8_scale",
    "mxfp4_scale_exponent",
    "pack_e2m1",
    "quantize_fp8",
    "quantize_fp8_per_group",
    "quantize_fp8_per_row",
    "quantize_fp8_per_tensor",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "unpack_e2m1",
]
