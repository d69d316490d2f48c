"""The one error type of `atomk31 bench`: a benchmark cannot run as asked.

`atomk31 bench` prints such an error's message (which says what to change) and exits with 2;
any other exception is a bug and keeps its traceback.
"""


class BenchmarkError(ValueError):
    """A benchmark cannot run as asked (a bad flag, an unreachable server, a cache too small)."""
