"""Compact partition ranges: format/parse round trip and the errors a person sees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kgroup.core.ranges import format_ranges, parse_ranges


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1, 2], "0-2"),
        ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
        ([9, 3, 4, 3], "3-4,9"),
        ([99_999], "99999"),
    ],
)
def test_format_folds_runs_and_parse_inverts_it(ids: list[int], text: str) -> None:
    assert format_ranges(ids) == text
    assert parse_ranges(text) == sorted(set(ids))


@given(st.sets(st.integers(min_value=0, max_value=2_000)))
def test_round_trip_keeps_every_partition(ids: set[int]) -> None:
    assert parse_ranges(format_ranges(ids)) == sorted(ids)


def test_parse_tolerates_spaces() -> None:
    assert parse_ranges(" 0-1 , 4 ") == [0, 1, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "expected N or N-M"),
        ("1-", "expected N or N-M"),
        ("1,,2", "expected N or N-M"),
        ("5-3", "need 0 <= N <= M"),
        ("0-3,2", "lists a partition twice"),
    ],
)
def test_parse_refuses_malformed_text_naming_the_piece(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ranges(text)
