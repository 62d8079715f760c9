"""The planner: stabilisation window and cap, epoch bumps, pause, growth, seeding, grace."""

from __future__ import annotations

from typing import Any

from kgroup.core.operator.assignors import Assignee, lower_bound_moves
from kgroup.core.operator.planner import Decision, GroupPlanner, correct_hand_edit, rebalance_reason
from kgroup.crd_models import ConsumerGroupSpec


def spec(**kw: Any) -> ConsumerGroupSpec:
    base: dict[str, Any] = {
        "partitions": 8,
        "selector": {"matchLabels": {"app": "w"}},
        "stabilizationWindowSeconds": 5,
        "stabilizationMaxDelaySeconds": 30,
    }
    base.update(kw)
    return ConsumerGroupSpec.model_validate(base)


def plan(
    planner: GroupPlanner,
    s: ConsumerGroupSpec,
    *,
    target: dict[str, list[int]],
    epoch: int,
    members: set[str],
    now: float,
    holders: dict[int, str] | None = None,
) -> Decision:
    return planner.plan(
        spec=s, target=target, epoch=epoch, members=members, holders=holders or {}, now=now
    )


TWO = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}


def test_the_first_join_after_a_quiet_window_is_acted_upon_at_once() -> None:
    p, s = GroupPlanner(), spec()
    plan(p, s, target=TWO, epoch=3, members={"a", "b"}, now=0)
    d = plan(p, s, target=TWO, epoch=3, members={"a", "b", "c"}, now=10)
    assert d.target is not None and set(d.target) == {"a", "b", "c"}
    assert d.epoch == 4
    assert d.reason == "member joined: c"


def test_a_join_soon_after_another_change_waits_for_the_window() -> None:
    p, s = GroupPlanner(), spec()
    three = {"a": [0, 1, 2], "b": [4, 5, 6], "c": [3, 7]}
    plan(p, s, target=TWO, epoch=3, members={"a", "b"}, now=0)
    assert plan(p, s, target=TWO, epoch=3, members={"a", "b", "c"}, now=10).target
    d = plan(p, s, target=three, epoch=4, members={"a", "b", "c", "d"}, now=12)
    assert d.target is None
    assert d.next_check == 17
    d = plan(p, s, target=three, epoch=4, members={"a", "b", "c", "d"}, now=17)
    assert d.target is not None and d.epoch == 5 and d.reason == "member joined: d"


def test_a_join_right_after_a_leave_is_acted_upon_at_once() -> None:
    """The leave acted at once and batches nothing: only joins open a window."""
    p, s = GroupPlanner(), spec()
    three = {"a": [0, 1, 2], "b": [4, 5, 6], "c": [3, 7]}
    plan(p, s, target=three, epoch=3, members={"a", "b", "c"}, now=0)
    left = plan(p, s, target=three, epoch=3, members={"a", "b"}, now=10)
    assert left.target is not None and set(left.target) == {"a", "b"}
    d = plan(p, s, target=left.target, epoch=4, members={"a", "b", "d"}, now=11)
    assert d.target is not None and d.reason == "member joined: d"


def test_a_join_seen_at_the_operators_start_waits_for_the_window() -> None:
    """First sight is no quiet period (an operator restart may be mid-burst)."""
    p, s = GroupPlanner(), spec()
    d = plan(p, s, target=TWO, epoch=3, members={"a", "b", "c"}, now=0)
    assert d.target is None and d.next_check == 5


def test_a_join_moves_only_what_balance_needs() -> None:
    p, s = GroupPlanner(), spec()
    plan(p, s, target=TWO, epoch=3, members={"a", "b", "c"}, now=0)
    d = plan(p, s, target=TWO, epoch=3, members={"a", "b", "c"}, now=5)
    assert d.target is not None
    assert d.moved == 2
    assert set(d.target["a"]) <= set(TWO["a"]) and set(d.target["b"]) <= set(TWO["b"])


def test_each_new_change_restarts_the_window() -> None:
    p, s = GroupPlanner(), spec()
    plan(p, s, target=TWO, epoch=1, members={"a", "b", "c"}, now=0)
    d = plan(p, s, target=TWO, epoch=1, members={"a", "b", "c", "d"}, now=4)
    assert d.target is None
    assert d.next_check == 9


def test_constant_churn_is_rebalanced_at_the_max_delay() -> None:
    p, s = GroupPlanner(), spec()
    t = 0.0
    members = {"a", "b"}
    decision = Decision()
    for i in range(40):
        members = {"a", "b", f"x{i}"}
        decision = plan(p, s, target=TWO, epoch=1, members=members, now=t)
        if decision.target is not None:
            break
        t += 1
    assert decision.target is not None
    assert t == 30


def test_a_burst_of_ten_joins_within_three_seconds_costs_two_rebalances() -> None:
    """The first join is acted upon at once (leading edge), the nine that follow within
    the window together once the window is quiet; each rebalance moves the lower bound."""
    p, s = GroupPlanner(), spec(partitions=64)
    target = {"a": list(range(32)), "b": list(range(32, 64))}
    members = {"a", "b"}
    plan(p, s, target=target, epoch=1, members=members, now=0)
    bumps: list[float] = []
    epoch = 1
    for i in range(100):  # ten pods join 0.3 s apart from t=10, observed every 0.1 s
        t = 10 + i * 0.1
        if i % 3 == 0 and i < 30:
            members = members | {f"p{i // 3}"}
        d = plan(p, s, target=target, epoch=epoch, members=set(members), now=t)
        if d.target is not None:
            bound = lower_bound_moves(64, [Assignee(m) for m in members], target, {})
            assert d.moved == bound
            bumps.append(round(t, 1))
            target, epoch = d.target, d.epoch
    assert bumps == [10.0, 17.7]  # the first join; last join at 12.7 + the 5 s window
    assert len(target) == 12


def test_an_unchanged_membership_never_bumps_the_epoch() -> None:
    p, s = GroupPlanner(), spec()
    for t in range(100):
        d = plan(p, s, target=TWO, epoch=7, members={"a", "b"}, now=t)
        assert d.target is None and d.epoch == 7


def test_a_paused_group_keeps_its_target_through_a_join() -> None:
    p, s = GroupPlanner(), spec(paused=True)
    for t in range(0, 100, 10):
        d = plan(p, s, target=TWO, epoch=2, members={"a", "b", "c"}, now=t)
        assert d.target is None


def test_resuming_a_paused_group_rebalances_after_the_window() -> None:
    p = GroupPlanner()
    plan(p, spec(paused=True), target=TWO, epoch=2, members={"a", "b", "c"}, now=0)
    assert plan(p, spec(), target=TWO, epoch=2, members={"a", "b", "c"}, now=100).target


def test_growing_partitions_assigns_the_new_ones_without_moving_others() -> None:
    p, s = GroupPlanner(), spec(partitions=16)
    d = plan(p, s, target=TWO, epoch=2, members={"a", "b"}, now=0)
    assert d.target is not None and d.epoch == 3
    assert set(TWO["a"]) <= set(d.target["a"]) and set(TWO["b"]) <= set(d.target["b"])
    assert sorted(d.target["a"] + d.target["b"]) == list(range(16))
    assert d.reason == "partitions grew 8\u219216"


def test_an_empty_status_is_seeded_from_the_live_lock_holders() -> None:
    p, s = GroupPlanner(), spec(stabilizationWindowSeconds=0)
    holders = {0: "a", 1: "a", 2: "a", 5: "b", 6: "b"}
    d = plan(p, s, target={}, epoch=0, members={"a", "b"}, now=0, holders=holders)
    assert d.target is not None and d.epoch == 1
    assert {0, 1, 2} <= set(d.target["a"]) and {5, 6} <= set(d.target["b"])
    assert d.moved == 3  # only the three free partitions are newly assigned
    assert d.reason.startswith("seeded from current lock holders")


def test_a_departed_members_partitions_are_handed_out_at_once() -> None:
    """Its partitions would otherwise wait for an owner: no window, even mid-burst."""
    p, s = GroupPlanner(), spec()
    plan(p, s, target=TWO, epoch=2, members={"a", "b"}, now=0)
    plan(p, s, target=TWO, epoch=2, members={"a", "b", "c"}, now=1)  # first sight: waits
    d = plan(p, s, target=TWO, epoch=2, members={"a", "c"}, now=2)
    assert d.target is not None and set(d.target) == {"a", "c"}
    assert d.reason == "member joined: c; member left: b"
    assert d.moved == lower_bound_moves(8, [Assignee("a"), Assignee("c")], TWO, {})


def test_a_member_returning_within_restart_grace_keeps_its_partitions() -> None:
    p, s = GroupPlanner(), spec(restartGraceSeconds=60)
    d1 = plan(p, s, target=TWO, epoch=2, members={"a"}, now=0)
    d2 = plan(p, s, target=TWO, epoch=2, members={"a"}, now=30)
    d3 = plan(p, s, target=TWO, epoch=2, members={"a", "b"}, now=40)
    assert (d1.target, d2.target, d3.target) == (None, None, None)
    assert d1.next_check == 60


def test_a_member_gone_past_restart_grace_is_rebalanced_away() -> None:
    p, s = GroupPlanner(), spec(restartGraceSeconds=60)
    plan(p, s, target=TWO, epoch=2, members={"a"}, now=0)
    plan(p, s, target=TWO, epoch=2, members={"a"}, now=60)
    d = plan(p, s, target=TWO, epoch=2, members={"a"}, now=65)
    assert d.target == {"a": list(range(8))}


def test_the_last_member_leaving_empties_the_target() -> None:
    p, s = GroupPlanner(), spec(stabilizationWindowSeconds=0)
    d = plan(p, s, target=TWO, epoch=2, members=set(), now=0)
    assert d.target == {}
    assert d.reason == "members left: a, b"


def test_a_hand_edited_target_is_restored_under_a_higher_epoch() -> None:
    d = correct_hand_edit(
        written_target=TWO, written_epoch=4, seen_target={"a": list(range(8))}, seen_epoch=9
    )
    assert d is not None and d.target == TWO and d.epoch == 10


def test_an_untouched_status_needs_no_correction() -> None:
    assert (
        correct_hand_edit(written_target=TWO, written_epoch=4, seen_target=dict(TWO), seen_epoch=4)
        is None
    )


def test_a_reason_lists_every_member_that_left() -> None:
    reason = rebalance_reason(before=TWO, after={"c": list(range(8))}, partitions=8)
    assert reason == "member joined: c; members left: a, b"


def test_changing_the_assignor_rebalances_to_its_layout_at_once() -> None:
    p = GroupPlanner()
    scattered = {"a": [0, 2, 4, 6], "b": [1, 3, 5, 7]}
    plan(p, spec(), target=scattered, epoch=2, members={"a", "b"}, now=0)
    d = p.plan(
        spec=spec(assignor="range"),
        target=scattered,
        epoch=2,
        members={"a", "b"},
        holders={},
        now=1,
        spec_changed=True,
    )
    assert d.target == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    assert d.reason == "spec changed: assignor range"


def test_a_spec_edit_that_leaves_the_target_a_fixed_point_bumps_nothing() -> None:
    p = GroupPlanner()
    d = p.plan(
        spec=spec(), target=TWO, epoch=2, members={"a", "b"}, holders={}, now=0, spec_changed=True
    )
    assert d.target is None and d.epoch == 2
