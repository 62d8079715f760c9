"""The group's load in the status: member Leases' kgroup.dev/load read back by the operator
(kgroup.core.operator.load_status), and its pace in the operator's passes (decide)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from test_operator_logic import Op, held_lease, member_lease

from kgroup.core.load import encode_load
from kgroup.core.operator.load_status import (
    LOAD_REFRESH_SECONDS,
    SETTINGS_TAKE_GAP,
    History,
    LoadTracker,
    Taken,
    group_load,
    load_status,
)
from kgroup.core.operator.status import MemberLeaseObservation
from kgroup.crd_models import LoadStatus

WALL = datetime(2026, 1, 1, tzinfo=UTC)


def obs(member: str, rates: dict[int, float], lags: dict[int, int] | None = None
        ) -> MemberLeaseObservation:
    return MemberLeaseObservation(member, f"s-{member}", None, None,
                                  encode_load(rates, lags or {}))


def test_a_rate_counts_only_while_its_reporter_holds_the_partition() -> None:
    leases = {"a": obs("a", {0: 10.0, 1: 20.0}, {0: 5}),
              "b": obs("b", {1: 30.0, 2: 40.0}, {2: 7})}
    holders = {0: "a", 1: "b", 2: "b"}  # 1 moved from a to b: a's figure is stale
    load = group_load(leases, holders, partitions=3)
    assert load is not None
    assert load.partition_rates == pytest.approx({0: 10.0, 1: 30.0, 2: 40.0}, rel=3e-3)
    assert load.member_rates == pytest.approx({"a": 10.0, "b": 70.0}, rel=3e-3)
    assert load.lag == 12 and load.member_lags == {"a": 5, "b": 7}


def test_no_report_is_no_load() -> None:
    leases = {"a": MemberLeaseObservation("a", "s-a", None, None, None)}
    assert group_load(leases, {0: "a"}, partitions=1) is None


def test_totals_alone_are_spread_over_what_the_member_holds() -> None:
    lone = MemberLeaseObservation("a", "s-a", None, None, '{"n":3,"rate":30,"v":1}')
    load = group_load({"a": lone}, {0: "a", 1: "a", 2: "a"}, partitions=4)
    assert load is not None and load.partition_rates == {0: 10.0, 1: 10.0, 2: 10.0}


def test_the_status_figures_of_a_skewed_group() -> None:
    # 8 partitions on 2 members; partition 0 is hot
    rates = {0: 40.0, 1: 5.0, 2: 5.0, 3: 5.0}
    leases = {"a": obs("a", rates), "b": obs("b", {4: 5.0, 5: 5.0, 6: 5.0, 7: 5.0})}
    holders = {p: "a" if p < 4 else "b" for p in range(8)}
    load = group_load(leases, holders, partitions=8)
    assert load is not None
    status, members = load_status(load, ["a", "b"], 8, catch_up_seconds=300, wall=WALL)
    assert status.rate == pytest.approx(75.0, rel=3e-3)
    assert status.busiest_over_mean == pytest.approx(55 / 37.5, rel=3e-3)
    assert status.bound == pytest.approx(40 / 37.5, rel=3e-3)  # the hot one alone
    # nobody behind: capacity at least the busiest's 55/s; 75/s on 2 members of 8
    # partitions by count: 2 keep up only if the busiest's 4 partitions fit (they do)
    assert status.recommended_members == 2
    assert status.measured_at == "2026-01-01T00:00:00Z"
    assert members == pytest.approx({"a": 55.0, "b": 20.0}, rel=3e-3)


def test_a_backlog_behind_at_capacity_asks_for_more_members() -> None:
    # both members behind (lag > 10 s of their rate): each works at 50/s, 20,000 behind
    leases = {"a": obs("a", {0: 25.0, 1: 25.0}, {0: 10_000}),
              "b": obs("b", {2: 25.0, 3: 25.0}, {2: 10_000})}
    holders = {0: "a", 1: "a", 2: "b", 3: "b"}
    load = group_load(leases, holders, partitions=4)
    assert load is not None
    # the first figures: what arrives on members behind is not known yet
    first, _ = load_status(load, ["a", "b"], 4, catch_up_seconds=200, wall=WALL)
    assert first.recommended_members is None and first.arrival is None
    assert first.capacity == 50.0
    # 30 s later, the same lags: 100/s arrive + 20,000 / 200 s = 200/s at 50 per member: 4
    history = History(load.readings(), 30.0, {})
    status, _ = load_status(load, ["a", "b"], 4, catch_up_seconds=200, wall=WALL,
                            history=history)
    assert status.arrival == 100.0 and status.recommended_members == 4
    # a's lag grew by 3,000 in those 30 s: 100/s more arrive than it works off: 5
    grown = {**history.readings, "a": replace(history.readings["a"], lag=7_000)}
    more, _ = load_status(load, ["a", "b"], 4, catch_up_seconds=200, wall=WALL,
                          history=History(grown, 30.0, {}))
    assert more.arrival == 200.0 and more.recommended_members == 4  # 4 partitions at most


def member_with_load(member: str, rv: str, rates: dict[int, float]) -> dict[str, Any]:
    lease: dict[str, Any] = member_lease(member, rv)
    text = encode_load(rates, {})
    assert text is not None
    lease["metadata"]["annotations"]["kgroup.dev/load"] = text
    return lease


def test_the_operator_takes_the_figures_at_most_every_refresh_and_writes_them() -> None:
    op = Op("a", "b")
    first = op.decide()
    op.write(first, "11")
    assert "load" not in (first.status or {})  # no report: no status.load, no extra pass
    for p, m in enumerate(["a", "a", "b", "b"]):
        op.leases.put(held_lease(p, str(40 + p), m, f"s-{m}"), op.now)
    material = op.leases.put(member_with_load("a", "50", {0: 10.0, 1: 10.0}), op.now)
    assert material  # load reports that start wake the group's loop
    op.now += 1
    plan = op.decide()
    assert plan.status is not None and plan.status["load"]["rate"] == 20.0
    assert plan.status["load"]["recommendedMembers"] == 1
    assert [m.get("load") for m in plan.status["members"]] == [20.0, None]
    op.write(plan, "12")
    assert plan.wait is not None and plan.wait <= LOAD_REFRESH_SECONDS
    # renewals with other figures: not material, and not taken before the refresh
    rv = iter(range(60, 99))
    for _ in range(2):
        op.now += LOAD_REFRESH_SECONDS / 3
        assert not op.leases.put(member_with_load("a", str(next(rv)), {0: 30.0, 1: 10.0}),
                                 op.now)
        op.leases.put(member_lease("b", str(next(rv))), op.now)
        assert op.decide().status is None
    op.now += LOAD_REFRESH_SECONDS / 3
    op.leases.put(member_with_load("a", str(next(rv)), {0: 30.0, 1: 10.0}), op.now)
    op.leases.put(member_lease("b", str(next(rv))), op.now)
    later = op.decide()
    # the mean of the window's reports: one at 20 events/s, three at 40
    assert later.status is not None and later.status["load"]["rate"] == 35.0


def test_a_changed_setting_takes_the_figures_again_but_not_within_the_gap() -> None:
    tracker = LoadTracker()
    taken: list[float] = []

    def measure(_history: object) -> Taken:
        taken.append(1.0)
        return LoadStatus(rate=1.0), {}, {0: 1.0}, {}, {}, 0.0

    tracker.refresh(0.0, measure, "catch-up 300")
    tracker.refresh(10.0, measure, "catch-up 300")
    assert len(taken) == 1 and tracker.deadline() == LOAD_REFRESH_SECONDS
    tracker.refresh(11.0, measure, "catch-up 30")
    assert len(taken) == 2 and tracker.deadline() == 11.0 + LOAD_REFRESH_SECONDS
    tracker.refresh(13.0, measure, "catch-up 60")  # within the gap: later
    assert len(taken) == 2 and tracker.deadline() == 11.0 + SETTINGS_TAKE_GAP
    tracker.refresh(11.0 + SETTINGS_TAKE_GAP, measure, "catch-up 60")
    assert len(taken) == 3
    assert tracker.deadline() == 11.0 + SETTINGS_TAKE_GAP + LOAD_REFRESH_SECONDS


def test_a_member_that_starts_reporting_is_counted_within_the_gap_not_at_every_pass(
) -> None:
    """A member that starts reporting makes the figures due, but not within
    SETTINGS_TAKE_GAP of the last take: members starting one by one (a group of 200
    starting) made every pass take them, each reading every member's window."""
    op = Op("a", "b")
    op.write(op.decide(), "11")
    for p, m in enumerate(["a", "a", "b", "b"]):
        op.leases.put(held_lease(p, str(40 + p), m, f"s-{m}"), op.now)
    op.leases.put(member_with_load("a", "50", {0: 10.0, 1: 10.0}), op.now)
    op.now += 1
    first = op.decide()
    assert first.status is not None and first.status["load"]["rate"] == 20.0
    op.write(first, "12")
    taken_at = op.memory.load.taken_at
    assert taken_at is not None
    assert op.leases.put(member_with_load("b", "51", {2: 5.0, 3: 5.0}), op.now)  # material
    op.now += 1
    second = op.decide()
    assert op.memory.load.taken_at == taken_at  # within the gap: not taken again yet
    assert second.status is None or second.status["load"]["rate"] == 20.0
    # ... but the loop is told to look again when the gap is over
    assert op.memory.load.deadline() == pytest.approx(taken_at + SETTINGS_TAKE_GAP)
    op.now = taken_at + SETTINGS_TAKE_GAP
    third = op.decide()
    assert op.memory.load.taken_at == op.now
    assert third.status is not None and third.status["load"]["rate"] == 30.0
    assert op.memory.load.deadline() == pytest.approx(op.now + LOAD_REFRESH_SECONDS)
