"""Example cases of the assignors: the interface, the errors, the documented tie-breaks."""

from __future__ import annotations

import pytest

from kgroup.core.operator.assignors import (
    Assignee,
    RangeAssignor,
    StickyAssignor,
    get_assignor,
    lower_bound_moves,
    moved_partitions,
)


def ms(*ids: str) -> list[Assignee]:
    return [Assignee(i) for i in ids]


def test_get_assignor_knows_sticky_and_range() -> None:
    assert isinstance(get_assignor("sticky"), StickyAssignor)
    assert isinstance(get_assignor("range"), RangeAssignor)
    assert get_assignor("sticky").name == "sticky"


def test_get_assignor_refuses_an_unknown_name_listing_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match="unknown assignor 'roundrobin': expected one of range, sticky"
    ):
        get_assignor("roundrobin")


@pytest.mark.parametrize("name", ["sticky", "range"])
def test_no_members_means_no_assignment(name: str) -> None:
    assert get_assignor(name).assign(8, [], {"gone": [0, 1]}, {2: "gone"}) == {}


@pytest.mark.parametrize("name", ["sticky", "range"])
def test_more_members_than_partitions_leaves_some_empty(name: str) -> None:
    result = get_assignor(name).assign(2, ms("a", "b", "c"), {}, {})
    assert sorted(len(ps) for ps in result.values()) == [0, 1, 1]
    assert set(result) == {"a", "b", "c"}


@pytest.mark.parametrize("name", ["sticky", "range"])
def test_duplicate_member_ids_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="member 'a' is listed twice"):
        get_assignor(name).assign(4, ms("a", "a"), {}, {})


def test_weights_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="weights must be >= 1"):
        get_assignor("sticky").assign(4, [Assignee("a", 0)], {}, {})


def test_sticky_initial_assignment_is_contiguous_in_id_order() -> None:
    result = get_assignor("sticky").assign(8, ms("b", "a", "c"), {}, {})
    assert result == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}


def test_sticky_gives_the_extra_to_whoever_holds_more() -> None:
    # 7 partitions over 2: the one that holds 5 keeps 4, not the first by id
    current = {"a": [0, 1], "b": [2, 3, 4, 5, 6]}
    result = get_assignor("sticky").assign(7, ms("a", "b"), current, {})
    assert len(result["b"]) == 4
    assert result["b"] == [2, 3, 4, 5], "the highest-numbered partition is given up first"
    assert result["a"] == [0, 1, 6]


def test_sticky_weighted_share_is_proportional() -> None:
    result = get_assignor("sticky").assign(12, [Assignee("a", 1), Assignee("b", 2)], {}, {})
    assert [len(result["a"]), len(result["b"])] == [4, 8]


def test_sticky_reseeds_from_lock_holders_when_the_target_is_empty() -> None:
    holders = {0: "b", 1: "b", 2: "a", 3: "a", 4: "gone"}
    result = get_assignor("sticky").assign(5, ms("a", "b"), {}, holders)
    assert result["b"][:2] == [0, 1] and result["a"][:2] == [2, 3]
    assert lower_bound_moves(5, ms("a", "b"), {}, holders) == 1  # only partition 4


def test_sticky_current_wins_over_holders() -> None:
    result = get_assignor("sticky").assign(2, ms("a", "b"), {"a": [0], "b": [1]}, {0: "b", 1: "a"})
    assert result == {"a": [0], "b": [1]}


def test_sticky_ignores_out_of_range_and_duplicate_claims_in_current() -> None:
    current = {"b": [0, 1, 99], "a": [1]}
    result = get_assignor("sticky").assign(2, ms("a", "b"), current, {})
    assert result == {"a": [1], "b": [0]}, "a duplicate claim goes to the smaller id"


def test_moved_partitions_counts_new_changed_and_dropped_owners() -> None:
    before = {"a": [0, 1], "b": [2]}
    after = {"a": [0], "b": [1, 2], "c": [3]}
    assert moved_partitions(before, after) == 2  # 1 changed, 3 newly assigned
    assert moved_partitions({"a": [0, 1]}, {"a": [0]}) == 1  # 1 lost its owner
    assert moved_partitions(after, after) == 0
