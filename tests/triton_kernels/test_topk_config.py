"""TopkConfig (atomk31/triton_kernels/topk_config.py): the defaults each target and batch
resolve to, and the refusals that name the field. Host logic only."""

import pytest
import torch

from atomk31.triton_kernels.topk_config import FUSED_THRESHOLD_MIN_ROWS, TopkConfig, check, resolve

CPU = torch.device("cpu")


def test_nvidia_fuses_stage_1b_from_64_rows_and_the_overflow_rescan():
    many = resolve(TopkConfig(), FUSED_THRESHOLD_MIN_ROWS, is_cuda=True, is_interpreter=False,
                   device=CPU)
    assert many.fuse_threshold and many.fuse_overflow
    assert many.programs_per_row == 1 and many.group_max_warps == many.threshold_warps
    assert many.group_max_stages == 6
    few = resolve(TopkConfig(), 1, is_cuda=True, is_interpreter=False, device=CPU)
    assert not few.fuse_threshold and few.group_max_warps == 4 and few.group_max_stages == 3
    assert few.programs_per_row == 2  # half of 4 programs per SM (1 SM off a GPU), one row


def test_amd_keeps_the_overflow_kernel_and_eight_warps_in_stage_1():
    amd = resolve(TopkConfig(), 64, is_cuda=False, is_interpreter=False, device=CPU)
    assert not amd.fuse_threshold and not amd.fuse_overflow and amd.group_max_warps == 8


def test_a_caller_s_fields_are_kept():
    config = TopkConfig(programs_per_row=3, fuse_threshold=False, group_max_stages=1)
    resolved = resolve(config, 64, is_cuda=True, is_interpreter=False, device=CPU)
    assert (resolved.programs_per_row, resolved.fuse_threshold, resolved.group_max_stages) == \
        (3, False, 1)


@pytest.mark.parametrize("field, value, message", [
    ("capacity_factor", 3, r"capacity_factor must be 1, 2 or 4, got 3"),
    ("collect_block", 48, r"collect_block must be a power of two >= 1, got 48"),
    ("collect_stages", 0, r"collect_stages must be >= 1, got 0"),
    ("group_max_stages", 0, r"group_max_stages must be >= 1, got 0"),
    ("threshold_slack", -2, r"threshold_slack must be >= -1 \(-1: exact\), got -2"),
])
def test_refusals_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        check(TopkConfig(**{field: value}))
