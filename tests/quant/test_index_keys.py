"""The index-key quantizer (atomk31/quant/index_keys.py, MODEL_SPEC §4.6.1) against the oracle's
number formats, bit for bit, and its refusals."""

import pytest
import torch

from atomk31.quant.index_keys import (
    FP8_INDEX_AMAX_FLOOR, dequantize_index_keys, quantize_index_keys,
)
from atomk31.reference.formats import quantize_mxfp4 as reference_quantize_mxfp4
from atomk31.reference.formats import round_to_e4m3


@pytest.mark.parametrize("fp8_variant", ["e4m3fn", "e4m3fnuz"])
def test_fp8_bytes_match_the_oracle(fp8_variant):
    keys = torch.randn(5, 128, generator=torch.Generator().manual_seed(3)) * 7.0
    keys[2] = 0.0  # the amax floor keeps the scale finite
    values, scales = quantize_index_keys(keys, "fp8", fp8_variant)
    fmax = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}[fp8_variant]
    want_scales = keys.abs().amax(-1).clamp_min(FP8_INDEX_AMAX_FLOOR) / fmax
    assert torch.equal(scales, want_scales)
    assert torch.equal(values.float(), round_to_e4m3(keys / want_scales[:, None], fp8_variant))
    assert torch.equal(dequantize_index_keys(values, scales, "fp8"),
                       values.float() * scales[:, None])


def test_mxfp4_bytes_match_the_oracle_and_round_trip_on_the_grid():
    keys = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(4))  # any leading dims
    values, scales = quantize_index_keys(keys, "mxfp4", "e4m3fn")
    want_values, want_scales = reference_quantize_mxfp4(keys.view(-1, 128))
    assert values.shape == (2, 3, 64) and scales.shape == (2, 3, 4)
    assert torch.equal(values.view(-1, 64), want_values)
    assert torch.equal(scales.view(-1, 4), want_scales)
    again = quantize_index_keys(dequantize_index_keys(values, scales, "mxfp4"), "mxfp4",
                                "e4m3fn")
    assert torch.equal(again[0], values) and torch.equal(again[1], scales)


def test_refuses_keys_of_another_width_and_unknown_formats():
    with pytest.raises(ValueError, match=r"index keys must have 128 values, got shape \[2, 64\]"):
        quantize_index_keys(torch.zeros(2, 64), "fp8", "e4m3fn")
    with pytest.raises(ValueError, match=r"index_format must be one of \('fp8', 'mxfp4'\), "
                                         r"got 'int8'"):
        quantize_index_keys(torch.zeros(2, 128), "int8", "e4m3fn")
