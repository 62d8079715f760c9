"""Status aggregation: phase, per-member counts, last rebalance and conditions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kgroup.core.operator.status import (
    MemberLeaseObservation,
    Problem,
    aggregate_status,
    parse_acknowledged_epoch,
)
from kgroup.crd_models import ConsumerGroupSpec, ConsumerGroupStatus, LastRebalance

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TARGET = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
ALL_HELD = {p: m for m, ps in TARGET.items() for p in ps}


def spec(**kw: Any) -> ConsumerGroupSpec:
    base: dict[str, Any] = {"partitions": 8, "selector": {"matchLabels": {"app": "w"}}}
    base.update(kw)
    return ConsumerGroupSpec.model_validate(base)


def leases(**epochs: str | None) -> dict[str, MemberLeaseObservation]:
    return {m: MemberLeaseObservation(m, "s-" + m, e) for m, e in epochs.items()}


def agg(**kw: Any) -> tuple[ConsumerGroupStatus, list[Problem]]:
    args: dict[str, Any] = {
        "spec": spec(),
        "generation": 1,
        "previous": ConsumerGroupStatus(),
        "epoch": 3,
        "target": TARGET,
        "members": {"a", "b"},
        "member_leases": leases(a="3", b="3"),
        "holders": ALL_HELD,
        "last_change_at": 0.0,
        "now": 1.0,
        "wall": T0,
    }
    args.update(kw)
    return aggregate_status(**args)


def cond(status: ConsumerGroupStatus, ctype: str) -> tuple[str, str]:
    c = next(c for c in status.conditions if c.type == ctype)
    return c.status, c.reason


def test_a_fully_owned_and_acknowledged_group_is_stable_and_ready() -> None:
    st, problems = agg()
    assert st.phase == "Stable" and problems == []
    assert cond(st, "Ready") == ("True", "AllPartitionsOwned")
    assert cond(st, "Rebalancing")[0] == "False" and cond(st, "Degraded")[0] == "False"


def test_a_group_without_members_is_pending() -> None:
    st, _ = agg(members=set(), target={}, holders={})
    assert st.phase == "Pending"
    assert cond(st, "Ready") == ("False", "NoMembers")


def test_a_paused_group_reports_paused() -> None:
    assert agg(spec=spec(paused=True))[0].phase == "Paused"


def test_a_member_behind_the_epoch_makes_the_group_rebalancing() -> None:
    st, _ = agg(member_leases=leases(a="3", b="2"))
    assert st.phase == "Rebalancing"
    assert cond(st, "Rebalancing") == ("True", "EpochNotAcknowledged")


def test_a_partition_not_yet_with_its_target_member_makes_the_group_rebalancing() -> None:
    st, _ = agg(holders={**ALL_HELD, 4: "a"})
    assert st.phase == "Rebalancing"
    assert cond(st, "Rebalancing") == ("True", "PartitionsMoving")


def test_a_member_waiting_for_the_stabilisation_window_keeps_the_group_rebalancing() -> None:
    st, _ = agg(members={"a", "b", "c"}, member_leases=leases(a="3", b="3", c="3"))
    assert st.phase == "Rebalancing"
    status, reason = cond(st, "Rebalancing")
    assert (status, reason) == ("True", "MembershipChanging")
    assert "joined: c" in next(c.message for c in st.conditions if c.type == "Rebalancing")
    assert cond(st, "Ready")[0] == "False"


def test_a_departed_member_still_in_the_target_keeps_the_group_rebalancing() -> None:
    st, _ = agg(members={"a"})
    assert st.phase == "Rebalancing"
    assert "left: b" in next(c.message for c in st.conditions if c.type == "Rebalancing")


def test_partitions_unowned_past_drain_plus_lease_duration_degrade_the_group() -> None:
    held = {p: m for p, m in ALL_HELD.items() if p != 7}
    s = spec(handoff={"drainTimeoutSeconds": 10}, lease={"durationSeconds": 5})
    assert agg(spec=s, holders=held, now=15.0)[0].phase == "Rebalancing"
    st, _ = agg(spec=s, holders=held, now=15.5)
    assert st.phase == "Degraded" and st.unowned == 1
    assert cond(st, "Degraded") == ("True", "PartitionsUnowned")


def test_a_malformed_epoch_annotation_counts_as_zero_and_is_a_problem() -> None:
    st, problems = agg(member_leases=leases(a="3", b="seven"))
    assert [p.reason for p in problems] == ["BadMemberAnnotation"]
    assert next(m for m in st.members if m.name == "b").acknowledged_epoch == 0
    assert st.phase == "Degraded"
    assert cond(st, "Degraded") == ("True", "BadMemberAnnotation")


def test_a_negative_epoch_annotation_is_malformed() -> None:
    assert parse_acknowledged_epoch("m", "-1")[1] is not None


def test_a_missing_epoch_annotation_is_zero_without_a_problem() -> None:
    assert parse_acknowledged_epoch("m", None) == (0, None)


def test_owned_counts_only_count_live_holders_per_member() -> None:
    st, _ = agg(holders={0: "a", 1: "a", 4: "b"})
    counts = {m.name: (m.assigned, m.assigned_count, m.owned_count) for m in st.members}
    assert counts == {"a": ("0-3", 4, 2), "b": ("4-7", 4, 1)}
    assert st.unowned == 5


def test_the_assignment_is_written_as_compact_ranges() -> None:
    assert agg()[0].assignment == {"a": "0-3", "b": "4-7"}


def test_a_rebalance_is_completed_when_the_group_settles() -> None:
    started = LastRebalance(
        epoch=3, reason="member joined: b", moved=4, started_at="2026-01-01T00:00:00Z"
    )
    st, _ = agg(wall=T0 + timedelta(seconds=2), last_rebalance=started)
    assert st.last_rebalance is not None
    assert st.last_rebalance.completed_at == "2026-01-01T00:00:02Z"
    assert st.last_rebalance.duration_seconds == 2.0


def test_a_rebalance_in_progress_has_no_completion_time() -> None:
    started = LastRebalance(epoch=3, reason="r", moved=4, started_at="2026-01-01T00:00:00Z")
    st, _ = agg(member_leases=leases(a="2", b="3"), last_rebalance=started)
    assert st.last_rebalance is not None and st.last_rebalance.completed_at is None


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first, _ = agg(wall=T0)
    again, _ = agg(previous=first, wall=T0 + timedelta(minutes=5))
    assert again == first


def test_a_condition_gets_a_new_transition_time_when_its_status_flips() -> None:
    first, _ = agg(wall=T0)
    later, _ = agg(
        previous=first, wall=T0 + timedelta(minutes=5), member_leases=leases(a="2", b="3")
    )
    ready = next(c for c in later.conditions if c.type == "Ready")
    assert ready.status == "False" and ready.last_transition_time == "2026-01-01T00:05:00Z"


# -- the conditions GitOps tools read (kstatus: Reconciling, Stalled, observedGeneration) --


def test_a_settled_group_is_neither_reconciling_nor_stalled() -> None:
    st, _ = agg()
    assert cond(st, "Reconciling") == ("False", "Settled")
    assert cond(st, "Stalled") == ("False", "Progressing")


def test_a_rebalancing_group_is_reconciling_with_the_rebalance_reason() -> None:
    for kw in ({"member_leases": leases(a="3", b="2")}, {"holders": {**ALL_HELD, 4: "a"}},
               {"members": {"a", "b", "c"}, "member_leases": leases(a="3", b="3", c="3")}):
        st, _ = agg(**kw)
        assert st.phase == "Rebalancing"
        assert cond(st, "Reconciling") == cond(st, "Rebalancing")
        assert cond(st, "Reconciling")[0] == "True" and cond(st, "Stalled")[0] == "False"


def test_partitions_unowned_past_the_deadline_stall_the_group_and_end_reconciling() -> None:
    held = {p: m for p, m in ALL_HELD.items() if p != 7}
    s = spec(handoff={"drainTimeoutSeconds": 10}, lease={"durationSeconds": 5})
    before, _ = agg(spec=s, holders=held, now=15.0)
    assert cond(before, "Reconciling")[0] == "True" and cond(before, "Stalled")[0] == "False"
    st, _ = agg(spec=s, holders=held, now=15.5)
    assert cond(st, "Stalled") == ("True", "PartitionsUnowned")
    assert cond(st, "Reconciling") == ("False", "Stalled")


def test_any_problem_of_a_group_with_members_stalls_it() -> None:
    st, _ = agg(member_leases=leases(a="3", b="seven"))
    assert cond(st, "Stalled") == ("True", "BadMemberAnnotation")
    st, _ = agg(extra_problems=[Problem("LeaseNameTaken", "partition 3's lock name is taken")])
    assert cond(st, "Stalled") == ("True", "LeaseNameTaken")


def test_a_group_without_members_waits_and_is_not_stalled() -> None:
    st, _ = agg(members=set(), target={}, holders={}, now=1000.0)
    assert st.phase == "Pending" and cond(st, "Degraded") == ("True", "PartitionsUnowned")
    assert cond(st, "Stalled") == ("False", "NoMembers")
    assert cond(st, "Reconciling") == ("False", "NoMembers")
    assert cond(st, "Ready") == ("False", "NoMembers")


def test_a_paused_group_is_not_reconciling_but_stalls_on_a_problem() -> None:
    st, _ = agg(spec=spec(paused=True), members={"a", "b", "c"})
    assert st.phase == "Paused" and cond(st, "Rebalancing")[0] == "True"
    assert cond(st, "Reconciling") == ("False", "Paused")
    st, _ = agg(spec=spec(paused=True), member_leases=leases(a="3", b="seven"))
    assert cond(st, "Stalled") == ("True", "BadMemberAnnotation")


def test_reconciling_and_stalled_are_never_true_together_and_follow_the_phase() -> None:
    held = {p: m for p, m in ALL_HELD.items() if p != 7}
    seen = set()
    for paused in (False, True):
        for members in ({"a", "b"}, {"a"}, {"a", "b", "c"}, set()):
            for epochs in (("3", "3"), ("3", "2"), ("3", "x")):
                for holders in (ALL_HELD, held, {}):
                    for now in (1.0, 1000.0):
                        st, _ = agg(spec=spec(paused=paused), members=members, holders=holders,
                                    member_leases=leases(a=epochs[0], b=epochs[1], c="3"),
                                    now=now)
                        reconciling, stalled = cond(st, "Reconciling")[0], cond(st, "Stalled")[0]
                        assert (reconciling, stalled) != ("True", "True")
                        assert (reconciling == "True") == (st.phase == "Rebalancing")
                        assert (stalled == "True") == (
                            st.phase == "Degraded"
                            or (st.phase == "Paused" and bool(members)
                                and cond(st, "Degraded")[0] == "True"))
                        seen.add((st.phase, reconciling, stalled))
    assert {p for p, _, _ in seen} == {"Stable", "Rebalancing", "Degraded", "Pending", "Paused"}


def test_the_status_and_every_condition_carry_the_observed_generation() -> None:
    st, _ = agg(generation=7)
    assert st.observed_generation == 7 and st.to_wire()["observedGeneration"] == 7
    assert {c.type for c in st.conditions} == {"Ready", "Rebalancing", "Degraded", "Stalled",
                                               "Reconciling", "SidecarMissing"}
    assert all(c.observed_generation == 7 for c in st.conditions)
