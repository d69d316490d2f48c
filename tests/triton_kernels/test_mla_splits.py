"""The MLA launchers' shared split plan (atomk31/triton_kernels/mla_splits.py): whole key tiles
a split, no empty split, the outputs themselves as the kernel's target for one split, and the
rows of one request that share a dense program. Host arithmetic only."""

import torch

from atomk31.triton_kernels.mla_splits import (
    default_splits, key_splits, rows_per_program, split_outputs,
)


def test_key_splits_are_whole_tiles_and_never_empty():
    assert key_splits(16384, 64, 4) == (4, 4096)
    assert key_splits(130, 64, 2) == (2, 128)  # 3 tiles: 2 + 1
    assert key_splits(1, 64, 8) == (1, 64)  # one key: one split of one tile
    assert key_splits(2048, 64, 40) == (32, 64)  # at most one split a tile
    assert key_splits(0, 64, 3) == (1, 64)  # no key (a row of no request): one empty split


def test_default_splits_fill_the_multiprocessors_with_splits_of_four_tiles_or_more():
    assert default_splits(128, 2048, 64, 132) == 1  # already ~one wave
    assert default_splits(32, 2048, 64, 132) == 4
    assert default_splits(32, 256, 64, 132) == 1  # 4 tiles: one split of 4
    assert default_splits(1, 1, 64, 1) == 1


def test_split_outputs_are_the_outputs_for_one_split():
    out, lse = torch.zeros(3, 5, 512), torch.zeros(3, 5)
    partial_out, partial_lse = split_outputs(out, lse, 1)
    assert partial_out.data_ptr() == out.data_ptr() and partial_out.shape == (3, 5, 1, 512)
    assert partial_lse.data_ptr() == lse.data_ptr() and partial_lse.shape == (3, 5, 1)
    partial_out, partial_lse = split_outputs(out, lse, 3)
    assert partial_out.shape == (3, 5, 3, 512) and partial_lse.shape == (3, 5, 3)
    assert partial_out.data_ptr() != out.data_ptr()


def test_rows_per_program_divides_the_promised_runs():
    assert rows_per_program(None) == 1
    assert rows_per_program(1) == 1
    assert rows_per_program(4) == 4
    assert rows_per_program(6) == 2
    assert rows_per_program(3) == 1
    assert rows_per_program(4, num_rows=6) == 2  # whole groups only (the Gluon view)
    assert rows_per_program(4, num_rows=5) == 1
