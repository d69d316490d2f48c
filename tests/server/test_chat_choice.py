"""server/chat_choice.py: stop strings on the response channel, fed piece by piece."""

from __future__ import annotations

import pytest

from server.chat_choice import ContentStopFilter


def run(stop: list[str], pieces: list[str]) -> tuple[str, bool]:
    """Feed pieces until a match; -> (all text released, whether a stop string matched)."""
    stop_filter = ContentStopFilter(stop)
    released = ""
    for piece in pieces:
        text, is_stopped = stop_filter.feed(piece)
        released += text
        if is_stopped:
            return released, True
    return released + stop_filter.flush(), False


@pytest.mark.parametrize("stop, pieces, expected", [
    (["END"], ["abc", "END", "x"], ("abc", True)),
    (["END"], ["ab", "cE", "N", "Dx"], ("abc", True)),
    (["END"], ["E", "N", "x"], ("ENx", False)),
    (["END"], ["abcEN"], ("abcEN", False)),
    (["ab", "b"], ["xab"], ("x", True)),
    (["b", "ab"], ["x", "a", "b"], ("x", True)),
    (["long stop", "op"], ["a lo", "ng st", "op"], ("a ", True)),
    ([], ["anything"], ("anything", False)),
    (["x"], [""], ("", False)),
    (["é!"], ["caf", "é", "!"], ("caf", True)),
], ids=["whole", "spans-pieces", "partial-then-no", "partial-at-end", "earliest-start",
        "earliest-across-pieces", "overlapping-stops", "no-stops", "empty", "unicode"])
def test_stop_filter(stop, pieces, expected):
    assert run(stop, pieces) == expected


def test_stop_filter_holds_back_only_a_possible_start():
    stop_filter = ContentStopFilter(["<END>"])
    assert stop_filter.feed("hello <E") == ("hello ", False)
    assert stop_filter.held == "<E"
    assert stop_filter.feed("x") == ("<Ex", False)


def test_stop_filter_ignores_stops_before_min_tokens():
    stop_filter = ContentStopFilter(["a"])
    assert stop_filter.feed("bab", may_stop=False) == ("bab", False)
    assert stop_filter.feed("cad") == ("c", True)
