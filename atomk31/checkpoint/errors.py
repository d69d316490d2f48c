"""The one error type of checkpoint loading."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that does not match its config.json, or whose files are broken.

    The message lists every problem found in one pass. The lists are kept for programs:
    `missing` (expected tensors not found), `unused` (tensors found that the config does not
    use), `mismatched` (one "name: expected ..., found ..." line each) and `rejected`
    (tensors present in a form atomk31 refuses, such as FP8 indexer weights).
    """

    def __init__(self, message: str, missing: list[str] | None = None,
                 unused: list[str] | None = None, mismatched: list[str] | None = None,
                 rejected: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])
        self.unused = list(unused or [])
        self.mismatched = list(mismatched or [])
        self.rejected = list(rejected or [])
