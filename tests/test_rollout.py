"""Which names come back (restart grace by pod kind), and who replaces whom in a rollout."""

from __future__ import annotations

from typing import Any

import pytest

from kgroup.core.operator.lease_cache import pod_observation
from kgroup.core.operator.planner import GroupPlanner, PodObservation
from kgroup.core.operator.rollout import replacements, restart_grace, statefulset_ordinal
from kgroup.crd_models import ConsumerGroupSpec


def spec(**kw: Any) -> ConsumerGroupSpec:
    base: dict[str, Any] = {"partitions": 8, "selector": {"matchLabels": {"app": "w"}}}
    base.update(kw)
    return ConsumerGroupSpec.model_validate(base)


def deploy(name: str, rev: str, **kw: Any) -> PodObservation:
    return PodObservation(name=name, labels={"app": "w"}, owner_kind="ReplicaSet",
                          workload="Deployment/w", revision=rev, **kw)


def sts(name: str, **kw: Any) -> PodObservation:
    return PodObservation(name=name, labels={"app": "w"}, owner_kind="StatefulSet",
                          workload="StatefulSet/w", revision="w-1", **kw)


# ---- the pod's controller, read from the API object ----------------------------------


def body(refs: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": labels, "ownerReferences": refs},
            "status": {"phase": "Running"}}


def test_a_deployments_pod_belongs_to_the_deployment_whatever_its_replicaset() -> None:
    obs = pod_observation(body([{"kind": "ReplicaSet", "name": "orders-5d9f8", "controller":
                                 True}], {"pod-template-hash": "5d9f8"}))
    assert (obs.owner_kind, obs.workload, obs.revision) == (
        "ReplicaSet", "Deployment/orders", "5d9f8")


def test_a_statefulsets_pod_carries_its_controller_revision() -> None:
    obs = pod_observation(body([{"kind": "StatefulSet", "name": "orders", "controller": True}],
                               {"controller-revision-hash": "orders-7c6b"}))
    assert (obs.owner_kind, obs.workload, obs.revision) == (
        "StatefulSet", "StatefulSet/orders", "orders-7c6b")


def test_only_the_controller_reference_counts_and_a_bare_pod_has_none() -> None:
    obs = pod_observation(body([{"kind": "ConfigMap", "name": "x"}], {}))
    assert (obs.owner_kind, obs.workload, obs.revision) == ("", "", "")


# ---- restart grace: names that can come back -------------------------------------------


def test_a_statefulset_pod_gets_the_statefulset_grace_even_when_deleted() -> None:
    s = spec()
    assert restart_grace(s, sts("w-0", terminating=True), present=True) == 30
    assert restart_grace(s, sts("w-0"), present=False) == 30
    assert restart_grace(spec(restartGraceSeconds=60), sts("w-0"), present=False) == 60


def test_a_deployments_pod_on_its_way_out_gets_no_grace_whatever_is_set() -> None:
    s = spec(restartGraceSeconds=60)
    assert restart_grace(s, deploy("a", "1", terminating=True), present=True) == 0
    assert restart_grace(s, deploy("a", "1"), present=False) == 0


def test_a_pod_still_there_and_bare_or_unknown_pods_get_the_restart_grace() -> None:
    s = spec(restartGraceSeconds=60)
    assert restart_grace(s, deploy("a", "1"), present=True) == 60  # container restart
    assert restart_grace(s, PodObservation(name="a"), present=False) == 60  # bare pod
    assert restart_grace(s, None, present=False) == 60  # never seen
    assert restart_grace(spec(), deploy("a", "1"), present=True) == 0  # the default


def test_a_statefulset_pod_returning_within_the_default_grace_keeps_its_partitions() -> None:
    p, s = GroupPlanner(), spec()
    two = {"w-0": [0, 1, 2, 3], "w-1": [4, 5, 6, 7]}
    pods = [sts("w-0"), sts("w-1")]
    assert p.plan(spec=s, target=two, epoch=2, members={"w-0", "w-1"}, holders={}, now=0,
                  pods=pods).target is None
    gone = p.plan(spec=s, target=two, epoch=2, members={"w-0"}, holders={}, now=1,
                  pods=[sts("w-0")])  # SIGTERM, pod deleted: the name comes back
    assert gone.target is None and gone.next_check == 31
    back = p.plan(spec=s, target=two, epoch=2, members={"w-0", "w-1"}, holders={}, now=9,
                  pods=pods)
    assert back.target is None


def test_a_statefulset_pod_whose_ordinal_its_statefulset_no_longer_keeps_gets_no_grace() -> None:
    s = spec()
    kept = {"StatefulSet/w": range(0, 3)}  # scaled 4 -> 3: w-3 does not come back
    assert restart_grace(s, sts("w-3", terminating=True), present=True,
                         kept_ordinals=kept) == 0
    assert restart_grace(s, sts("w-3"), present=False, kept_ordinals=kept) == 0
    assert restart_grace(s, sts("w-2"), present=False, kept_ordinals=kept) == 30
    assert restart_grace(s, sts("w-3"), present=False, kept_ordinals={}) == 30  # unknown
    assert restart_grace(s, sts("w-3"), present=False,
                         kept_ordinals={"StatefulSet/other": range(0)}) == 30
    start5 = {"StatefulSet/w": range(5, 8)}  # spec.ordinals.start: 5, replicas 3
    assert restart_grace(s, sts("w-5"), present=False, kept_ordinals=start5) == 30
    assert restart_grace(s, sts("w-4"), present=False, kept_ordinals=start5) == 0
    deleted = {"StatefulSet/w": range(0)}  # the StatefulSet itself is gone
    assert restart_grace(s, sts("w-0"), present=False, kept_ordinals=deleted) == 0


def test_a_pod_never_seen_is_a_statefulsets_pod_if_its_name_has_an_ordinal_it_keeps() -> None:
    """An operator started while a StatefulSet's pod was away never saw that pod: its name
    and the StatefulSet's kept ordinals say it comes back."""
    s, kept = spec(), {"StatefulSet/w": range(0, 2)}
    assert restart_grace(s, None, present=False, kept_ordinals=kept, name="w-1") == 30
    assert restart_grace(s, None, present=False, kept_ordinals=kept, name="w-2") == 0
    assert restart_grace(s, None, present=False, kept_ordinals=kept, name="v-1") == 0
    assert restart_grace(s, None, present=False, kept_ordinals={}, name="w-1") == 0
    assert restart_grace(s, None, present=False, kept_ordinals=kept) == 0  # no name


def test_an_operator_restarted_while_a_statefulset_pod_is_away_keeps_its_partitions() -> None:
    two = {"w-0": [0, 1, 2, 3], "w-1": [4, 5, 6, 7]}
    fresh = GroupPlanner()  # a new operator process: w-1's pod was never seen
    d = fresh.plan(spec=spec(), target=two, epoch=2, members={"w-0"}, holders={}, now=100,
                   pods=[sts("w-0")], kept_ordinals={"StatefulSet/w": range(0, 2)})
    assert d.target is None and d.next_check == 130
    unknown = GroupPlanner().plan(spec=spec(), target=two, epoch=2, members={"w-0"},
                                  holders={}, now=100, pods=[sts("w-0")])
    assert unknown.target == {"w-0": list(range(8))}  # nothing says the name comes back


@pytest.mark.parametrize(("name", "ordinal"), [
    ("orders-worker-0", 0), ("orders-worker-12", 12), ("w-3", 3), ("w", None),
    ("w-03", None), ("w-x", None), ("w-", None)])
def test_the_ordinal_is_the_name_s_last_dash_number(name: str, ordinal: int | None) -> None:
    assert statefulset_ordinal(name) == ordinal


def test_a_statefulset_scaled_down_hands_the_removed_pods_partitions_out_at_once() -> None:
    p, s = GroupPlanner(), spec()
    two = {"w-0": [0, 1, 2, 3], "w-1": [4, 5, 6, 7]}
    pods = [sts("w-0"), sts("w-1")]
    keep2 = {"StatefulSet/w": range(0, 2)}
    p.plan(spec=s, target=two, epoch=2, members={"w-0", "w-1"}, holders={}, now=0,
           pods=pods, kept_ordinals=keep2)
    keep1 = {"StatefulSet/w": range(0, 1)}  # kubectl scale --replicas=1
    d = p.plan(spec=s, target=two, epoch=2, members={"w-0"}, holders={}, now=1,
               pods=[sts("w-0"), sts("w-1", terminating=True)], kept_ordinals=keep1)
    assert d.target == {"w-0": list(range(8))} and d.moved == 4
    # the same departure while the StatefulSet still keeps w-1 (a restart): the grace
    q = GroupPlanner()
    q.plan(spec=s, target=two, epoch=2, members={"w-0", "w-1"}, holders={}, now=0,
           pods=pods, kept_ordinals=keep2)
    r = q.plan(spec=s, target=two, epoch=2, members={"w-0"}, holders={}, now=1,
               pods=[sts("w-0"), sts("w-1", terminating=True)], kept_ordinals=keep2)
    assert r.target is None and r.next_check == 31


def test_a_deployment_pod_leaving_gracefully_is_handed_out_at_once_despite_a_grace() -> None:
    p, s = GroupPlanner(), spec(restartGraceSeconds=60)
    two = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=0,
           pods=[deploy("a", "1"), deploy("b", "1")])
    d = p.plan(spec=s, target=two, epoch=2, members={"a"}, holders={}, now=1,
               pods=[deploy("a", "1"), deploy("b", "1", terminating=True)])
    assert d.target == {"a": list(range(8))} and d.moved == 4


# ---- replacements ----------------------------------------------------------------------


def test_a_new_revision_pod_waits_while_the_old_revision_holds_partitions() -> None:
    pods = {"a": deploy("a", "1"), "b": deploy("b", "1"), "n": deploy("n", "2")}
    r = replacements(current={"a": [0, 1], "b": [2, 3]}, members={"a", "b", "n"}, pods=pods)
    assert r.waiting == {"n"} and r.paired == {}


def test_a_leaving_old_pods_partitions_go_whole_to_a_waiting_new_pod() -> None:
    pods = {"a": deploy("a", "1"), "b": deploy("b", "1"), "n": deploy("n", "2")}
    r = replacements(current={"a": [0, 1], "b": [2, 3], "n": []}, members={"b", "n"},
                     pods=pods)
    assert r.paired == {"n": "a"} and r.waiting == frozenset()
    assert r.current == {"b": [2, 3], "n": [0, 1]}


def test_same_revision_joins_and_other_workloads_are_plain_joins() -> None:
    pods = {"a": deploy("a", "1"), "n": deploy("n", "1"),
            "o": PodObservation(name="o", owner_kind="ReplicaSet", workload="Deployment/other",
                                revision="9"),
            "s": sts("s")}
    r = replacements(current={"a": [0, 1, 2, 3]}, members={"a", "n", "o", "s"}, pods=pods)
    assert r.waiting == frozenset() and r.paired == {}


def test_the_planner_admits_a_waiting_pod_at_once_and_hands_it_the_leavers_share() -> None:
    p, s = GroupPlanner(), spec()  # window 5 s: neither step waits for it
    two = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    old = [deploy("a", "1"), deploy("b", "1")]
    p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=0, pods=old)
    p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=1, pods=old)
    joined = p.plan(spec=s, target=two, epoch=2, members={"a", "b", "n"}, holders={}, now=2,
                    pods=[*old, deploy("n", "2")])
    assert joined.target == {**two, "n": []} and joined.moved == 0
    left = p.plan(spec=s, target=joined.target, epoch=3, members={"b", "n"}, holders={},
                  now=3, pods=[deploy("a", "1", terminating=True), old[1], deploy("n", "2")])
    assert left.target == {"b": [4, 5, 6, 7], "n": [0, 1, 2, 3]} and left.moved == 4


# ---- a pod that merely turned unready ------------------------------------------------


def test_a_member_whose_app_turned_unready_keeps_its_partitions_for_the_window() -> None:
    """Its session is live and its pod is there, not terminating (an app container
    restarting): the departure waits for the window, as before, and moves nothing if the
    app is back within it. With the session gone the same departure acts at once."""
    two = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    pods = [deploy("a", "1"), deploy("b", "1")]
    for sessions, acted in (({"a", "b"}, False), ({"a"}, True)):
        p, s = GroupPlanner(), spec()
        p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=0, pods=pods,
               sessions={"a", "b"})
        d = p.plan(spec=s, target=two, epoch=2, members={"a"}, holders={}, now=10, pods=pods,
                   sessions=sessions)
        assert (d.target is not None) is acted
        if not acted:
            assert d.next_check == 15
            back = p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=12,
                          pods=pods, sessions={"a", "b"})
            assert back.target is None


def test_a_terminating_pod_is_handed_out_at_once_even_with_its_session_live() -> None:
    p, s = GroupPlanner(), spec()
    two = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    p.plan(spec=s, target=two, epoch=2, members={"a", "b"}, holders={}, now=0,
           pods=[deploy("a", "1"), deploy("b", "1")], sessions={"a", "b"})
    d = p.plan(spec=s, target=two, epoch=2, members={"a"}, holders={}, now=1,
               pods=[deploy("a", "1"), deploy("b", "1", terminating=True)], sessions={"a", "b"})
    assert d.target == {"a": list(range(8))}
