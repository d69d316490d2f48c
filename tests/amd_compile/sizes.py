"""Run-time sizes of the Triton launch examples, one set per size case.

A launch specializes every int argument: Triton compiles one equal to 1 as a constant and marks
one divisible by 16, so a kernel that compiles at some sizes can fail at others (an int of 1
has no ``.to``). Each example therefore runs once per SIZE_CASES entry (the cases of the Gluon
examples, gluon_kernels/compile.py): every run-time size equal to 1, every one a multiple of
16, and none of either. Run-time sizes are what a call may bring (tokens, rows, requests,
cache blocks, sequence lengths); model constants (heads, head and hidden widths, top-k) stay
as the model has them.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gluon_kernels.compile import SIZE_CASES


@dataclass(frozen=True)
class Sizes:
    """One size case: ``sizes(n)`` is the case's value of a run-time size whose unaligned
    value is n (n > 1 and not a multiple of 16): 1, the multiple of 16 at or above n, or n."""

    case: str

    def __call__(self, unaligned: int) -> int:
        if unaligned <= 1 or unaligned % 16 == 0:
            raise ValueError(f"an example's unaligned size must be > 1 and no multiple of 16, "
                             f"got {unaligned}")
        if self.case == "ones":
            return 1
        if self.case == "multiples_of_16":
            return -(-unaligned // 16) * 16
        if self.case == "unaligned":
            return unaligned
        raise ValueError(f"unknown size case {self.case!r}; expected one of {SIZE_CASES}")


def sized(name: str, example: Callable[[Sizes], None]) -> dict[str, Callable[[], None]]:
    """``example`` once per size case, named "<name>@<case>"."""
    return {f"{name}@{case}": functools.partial(example, Sizes(case)) for case in SIZE_CASES}


def known(table: dict, example: str):
    """``table``'s entry for an example ("<name>@<case>"): the entry for that case, else the
    one for every case of the name (None: none)."""
    return table.get(example, table.get(example.split("@")[0]))
