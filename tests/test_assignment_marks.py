"""Only the assigned member may take a lock: the operator's marks (``kgroup.dev/assigned``),
the member that waits for its mark, and the simulated API server that refuses the rest."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from test_member import ME, World, joined, of
from test_operator_logic import Op, member_lease, pods
from test_simulation import SMALL, quiet

from kgroup.core import lease_codec as codec
from kgroup.core.member.reconcile import Acquire, Member, Snapshot, Target
from kgroup.core.objects import Obj
from kgroup.core.operator import decide as operator_logic
from kgroup.core.operator.decide import Mark
from kgroup_sim import control
from kgroup_sim.store import Store, WriteError, unassigned_acquisition
from kgroup_sim.world import Fault, SimConfig
from kgroup_sim.world import World as SimWorld

GROUP = {"metadata": {"name": "g", "uid": "u"}}
WALL = datetime(2026, 1, 1, tzinfo=UTC)


def lock(p: int, rv: str, *, assigned: str | None = None, holder: str | None = None,
         session: str | None = None, token: int = 0) -> Obj:
    body = codec.new_partition_lease(namespace="ns", group=GROUP, partition=p, duration=15,
                                     assigned=assigned)
    body["metadata"]["resourceVersion"] = rv
    if holder:
        body = codec.acquired_partition_lease(body, member=holder, session=session or "s",
                                              token=token, duration=15,
                                              now=WALL)
    return body


# ---- the member: a lock marked for someone else (or for nobody) is not takeable ---------


def test_a_free_targeted_lock_is_acquired_only_once_it_is_marked_for_this_member() -> None:
    w = World()
    w.marks = False
    w.target = Target(1, frozenset({0, 1, 2}))
    w.locks[1] = dataclasses.replace(w.locks[1], assigned="pod-b")
    w.locks[2] = dataclasses.replace(w.locks[2], assigned=ME)
    m = joined(w)
    acquired = [a.partition for a in of(m.step(w.snap(0.1)), Acquire)]
    assert acquired == [2]  # 0 unmarked, 1 marked for pod-b: the API server would refuse
    w.rv += 1
    w.locks[0] = dataclasses.replace(w.locks[0], assigned=ME, resource_version=str(w.rv))
    assert [a.partition for a in of(m.step(w.snap(0.2)), Acquire)] == [0]
    assert m.next_wakeup(w.snap(0.2)) is not None  # renewals only: no retry loop on 1


def test_the_mark_is_read_from_the_lease() -> None:
    parsed = codec.parse_partition_lease(lock(3, "7", assigned="pod-b")).value
    assert parsed is not None and parsed.assigned == "pod-b"
    assert codec.parse_partition_lease(lock(3, "7")).value.assigned is None
    patched = codec.marked_partition_lease(lock(3, "7", assigned="pod-b"), ME)
    assert codec.assigned_of(patched) == ME
    assert codec.assignment_patch(ME, "uid-1", "7") == {"metadata": {
        "resourceVersion": "7",
        "annotations": {"kgroup.dev/assigned": ME, "kgroup.dev/assigned-uid": "uid-1"}}}
    # no uid known: the merge patch removes the previous one (null deletes a key)
    assert codec.assignment_patch(ME, None, "7")["metadata"]["annotations"] == {
        "kgroup.dev/assigned": ME, "kgroup.dev/assigned-uid": None}
    with_uid = codec.marked_partition_lease(lock(3, "7", assigned="pod-b"), ME, "uid-1")
    parsed_uid = codec.parse_partition_lease(with_uid).value
    assert parsed_uid is not None and parsed_uid.assigned_uid == "uid-1"
    assert codec.parse_partition_lease(
        codec.marked_partition_lease(with_uid, "pod-b")).value.assigned_uid is None


# ---- the operator: marks follow the target, one write per moved partition --------------


def _put_locks(op: Op, marks: dict[int, str | None], rv: int = 40) -> None:
    for p, member in marks.items():
        op.leases.put(lock(p, str(rv + p), assigned=member), op.now)


def test_new_locks_are_created_marked_and_moved_partitions_get_one_mark_each() -> None:
    op = Op("a", "b")
    first = op.decide()
    assert first.create_partitions == [0, 1, 2, 3]
    assert first.owners == {0: "a", 1: "a", 2: "b", 3: "b"}  # created with their marks
    assert first.marks == []  # no lock exists yet
    op.write(first, "11")
    _put_locks(op, dict(first.owners))
    assert op.decide().marks == []  # every mark matches the target: no write
    op.leases.put(member_lease("c", "31"), op.now)
    op.pods = pods("a", "b", "c")
    move = op.decide()
    assert move.status is not None and move.status["epoch"] == 2
    moved = {p for p, m in move.owners.items() if first.owners[p] != m}
    assert moved and [(k.partition, k.member) for k in move.marks] == [
        (p, move.owners[p]) for p in sorted(moved)]


def test_a_sent_mark_is_not_sent_again_until_the_lock_changes_and_a_hand_edit_is_repaired(
        ) -> None:
    op = Op("a")
    plan = op.decide()
    op.write(plan, "11")
    _put_locks(op, {0: None, 1: "a", 2: "a", 3: "a"})
    first = op.decide()
    assert first.marks == [Mark(0, "a", "40")]
    op.memory.mark_sent(first.marks[0])
    assert op.decide().marks == []  # in flight: the cache has not seen it yet
    op.leases.put(lock(0, "50", assigned="a"), op.now)  # the answer / watch event
    assert op.decide().marks == []
    op.leases.put(lock(0, "60", assigned="mallory"), op.now)  # a hand edit of the mark
    assert op.decide().marks == [Mark(0, "a", "60")]
    op.memory.mark_failed(Mark(0, "a", "60"))  # refused or unanswered: asked for again
    assert op.decide().marks == [Mark(0, "a", "60")]
    restarted = Op("a")  # a new operator process: it reads the marks from the locks
    restarted.body, restarted.leases = op.body, op.leases
    assert restarted.decide().marks == [Mark(0, "a", "60")]


# ---- the simulated API server refuses as the admission policy does --------------------


def test_the_simulated_store_refuses_an_acquisition_by_a_member_not_marked() -> None:
    store = Store(lambda *_: None)
    store.create("leases/g-partition-0", lock(0, "", assigned="pod-b"))
    current = store.get("leases/g-partition-0")
    assert current is not None
    take = codec.acquired_partition_lease(current, member=ME, session="s1", token=1,
                                          duration=15,
                                          now=WALL)
    try:
        store.update("leases/g-partition-0", take)
        raise AssertionError("acquisition by an unassigned member was accepted")
    except WriteError as exc:
        assert exc.status == 403
    assert store.refused == 1
    marked = store.update("leases/g-partition-0", codec.marked_partition_lease(current, ME))
    take = codec.acquired_partition_lease(marked, member=ME, session="s1", token=1,
                                          duration=15,
                                          now=WALL)
    assert store.update("leases/g-partition-0", take)["spec"]["holderIdentity"] == ME
    # the holder's own new session counts as an acquisition; a release does not
    held = lock(0, "9", assigned="pod-b", holder=ME, session="s1", token=1)
    again = lock(0, "9", assigned="pod-b", holder=ME, session="s2", token=2)
    assert unassigned_acquisition(held, again) is not None
    released = codec.released_partition_lease(held, token=1, position=None)
    assert unassigned_acquisition(held, released) is None


class IgnoresMarks(Member):
    """A broken member: it tries every targeted lock whatever its mark says."""

    def step(self, snap: Snapshot) -> list[Any]:
        marked = {p: dataclasses.replace(lock, assigned=self.member, assigned_uid=self.uid)
                  for p, lock in snap.locks.items()}
        return super().step(Snapshot(snap.now, snap.timing, snap.drain_timeout, snap.target,
                                     marked, snap.app_releases,
                                     snap.group_deleted))


def test_the_simulation_checks_the_rule_a_member_ignoring_marks_is_refused() -> None:
    shipped = SimWorld(8, SMALL)
    assert shipped.run().ok and shipped.store.refused == 0
    broken = SimWorld(8, SimConfig(**{**SMALL.__dict__, "member_factory": IgnoresMarks}))
    broken.run()
    assert broken.store.refused > 0


def test_marks_garbled_by_hand_are_repaired_and_a_shortcut_operator_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An admin overwrites every lock's mark (kgroup.dev/assigned: mallory) while the group
    is stable (then a member joins, or not). The shipped operator compares the marks with the target
    on every pass and repairs them; the simulation's convergence includes the marks. An
    operator that writes marks only when the target changes leaves them garbled for good
    (the unmoved partitions' holders could never re-acquire after a fence)."""
    edit = (Fault(12.0, "mark-edit"),)
    for script in (edit, (*edit, Fault(14.0, "join"))):
        shipped = SimWorld(0, quiet(script=script))
        result = shipped.run()
        assert result.ok, result.violations
        assert result.faults.get("mark-edit") == 1 and shipped.store.refused == 0

    def only_on_target_change(*args: Any, **kwargs: Any) -> Any:
        plan = operator_logic.decide(*args, **kwargs)
        if plan.decision is None or plan.decision.target is None:
            plan.marks = []
        return plan

    monkeypatch.setattr(control, "decide", only_on_target_change)
    shortcut = SimWorld(0, quiet(script=edit)).run()
    assert [v.kind for v in shortcut.violations] == ["liveness"]
    assert "marked for mallory" in shortcut.violations[0].detail
