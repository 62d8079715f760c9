"""The group's size recommendation from measured rates (kgroup.core.operator.sizing)."""

from __future__ import annotations

import math
import random

import pytest

from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import load_bound
from kgroup.core.operator.sizing import (
    busiest_share,
    member_capacity,
    recommend_members,
)


def test_keeping_up_without_backlog_needs_rate_over_capacity_rounded_to_a_divisor() -> None:
    loads = [1.0] * 64
    # 640 events/s at 100 per member: 6.4 -> 7 members leave one with 10 partitions
    # (10 x 10 = 100/s: exactly its capacity), so 7 works
    assert recommend_members(rate=640, lag=0, capacity=100, loads=loads,
                             catch_up_seconds=300) == 7
    # at 95/s per member 7 does not (its busiest needs 100), 8 divides 64 evenly: 80 each
    assert recommend_members(rate=640, lag=0, capacity=95, loads=loads,
                             catch_up_seconds=300) == 8


def test_the_backlog_is_worked_off_within_the_catch_up_time() -> None:
    loads = [1.0] * 64
    # 400/s plus 120,000 behind in 300 s = 800/s at 100 per member: 8
    assert recommend_members(rate=400, lag=120_000, capacity=100, loads=loads,
                             catch_up_seconds=300) == 8
    # the same backlog in 600 s: 600/s: 6 would leave one member 11 partitions (110/s),
    # 7 leaves 10 (~94/s): 7
    assert recommend_members(rate=400, lag=120_000, capacity=100, loads=loads,
                             catch_up_seconds=600) == 7


def test_the_backlog_is_counted_as_it_will_be_once_new_members_have_started() -> None:
    loads = [1.0] * 64
    # 960/s arrive, the group processes 400/s: 60 s more until new pods work add 33,600
    # behind, 112/s more within 300 s: 1,072/s, 13 members (11 and 12 would leave the
    # busiest above 100/s); the backlog as it is asks for 11
    assert recommend_members(rate=960, lag=0, capacity=100, loads=loads,
                             catch_up_seconds=300, processed=400, start_seconds=60) == 13
    assert recommend_members(rate=960, lag=0, capacity=100, loads=loads,
                             catch_up_seconds=300, processed=400, start_seconds=0) == 11
    assert recommend_members(rate=960, lag=0, capacity=100, loads=loads,
                             catch_up_seconds=300) == 11
    # a group keeping up (or draining: processing more than arrives) falls no further
    # behind while pods start
    for processed in (960.0, 1_500.0):
        assert recommend_members(rate=960, lag=0, capacity=100, loads=loads,
                                 catch_up_seconds=300, processed=processed,
                                 start_seconds=60) == 11


def test_never_more_than_the_partitions() -> None:
    assert recommend_members(rate=10_000, lag=10**9, capacity=1, loads=[1.0] * 12,
                             catch_up_seconds=60) == 12


def test_a_hot_partition_that_alone_exceeds_a_share_raises_the_count_only_while_it_helps() -> None:
    loads = [10.0] + [1.0] * 63  # 73/s in all, the hot one 10/s
    # 4 members at 20/s: 73/4 = 18.25 fits; load mode
    assert recommend_members(rate=73, lag=0, capacity=20, loads=loads,
                             catch_up_seconds=300, count_balanced=False) == 4
    # capacity 9: no member can take the hot partition alone; 9 members are needed for
    # the total (73 / 9), and there the busiest already holds the hot one alone: more
    # members do not help (it was the ceiling, 64, before)
    assert recommend_members(rate=73, lag=0, capacity=9, loads=loads,
                             catch_up_seconds=300, count_balanced=False) == 9
    assert recommend_members(rate=73, lag=0, capacity=9, loads=loads,
                             catch_up_seconds=300, count_balanced=True) == 9
    # a hot partition at 30/s: from 3 members on its member is the busiest whatever the
    # count (73 / 3 < 30); the capacity 9 asks 9 for the total
    hot = [30.0] + [1.0] * 43
    assert recommend_members(rate=73, lag=0, capacity=9, loads=hot,
                             catch_up_seconds=300, count_balanced=False) == 9
    # and with a capacity above the total but below the hot partition: 3, not 44
    assert recommend_members(rate=73, lag=0, capacity=25, loads=hot,
                             catch_up_seconds=300, count_balanced=False) == 3


def test_no_capacity_known_is_no_recommendation() -> None:
    assert recommend_members(rate=0, lag=50, capacity=None, loads=[1.0] * 4,
                             catch_up_seconds=300) is None


def test_no_demand_needs_one_member() -> None:
    assert recommend_members(rate=0, lag=0, capacity=5, loads=[0.0] * 4,
                             catch_up_seconds=300) == 1


@pytest.mark.parametrize(("rate", "lag", "catch_up"), [(-1, 0, 300), (math.nan, 0, 300),
                                                        (1, -1, 300), (1, 0, 0)])
def test_bad_figures_are_refused(rate: float, lag: int, catch_up: float) -> None:
    with pytest.raises(ValueError):
        recommend_members(rate=rate, lag=lag, capacity=1, loads=[1.0], catch_up_seconds=catch_up)


def test_capacity_is_the_fastest_member_that_is_behind() -> None:
    rates = {"a": 50.0, "b": 80.0, "c": 90.0}
    lags = {"a": 10_000, "b": 5_000, "c": 0}  # a and b are more than 10 s behind
    assert member_capacity(rates, lags) == 80.0


def test_capacity_without_anyone_behind_is_the_busiest_rate() -> None:
    assert member_capacity({"a": 50.0, "b": 80.0}, {"a": 100, "b": 0}) == 80.0
    assert member_capacity({"a": 0.0}, {"a": 100}) is None
    assert member_capacity({}, {}) is None


def test_busiest_share_equals_load_bound_on_random_loads() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        m = rng.randint(1, 12)
        loads = [rng.choice([0.0, rng.random(), 10 * rng.random()]) for _ in range(n)]
        members = [Assignee(f"m{i}") for i in range(m)]
        assert busiest_share(m, loads, count_balanced=False) == pytest.approx(
            load_bound(loads, members), rel=1e-9)


def test_count_balance_adds_the_uneven_count() -> None:
    assert busiest_share(9, [1.0] * 64, count_balanced=True) == pytest.approx(8 * 9 / 64)
    assert busiest_share(8, [1.0] * 64, count_balanced=True) == 1.0
