"""The operator's decisions (kgroup.core.operator.decide.decide), pass by pass, on a fake
clock: what it creates, writes and posts, and when it looks again. The same function
runs in the kopf controller and in the simulated operator; the controller's calls on the
real API server are checked in e2e/tests/test_operator.py."""

from __future__ import annotations

from datetime import UTC, datetime

from kgroup.core.objects import Obj
from kgroup.core.operator.decide import (
    CREATES_PER_PASS,
    Memory,
    Observation,
    Plan,
    decide,
    written,
)
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.planner import PodObservation

WALL = datetime(2026, 1, 1, tzinfo=UTC)


def body(status: Obj | None = None, *, rv: str = "10", window: int = 0,
         partitions: int = 4, spec: Obj | None = None) -> Obj:
    return {"metadata": {"name": "g", "namespace": "ns", "uid": "u", "resourceVersion": rv,
                         "generation": 1},
            "spec": spec if spec is not None else {
                "partitions": partitions, "selector": {"matchLabels": {"app": "x"}},
                "stabilizationWindowSeconds": window,
                "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5}},
            "status": status or {}}


def member_lease(member: str, rv: str, epoch: int | None = None) -> Obj:
    notes = {"kgroup.dev/session": f"s-{member}"}
    if epoch is not None:
        notes["kgroup.dev/epoch"] = str(epoch)
    return {"metadata": {"name": f"g-member-{member}", "resourceVersion": rv,
                         "annotations": notes,
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "member",
                                    "kgroup.dev/member": member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 15}}


def pods(*names: str) -> list[PodObservation]:
    return [PodObservation(name=n, labels={"app": "x"}) for n in names]


class Op:
    """One group's memory and caches; each pass is one call of ``decide``."""

    def __init__(self, *members: str) -> None:
        self.now = 100.0
        self.memory = Memory(started_at=self.now)
        self.leases = GroupLeases()
        for i, m in enumerate(members):
            self.leases.put(member_lease(m, str(20 + i)), self.now)
        self.pods = pods(*members)
        self.body = body()

    def decide(self, *, synced: bool = True, interval: float = 1.0) -> Plan:
        return decide(Observation(self.body, self.leases, self.pods, synced), self.memory,
                      self.now, wall=WALL, status_min_interval=interval)

    def write(self, plan: Plan, rv: str) -> list[str]:
        """The status write succeeded: the stored body has version ``rv``."""
        assert plan.status is not None
        self.body = {**self.body, "status": plan.status,
                     "metadata": {**self.body["metadata"], "resourceVersion": rv}}
        return [e.reason for e in written(self.memory, plan, self.body, self.now)]


def test_nothing_is_decided_before_the_caches_are_synced() -> None:
    plan = Op("a").decide(synced=False)
    assert (plan.wait, plan.status, plan.create_partitions) == (0.5, None, [])


def test_a_first_pass_creates_the_locks_and_writes_the_first_target() -> None:
    op = Op("a", "b")
    plan = op.decide()
    assert plan.create_partitions == [0, 1, 2, 3] and plan.lease_duration == 15
    assert plan.status is not None and plan.status["epoch"] == 1
    assert plan.status["assignment"] == {"a": "0-1", "b": "2-3"}
    assert op.write(plan, "11") == ["RebalanceStarted"]
    for p in plan.create_partitions:
        op.memory.lease_created(p, op.now)
    again = op.decide()
    assert again.create_partitions == [] and again.status is None  # quiet: nothing new


def partition_lease(p: int, rv: str) -> Obj:
    return {"metadata": {"name": f"g-partition-{p}", "resourceVersion": rv,
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(p)}},
            "spec": {"leaseTransitions": 0, "leaseDurationSeconds": 15}}


def test_a_partition_lease_deleted_by_hand_is_created_again() -> None:
    op = Op("a", "b")
    plan = op.decide()
    for p in plan.create_partitions:
        op.memory.lease_created(p, op.now)
    assert op.decide().create_partitions == []  # asked for, not shown yet: not again
    for p in range(4):
        op.leases.put(partition_lease(p, str(40 + p)), op.now)  # the watch shows them
    op.now += 60
    assert op.decide().create_partitions == []
    op.leases.drop(partition_lease(2, "50"))  # kubectl delete lease g-partition-2
    assert op.decide().create_partitions == [2]


def test_a_create_the_watch_never_showed_is_sent_again_after_the_recheck() -> None:
    op = Op("a")
    for p in op.decide().create_partitions:
        op.memory.lease_created(p, op.now)
    for p in (0, 1, 3):
        op.leases.put(partition_lease(p, str(40 + p)), op.now)
    op.now += 4.0
    quiet = op.decide()
    assert quiet.create_partitions == [] and quiet.wait is not None and quiet.wait <= 1.0
    op.now += 1.0  # created, then deleted before the watch showed it: asked for again
    assert op.decide().create_partitions == [2]


def test_the_rate_limit_holds_back_a_status_update_but_never_a_new_target() -> None:
    op = Op("a", "b")
    op.write(op.decide(), "11")
    op.now += 0.3
    op.leases.put(member_lease("a", "30", epoch=1), op.now)  # a acknowledges: aggregate only
    held = op.decide()
    assert held.status is None and held.wait is not None and 0.6 < held.wait < 0.71
    op.leases.put(member_lease("c", "31"), op.now)  # a member joins: a new target
    op.pods = pods("a", "b", "c")
    now = op.decide()
    assert now.status is not None and now.status["epoch"] == 2  # not held back


def test_a_status_edited_by_hand_is_corrected_once_with_an_event() -> None:
    op = Op("a", "b")
    plan = op.decide()
    op.write(plan, "11")
    edited = {**plan.status, "assignment": {"a": "0-3"}}  # type: ignore[dict-item]
    op.body = {**op.body, "status": edited,
               "metadata": {**op.body["metadata"], "resourceVersion": "12"}}
    op.now += 2.0
    fix = op.decide()
    assert [e.reason for e in fix.events] == ["StatusEditedByHand"]
    assert fix.status is not None and fix.status["assignment"] == {"a": "0-1", "b": "2-3"}
    assert fix.status["epoch"] == 2


def test_an_invalid_spec_is_reported_once_and_nothing_else_happens() -> None:
    op = Op("a")
    op.body = body(spec={"partitions": 0})
    first, second = op.decide(), op.decide()
    assert [e.reason for e in first.events] == ["InvalidSpec"] and second.events == []
    assert first.status is None and first.create_partitions == []


def test_a_pending_membership_change_waits_for_the_window() -> None:
    op = Op("a")
    op.body = body(window=3)
    first = op.decide()
    assert first.status is not None and first.status["epoch"] == 0  # membership seen now
    assert first.wait == 3.0  # the window's end
    op.write(first, "11")
    op.now += 3.0
    target = op.decide()
    assert target.status is not None and target.status["epoch"] == 1
    op.write(target, "12")
    op.leases.put(member_lease("b", "40"), op.now)
    op.pods = pods("a", "b")
    lone = op.decide()  # membership was quiet a whole window: acted upon at once
    assert lone.status is not None and lone.status["epoch"] == 2
    op.write(lone, "13")
    op.now += 1.0
    op.leases.put(member_lease("c", "41"), op.now)
    op.pods = pods("a", "b", "c")
    seen = op.decide()  # a second join within the window: the window starts now
    assert seen.status is not None and seen.status["epoch"] == 2  # counts only
    assert seen.wait == 3.0  # the window's end
    op.write(seen, "14")
    op.now += 2.9
    early = op.decide()
    assert early.status is None or early.status["epoch"] == 2
    op.now += 0.1
    late = op.decide()
    assert late.status is not None and late.status["epoch"] == 3


# ---- the failure detector: expiry marks --------------------------------------------------


def held_lease(p: int, rv: str, holder: str, session: str, *,
               expired: str | None = None) -> Obj:
    lease = partition_lease(p, rv)
    notes = {"kgroup.dev/session": session}
    if expired:
        notes["kgroup.dev/expired-session"] = expired
    lease["metadata"]["annotations"] = notes
    lease["spec"]["holderIdentity"] = holder
    return lease


def test_a_lock_is_marked_expired_once_its_holder_is_unrenewed_a_full_duration_on_our_clock(
) -> None:
    op = Op("a", "b")  # both first seen at 100: a full duration each from then
    op.leases.put(held_lease(0, "40", "a", "s-a"), op.now)
    op.leases.put(held_lease(1, "41", "b", "s-b"), op.now)
    op.now = 110.0
    op.leases.put(member_lease("b", "30"), op.now)  # b renewed (a new marker) at 110
    plan = op.decide()
    assert plan.expiries == []
    assert plan.wait is not None and op.now + plan.wait <= 115.0  # wakes at a's expiry
    op.now = 114.99
    assert op.decide().expiries == []
    op.now = 115.0
    [e] = op.decide().expiries
    assert (e.partition, e.member, e.session, e.seen_rv) == (0, "a", "s-a", "40")


def test_an_expiry_in_flight_is_not_decided_again_and_a_marked_lock_is_done() -> None:
    op = Op("a")
    op.leases.put(held_lease(0, "40", "a", "s-a"), op.now)
    op.now += 15
    [e] = op.decide().expiries
    op.memory.expiry_sent(e)
    assert op.decide().expiries == []  # in flight for this very version of the lock
    op.leases.put(held_lease(0, "41", "a", "s-a", expired="s-a"), op.now)  # the answer
    assert op.decide().expiries == [] and op.memory.expiries_sent == {}
    op.leases.put(held_lease(0, "42", "a", "s-a", expired="s-0"), op.now)  # a stale mark
    assert [x.partition for x in op.decide().expiries] == [0]


def test_a_holder_whose_member_lease_is_gone_or_has_a_new_session_is_over_at_once() -> None:
    op = Op("a", "b")
    op.leases.put(held_lease(0, "40", "a", "s-old"), op.now)  # a started s-a since
    op.leases.put(held_lease(1, "41", "c", "s-c"), op.now)  # c's Lease is gone
    assert [(e.partition, e.member) for e in op.decide().expiries] == [(0, "a"), (1, "c")]


def test_the_quorum_read_feeds_the_tracker_a_renewal_the_watch_missed_saves_the_holder(
) -> None:
    from kgroup.core.operator.decide import ExpiryRule

    op = Op("a")
    op.leases.put(held_lease(0, "40", "a", "s-a"), op.now)
    op.now += 15
    assert [e.partition for e in op.decide().expiries] == [0]
    rule = ExpiryRule()
    # the read shows a renewal the watch has not delivered: not over, and its clock restarts
    assert not rule.confirm(op.leases, "a", "s-a", member_lease("a", "35"), op.now)
    assert op.decide().expiries == []
    # the same marker as the cache's: unrenewed for a full duration, over
    op.now += 15
    assert rule.confirm(op.leases, "a", "s-a", member_lease("a", "35"), op.now)
    # the Lease is gone (deleted): over
    assert rule.confirm(op.leases, "a", "s-a", None, op.now)
    assert "a" not in op.leases.members


def test_a_status_naming_partitions_beyond_spec_is_corrected_without_expanding() -> None:
    """``"0-99999999"`` in the status once OOM-killed the operator; now the range is
    refused by the bounded parse (nothing expanded) and the status written again from
    the written target, with a Warning Event."""
    op = Op("a", "b")
    plan = op.decide()
    op.write(plan, "11")
    edited = {**plan.status, "assignment": {"a": "0-99999999", "b": "2-3"}}  # type: ignore[dict-item]
    op.body = {**op.body, "status": edited,
               "metadata": {**op.body["metadata"], "resourceVersion": "12"}}
    op.now += 2.0
    fix = op.decide()
    assert [e.reason for e in fix.events] == ["StatusEditedByHand"]
    assert fix.status is not None and fix.status["assignment"] == {"a": "0-1", "b": "2-3"}


def test_a_restarted_operator_replans_an_unusable_assignment_above_its_epoch() -> None:
    """No written status to go back to (a restart): the target is planned again from the
    lock holders, with an epoch above the one in the status, and a Warning names it."""
    op = Op("a", "b")
    op.body = body({"epoch": 7, "assignment": {"a": "0-99999999"}})
    plan = op.decide()
    assert [e.reason for e in plan.events] == ["StatusEditedByHand"]
    assert "beyond the group's partitions (0-3)" in plan.events[0].message
    assert plan.status is not None and plan.status["epoch"] == 8
    assert plan.status["assignment"] == {"a": "0-1", "b": "2-3"}


def test_a_lock_name_taken_by_someone_else_s_lease_degrades_the_group_naming_it() -> None:
    """A squatted Lease name (not kgroup's, or another group's) was retried in
    silence for ever; now the group is Degraded with a condition naming the Lease, the
    create is tried again every 30 s (not 5), and the problem clears once it is gone."""
    op = Op("a", "b")
    plan = op.decide()
    op.write(plan, "11")
    squat = {"metadata": {"name": "g-partition-2", "labels": {"app": "something-else"}}}
    ours = partition_lease(3, "43")
    for p in plan.create_partitions:
        op.memory.lease_created(p, op.now, existing={0: None, 1: None, 2: squat, 3: ours}[p],
                                group="g")
    for p in (0, 1, 3):
        op.leases.put(partition_lease(p, str(40 + p)), op.now)
    op.now += 6.0
    degraded = op.decide()
    assert degraded.create_partitions == []  # not every 5 s
    assert degraded.status is not None and degraded.status["phase"] == "Degraded"
    cond = next(c for c in degraded.status["conditions"] if c["type"] == "Degraded")
    assert cond["reason"] == "LeaseNameTaken"
    assert "Lease g-partition-2 (partition 2's lock) is taken by an object that is not " \
           "this group's lock (kgroup.dev/group=None, kgroup.dev/partition=None, " \
           "kgroup.dev/role=None)" in cond["message"]
    assert op.write(degraded, "12") == ["LeaseNameTaken"]
    op.now += 25.0
    retry = op.decide()
    assert retry.create_partitions == [2]
    op.memory.lease_created(2, op.now, existing=None, group="g")  # the squatter is gone
    op.leases.put(partition_lease(2, "60"), op.now)
    op.now += 2.0
    healed = op.decide()
    assert healed.status is not None and healed.status["phase"] != "Degraded"


def test_another_group_s_lease_under_the_name_is_a_squatter_too() -> None:
    from kgroup.core.operator.lock_creation import squatter
    other = partition_lease(2, "5")
    other["metadata"]["labels"]["kgroup.dev/group"] = "h"
    assert "kgroup.dev/group='h'" in str(squatter(other, "g", 2))
    assert squatter(partition_lease(2, "5"), "g", 2) is None
    assert "kgroup.dev/partition='2'" in str(squatter(partition_lease(2, "5"), "g", 3))


def test_an_empty_groups_locks_are_created_in_slices_each_with_the_target_as_of_its_pass(
) -> None:
    """10,000 locks in one pass once held the first target back for minutes and left
    every lock to be marked by a second write; in slices of CREATES_PER_PASS, the next pass
    follows at once and the locks created after the first target carry their owner."""
    n = 2 * CREATES_PER_PASS + 7
    op = Op()  # no member yet: the first slice is created unmarked
    op.body = body(partitions=n)
    first = op.decide()
    assert first.create_partitions == list(range(CREATES_PER_PASS))
    assert first.wait == 0.0  # the next slice at once, not at a timer
    assert not any(first.owners.get(p) for p in first.create_partitions)
    for p in first.create_partitions:
        op.memory.lease_created(p, op.now)
    op.now += 0.5
    op.leases.put(member_lease("a", "20"), op.now)  # a member's session appears
    op.pods = pods("a")
    second = op.decide()
    assert second.create_partitions == list(range(CREATES_PER_PASS, 2 * CREATES_PER_PASS))
    assert second.status is not None and second.status["assignment"] == {"a": f"0-{n - 1}"}
    assert all(second.owners[p] == "a" for p in second.create_partitions)  # marked at create
    op.write(second, "11")
    for p in second.create_partitions:
        op.memory.lease_created(p, op.now)
    op.now += 0.5
    last = op.decide()
    assert last.create_partitions == list(range(2 * CREATES_PER_PASS, n))
    assert last.wait != 0.0  # nothing more to create: no immediate pass


def test_a_group_left_without_members_or_paused_does_not_spin() -> None:
    """Found on a real node: a group whose worker pods crash-looped (no member: phase
    Pending) kept its partitions unowned past drain timeout + lease duration, and the
    deadline that waits for that moment stayed in the past: every pass asked to run again
    at once (14.5 million passes in 80 minutes, half a core). A deadline this pass already
    evaluated is not one to wake for; the idle recheck and real changes remain."""
    for spec_extra in ({}, {"paused": True}):
        op = Op("a")
        op.body = body(spec={**body()["spec"], **spec_extra})
        plan = op.decide()
        for p in plan.create_partitions:
            op.memory.lease_created(p, op.now)
        op.write(plan, "11")
        for p in range(4):
            op.leases.put(partition_lease(p, str(40 + p)), op.now)  # nobody takes them
        op.pods = []  # the member's pod is gone: no member
        for _ in range(3):
            op.now += 30.0  # past drain (30 s) + lease (15 s) since the last change
            plan = op.decide()
            if plan.status is not None:
                op.write(plan, str(int(op.body["metadata"]["resourceVersion"]) + 1))
            assert plan.wait is None or plan.wait > 1.0, (spec_extra, plan.wait)
        assert op.body["status"]["phase"] == ("Paused" if spec_extra else "Pending")
        assert op.body["status"]["unowned"] == 4
