"""spec.balance mode load in the operator's planner: plan_load_balance wired into
GroupPlanner.plan, with the dwell time kept in the planner's memory."""

from __future__ import annotations

from typing import Any

from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.load_balance import busiest_ratio, effective_loads, load_bound
from kgroup.core.operator.planner import Decision, GroupPlanner
from kgroup.crd_models import ConsumerGroupSpec

TWO = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
HOT = {0: 10.0, **{p: 1.0 for p in range(1, 8)}}  # a carries 13, b 4
AB = [Assignee("a"), Assignee("b")]


def spec(mode: str = "load", **balance: Any) -> ConsumerGroupSpec:
    return ConsumerGroupSpec.model_validate({
        "partitions": 8, "selector": {"matchLabels": {"app": "w"}},
        "stabilizationWindowSeconds": 0, "balance": {"mode": mode, **balance}})


def held(target: dict[str, list[int]]) -> dict[int, str]:
    return {p: m for m, ps in target.items() for p in ps}


def plan(p: GroupPlanner, s: ConsumerGroupSpec, target: dict[str, list[int]], now: float,
         loads: dict[int, float], members: set[str] | None = None,
         holders: dict[int, str] | None = None) -> Decision:
    return p.plan(spec=s, target=target, epoch=3, members=members or set(target),
                  holders=held(target) if holders is None else holders, now=now, loads=loads)


def test_count_mode_ignores_the_loads() -> None:
    p = GroupPlanner()
    assert plan(p, spec("count"), TWO, 0, HOT).target is None
    assert plan(p, spec("count"), TWO, 100, HOT).target is None


def test_load_mode_moves_the_cold_partitions_off_the_hot_member_once() -> None:
    p, s = GroupPlanner(), spec()
    d = plan(p, s, TWO, 0, HOT)
    assert d.target is not None and d.epoch == 4
    loads = effective_loads(8, HOT)
    after = busiest_ratio(d.target, loads, AB)
    assert after <= max(1.15, load_bound(loads, AB)) + 1e-9
    assert d.moved == 3 and d.target["a"] == [0]  # the hot one stays; 1-3 go
    assert d.reason == f"load: busiest member 1.53x the mean, {after:.2f}x after"
    # the new target held, the same loads: nothing more moves, now or later
    for now in (1, 30, 61, 600):
        assert plan(p, s, d.target, now, HOT).target is None


def test_no_load_move_while_a_hand_off_is_in_flight() -> None:
    p, s = GroupPlanner(), spec()
    moving = {**held(TWO), 3: "a", 4: "a"}  # 4 still held by a, targeted to b
    assert plan(p, s, TWO, 0, HOT, holders=moving).target is None
    assert plan(p, s, TWO, 1, HOT).target is not None  # once settled


def test_a_moved_partition_stays_for_the_dwell_time() -> None:
    p, s = GroupPlanner(), spec(dwellSeconds=60)
    d = plan(p, s, TWO, 0, HOT)
    assert d.target is not None
    # now 1 (just moved to b) is the hot one: moving it back would even the load
    shifted = {0: 1.0, 1: 10.0, **{q: 1.0 for q in range(2, 8)}}
    early = plan(p, s, d.target, 30, shifted)
    assert early.target is None or early.target["b"].count(1) == 1
    late = plan(p, s, d.target, 61, shifted)
    assert late.target is not None and 1 not in late.target["b"]


def test_steady_noisy_load_moves_nothing_after_the_first_rebalance() -> None:
    import random
    rng = random.Random(5)
    p, s = GroupPlanner(), spec()
    target = TWO
    moves = 0
    for step in range(30):  # 10 minutes, a plan every 20 s, +-20 % noise each time
        noisy = {q: x * rng.uniform(0.8, 1.2) for q, x in HOT.items()}
        d = plan(p, s, target, 20.0 * step, noisy)
        if d.target is not None:
            moves += d.moved
            target = d.target
    assert moves == 3


def test_a_join_in_load_mode_gets_its_share_by_the_membership_rules() -> None:
    p, s = GroupPlanner(), spec()
    plan(p, s, TWO, 0, {})
    d = plan(p, s, TWO, 10, {}, members={"a", "b", "c"})
    assert d.target is not None and len(d.target["c"]) == 2  # floor(8 / 3)
    assert d.reason == "member joined: c"


def test_a_new_groups_first_target_starts_no_dwell() -> None:
    p, s = GroupPlanner(), spec(dwellSeconds=600)
    first = p.plan(spec=s, target={}, epoch=0, members={"a", "b"}, holders={}, now=0,
                   loads={})
    assert first.target == TWO
    d = plan(p, s, TWO, 1, HOT)  # held, loads reported: balanced at once
    assert d.target is not None and d.target["a"] == [0]
