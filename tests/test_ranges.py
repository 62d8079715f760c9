"""Compact partition ranges: format/parse round trip and the errors a person sees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kgroup.core.ranges import (
    clip_ranges,
    format_ranges,
    format_sequence,
    parse_ranges,
    parse_sequence,
)


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


# -- bounded parsing ("0-99999999" in a status once OOM-killed the operator) ------------


@pytest.mark.parametrize(
    ("text", "limit", "message"),
    [
        ("0-99999999", 16, r"partition 99999999 is beyond the group's partitions \(0-15\)"),
        ("0-15,16", 16, "partition 16 is beyond"),
        ("0-99999999999999999999", 100_000, "expected N or N-M"),
        ("0-100000", 100_000, "partition 100000 is beyond"),
        (",".join(["0-3"] * 200), 16, "longer than any list of 16 partitions"),
        ("0-9,5-20", 100, "lists a partition twice"),
    ],
)
def test_parse_refuses_ranges_beyond_the_limit_without_expanding(
        text: str, limit: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ranges(text, limit=limit)


def test_parse_of_a_huge_range_allocates_nothing() -> None:
    """The parse must refuse before it expands: with today's limit of 100,000 a range of
    10^15 partitions would need petabytes, so finishing at all shows nothing was built."""
    import tracemalloc
    tracemalloc.start()
    with pytest.raises(ValueError):
        parse_ranges("0-999999999", limit=100_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100_000


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("0-99999999", 4, [0, 1, 2, 3]),
        ("2,0-1,1-3,50-60", 6, [0, 1, 2, 3]),
        ("", 4, []),
        ("a-b", 4, None),
        ("7-9", 4, []),
        (",".join(["0-3"] * 200), 4, None),
    ],
)
def test_clip_keeps_what_lies_below_the_limit(
        text: str, limit: int, expected: list[int] | None) -> None:
    assert clip_ranges(text, limit=limit) == expected


# -- ordered sequences (a generation's partitions in hash order) ---------------------------


def test_a_sequence_keeps_its_order_and_folds_ascending_runs() -> None:
    assert format_sequence([16, 40, 41, 18, 19, 20]) == "16,40-41,18-20"
    assert parse_sequence("16,40-41,18-20", most=6) == [16, 40, 41, 18, 19, 20]
    assert format_sequence([]) == "" and parse_sequence(" ", most=0) == []


@given(st.lists(st.integers(min_value=0, max_value=999_999_999), unique=True, max_size=50))
def test_a_sequence_round_trips(ids: list[int]) -> None:
    assert parse_sequence(format_sequence(ids), most=len(ids)) == ids


@pytest.mark.parametrize(
    ("text", "most", "message"),
    [
        ("3,1-4", 10, "lists a partition twice"),
        ("0-999999999", 100, "names 1000000000 partitions, more than 100"),
        ("1," * 100, 2, "longer than any list of 2 partitions"),
        ("1-x", 10, "expected N or N-M"),
    ],
)
def test_a_sequence_is_refused_before_it_is_expanded(text: str, most: int,
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sequence(text, most=most)
