"""The key-split plan of the MLA launchers (sparse and dense MLA, Triton and Gluon alike): how
many splits of a row's keys run as separate programs (flash-decoding), where each split's
partial output goes, and how many rows of one request share a program's keys.

Shared by atomk31/triton_kernels/mla_launch.py and gluon_kernels/hopper/ (kernels import no
engine code: tests/test_import_graph.py), so both split and merge the same way: a split is
whole key tiles, no split is empty, and one split writes the outputs themselves; several write
fp32 partials that `mla_combine` merges by their log-sum-exp.
"""

import torch
import triton

MIN_TILES_PER_SPLIT = 4  # shorter splits cost more in partial writes and merging than they win
GROUPABLE_ROWS = (4, 2)  # rows of one request a dense program may take, largest first
VALUE_DIM = 512


def fewest_splits_filling_waves(num_programs: int, num_sms: int, max_splits: int) -> int:
    """Key splits per program: the fewest (each costs a partial write and the merge) whose
    waves of programs (num_sms programs at once) keep >= 85% of them busy, else the best
    filling one up to max_splits."""
    def busy_fraction(splits: int) -> float:
        num_waves = triton.cdiv(num_programs * splits, num_sms)
        return num_programs * splits / (num_waves * num_sms)

    if num_programs == 0:
        return 1
    candidates = range(1, max(1, max_splits) + 1)
    good = [s for s in candidates if busy_fraction(s) >= 0.85]
    return good[0] if good else max(candidates, key=busy_fraction)


def key_splits(num_keys: int, block_n: int, num_splits: int) -> tuple[int, int]:
    """(splits, keys per split) of `num_keys` keys asked to run as `num_splits` splits: each a
    whole number of `block_n`-key tiles, at most one split a tile, none empty."""
    num_tiles = max(1, triton.cdiv(num_keys, block_n))
    keys_per_split = triton.cdiv(num_tiles, max(1, min(num_splits, num_tiles))) * block_n
    return max(1, triton.cdiv(num_keys, keys_per_split)), keys_per_split


def default_splits(num_programs: int, num_keys: int, block_n: int, num_sms: int) -> int:
    """The fewest splits that fill `num_sms` multiprocessors with `num_programs` programs a
    split, each split at least MIN_TILES_PER_SPLIT tiles."""
    num_tiles = max(1, triton.cdiv(num_keys, block_n))
    return fewest_splits_filling_waves(num_programs, num_sms,
                                       triton.cdiv(num_tiles, MIN_TILES_PER_SPLIT))


def split_outputs(out: torch.Tensor, lse: torch.Tensor,
                  num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the kernels write ([rows, heads, splits, 512], [rows, heads, splits]): `out` and
    `lse` themselves for one split, else fp32 partials for `mla_combine`."""
    if num_splits == 1:
        return out[:, :, None, :], lse[:, :, None]
    rows, heads = lse.shape
    return (torch.empty(rows, heads, num_splits, VALUE_DIM, dtype=torch.float32,
                        device=out.device),
            torch.empty(rows, heads, num_splits, dtype=torch.float32, device=out.device))


def rows_per_program(rows_per_request: int | None, num_rows: int | None = None) -> int:
    """Consecutive rows of one request that share a dense program's keys: the largest of
    GROUPABLE_ROWS dividing the run length the caller promises (and `num_rows`, for kernels
    that view the rows as whole groups), else 1."""
    if rows_per_request is None:
        return 1
    return next((rows for rows in GROUPABLE_ROWS if rows_per_request % rows == 0
                 and (num_rows is None or num_rows % rows == 0)), 1)

