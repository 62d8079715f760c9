"""The assignment mark binds the pod's uid: which uid the operator marks
(``kgroup.core.operator.pod_identity``), the locks it re-marks, the member that waits for a mark
naming its own pod, and the marks of an older operator (no uid) rewritten."""

from __future__ import annotations

import dataclasses

from test_assignment_marks import _put_locks, lock
from test_member import ME, World, joined, of
from test_operator_logic import Op

from kgroup.core import lease_codec as codec
from kgroup.core.member.reconcile import Acquire
from kgroup.core.operator.decide import Mark
from kgroup.core.operator.planner import PodObservation
from kgroup.core.operator.pod_identity import PodIdentities

STS = "StatefulSet/web"


def pod(name: str, uid: str, workload: str = STS) -> PodObservation:
    kind = workload.split("/", 1)[0] if workload else ""
    return PodObservation(name=name, labels={"app": "x"}, owner_kind=kind, workload=workload,
                          uid=uid)


def grace30(_: PodObservation) -> float:
    return 30.0


# ---- which uid a name's marks are for --------------------------------------------------


def test_the_marks_name_the_uid_of_the_pod_seen_and_keep_it_while_the_pod_is_away() -> None:
    ids = PodIdentities()
    assert ids.resolve(["web-0"], [pod("web-0", "u1")], 0.0, grace30) == ({"web-0": "u1"}, None)
    # the pod is gone (a restart within the grace): the marks keep its uid
    assert ids.resolve(["web-0"], [], 1.0, grace30) == ({"web-0": "u1"}, None)


def test_the_statefulsets_pod_back_with_a_new_uid_gets_the_marks_at_once() -> None:
    ids = PodIdentities()
    ids.resolve(["web-0"], [pod("web-0", "u1")], 0.0, grace30)
    ids.resolve(["web-0"], [], 1.0, grace30)
    assert ids.resolve(["web-0"], [pod("web-0", "u2")], 2.0, grace30) == ({"web-0": "u2"}, None)


def test_a_bare_pod_under_a_departed_statefulset_pods_name_waits_out_the_grace() -> None:
    ids = PodIdentities()
    ids.resolve(["web-0"], [pod("web-0", "u1")], 0.0, grace30)
    ids.resolve(["web-0"], [], 10.0, grace30)  # seen gone at 10: the grace runs to 40
    impostor = [pod("web-0", "evil", workload="")]
    assert ids.resolve(["web-0"], impostor, 11.0, grace30) == ({"web-0": "u1"}, 40.0)
    assert ids.resolve(["web-0"], impostor, 39.9, grace30) == ({"web-0": "u1"}, 40.0)
    # the grace is over (the StatefulSet could not re-create its pod): a member like any
    assert ids.resolve(["web-0"], impostor, 40.0, grace30) == ({"web-0": "evil"}, None)


def test_another_workloads_pod_replacing_a_pod_unseen_gone_also_waits_the_grace() -> None:
    ids = PodIdentities()
    ids.resolve(["web-0"], [pod("web-0", "u1")], 0.0, grace30)
    other = [pod("web-0", "u9", workload="StatefulSet/other")]
    assert ids.resolve(["web-0"], other, 5.0, grace30) == ({"web-0": "u1"}, 35.0)


def test_a_bare_pod_after_a_bare_pod_and_a_first_sight_are_adopted_at_once() -> None:
    ids = PodIdentities()
    ids.resolve(["p"], [pod("p", "u1", workload="")], 0.0, grace30)
    assert ids.resolve(["p"], [pod("p", "u2", workload="")], 1.0, grace30)[0] == {"p": "u2"}
    fresh = PodIdentities()  # an operator restart: the first pod seen is adopted
    assert fresh.resolve(["p"], [pod("p", "u3", workload="")], 0.0, grace30)[0] == {"p": "u3"}


def test_names_no_longer_targeted_are_forgotten_and_pods_without_uid_are_unknown() -> None:
    ids = PodIdentities()
    ids.resolve(["a"], [pod("a", "u1")], 0.0, grace30)
    assert ids.resolve([], [pod("a", "u1")], 1.0, grace30) == ({}, None)
    assert ids.incumbents == {} and ids.vacated == {}
    assert ids.resolve(["a"], [pod("a", "")], 2.0, grace30) == ({}, None)


# ---- the operator's marks carry the uid --------------------------------------------------


def test_locks_are_created_and_marked_with_the_pods_uid_and_re_marked_when_it_changes(
        ) -> None:
    op = Op("a")
    op.pods = [pod("a", "ua", workload="")]
    first = op.decide()
    assert first.uids == {"a": "ua"}  # the creates carry it (controller: plan.uids)
    op.write(first, "11")
    _put_locks(op, {0: "a", 1: "a", 2: "a", 3: "a"})  # marks of an older operator: no uid
    upgrade = op.decide()
    assert upgrade.marks == [Mark(p, "a", str(40 + p), "ua") for p in range(4)]
    for p in range(4):
        op.leases.put(codec.marked_partition_lease(lock(p, str(50 + p), assigned="a"), "a",
                                                   "ua"), op.now)
    assert op.decide().marks == []
    op.pods = [pod("a", "ua2", workload="")]  # a bare pod re-created under the name
    assert [m.uid for m in op.decide().marks] == ["ua2"] * 4


def test_a_mark_sent_with_a_uid_is_sent_again_with_the_new_uid_not_twice_with_one() -> None:
    op = Op("a")
    op.pods = [pod("a", "u1", workload="")]
    op.write(op.decide(), "11")
    _put_locks(op, {0: "a"})
    mark = op.decide().marks[0]
    op.memory.mark_sent(mark)
    assert op.decide().marks == []  # in flight
    op.pods = [pod("a", "u2", workload="")]
    assert op.decide().marks == [Mark(0, "a", "40", "u2")]  # another uid: a new mark


# ---- the member acquires only a lock marked for its own pod -------------------------------


def test_a_member_that_knows_its_uid_waits_for_a_mark_naming_it() -> None:
    w = World()
    w.marks = False
    w.target = dataclasses.replace(w.target, partitions=frozenset({0, 1, 2}))
    w.locks[0] = dataclasses.replace(w.locks[0], assigned=ME, assigned_uid="old-uid")
    w.locks[1] = dataclasses.replace(w.locks[1], assigned=ME)  # an older operator's mark
    w.locks[2] = dataclasses.replace(w.locks[2], assigned=ME, assigned_uid="my-uid")
    m = joined(w)
    m.uid = "my-uid"
    assert [a.partition for a in of(m.step(w.snap(0.1)), Acquire)] == [2]
    blind = joined(w)  # no KGROUP_POD_UID: the name alone (the API server checks the uid)
    assert blind.uid is None
    assert [a.partition for a in of(blind.step(w.snap(0.1)), Acquire)] == [0, 1, 2]
