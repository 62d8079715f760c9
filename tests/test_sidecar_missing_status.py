"""Pods labelled with a group that run without the kgroup sidecar: which pods count, the
SidecarMissing condition, status.sidecarMissing, and what they do to the other conditions
(pure: status aggregation, the decision of one pass, and which group loop a pod's event
wakes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kgroup import constants as C
from kgroup.core.operator.decide import Memory, Observation, decide
from kgroup.core.operator.lease_cache import GroupLeases, pod_observation
from kgroup.core.operator.planner import PodObservation
from kgroup.core.operator.status import (
    MemberLeaseObservation,
    aggregate_status,
    pods_without_sidecar,
)
from kgroup.crd_models import ConsumerGroupSpec, ConsumerGroupStatus, LabelSelector
from kgroup_operator.groups import GroupLoops
from kgroup_operator.settings import OperatorSettings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TARGET = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
HELD = {p: m for m, ps in TARGET.items() for p in ps}
SPEC = ConsumerGroupSpec.model_validate({"partitions": 8,
                                         "selector": {"matchLabels": {"app": "w"}}})


def agg(bare: list[str], *, members: set[str] | None = None) -> ConsumerGroupStatus:
    members = set(TARGET) if members is None else members
    status, _ = aggregate_status(
        spec=SPEC, generation=1, previous=ConsumerGroupStatus(), epoch=3,
        target={m: ps for m, ps in TARGET.items() if m in members}, members=members,
        member_leases={m: MemberLeaseObservation(m, "s-" + m, "3") for m in members},
        holders={p: m for p, m in HELD.items() if m in members}, last_change_at=0.0,
        now=1.0, wall=T0, bare_pods=bare)
    return status


def cond(status: ConsumerGroupStatus, ctype: str) -> tuple[str, str, str]:
    c = next(c for c in status.conditions if c.type == ctype)
    return c.status, c.reason, c.message


def pod(name: str, *, group: str | None = "orders", sidecar: bool = False,
        phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    labels = {"app": "w", **({C.LABEL_GROUP: group} if group else {})}
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    init = [{"name": C.SIDECAR_CONTAINER, "image": "s", "restartPolicy": "Always"}] \
        if sidecar else []
    return {"metadata": meta,
            "spec": {"initContainers": init, "containers": [{"name": "app", "image": "a"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_only_running_pods_labelled_with_this_group_and_without_the_sidecar_count() -> None:
    pods = [pod("bare-b"), pod("bare-a"), pod("with", sidecar=True),
            pod("other-group", group="payments"), pod("unlabelled", group=None),
            pod("pending", phase="Pending"), pod("going", deleting=True)]
    assert pods_without_sidecar("orders", [pod_observation(p) for p in pods]) == [
        "bare-a", "bare-b"]
    # a plain sidecar container counts as a sidecar too
    plain = pod("plain")
    plain["spec"]["containers"].append({"name": C.SIDECAR_CONTAINER, "image": "s"})
    assert pod_observation(plain).sidecar
    assert not pod_observation(pod("x")).sidecar


def test_a_pod_without_the_sidecar_is_named_in_a_condition_and_in_the_status() -> None:
    st = agg(["bare-0"])
    status, reason, message = cond(st, "SidecarMissing")
    assert (status, reason) == ("True", "PodsWithoutSidecar")
    assert message == ("1 pod labelled with the group runs without the kgroup-sidecar "
                       "container, taking no part in it: bare-0 (delete it to have it "
                       "re-created with the sidecar)")
    assert st.to_wire()["sidecarMissing"] == {"count": 1, "pods": ["bare-0"]}


def test_every_pod_with_its_sidecar_leaves_the_condition_false_and_no_list() -> None:
    st = agg([])
    assert cond(st, "SidecarMissing")[:2] == ("False", "AllPodsHaveSidecar")
    assert "sidecarMissing" not in st.to_wire()


def test_many_pods_are_counted_and_the_names_are_capped() -> None:
    names = [f"bare-{i:02}" for i in range(40)]
    st = agg(names)
    message = cond(st, "SidecarMissing")[2]
    assert message.startswith("40 pods labelled with the group run without")
    assert "bare-00, bare-01, bare-02, bare-03, bare-04 and 35 more" in message
    assert "bare-05" not in message
    assert st.sidecar_missing is not None and st.sidecar_missing.count == 40
    assert st.sidecar_missing.pods == names[:10]


def test_beside_members_a_pod_without_the_sidecar_degrades_nothing_else() -> None:
    """Partitions all owned by the members: the group works on (Ready, not Stalled)."""
    with_bare, without = agg(["bare-0"]), agg([])
    assert with_bare.phase == without.phase == "Stable"
    for ctype in ("Ready", "Rebalancing", "Degraded", "Stalled", "Reconciling"):
        assert cond(with_bare, ctype) == cond(without, ctype), ctype
    assert cond(with_bare, "Ready")[0] == "True" and cond(with_bare, "Stalled")[0] == "False"


def test_without_any_member_pods_without_the_sidecar_stall_the_group() -> None:
    """Nothing consumes, and nothing will until the pods are replaced: kstatus' Failed."""
    st = agg(["bare-0"], members=set())
    assert st.phase == "Pending"
    status, reason, message = cond(st, "Stalled")
    assert (status, reason) == ("True", "SidecarMissing") and "bare-0" in message
    assert cond(st, "Reconciling")[:2] == ("False", "Stalled")
    assert cond(agg([], members=set()), "Stalled")[:2] == ("False", "Progressing")


def test_a_pass_of_the_operator_reports_the_pods_labelled_with_its_group() -> None:
    body = {"apiVersion": "kgroup.dev/v1alpha1", "kind": "ConsumerGroup",
            "metadata": {"name": "orders", "namespace": "ns", "generation": 1,
                         "resourceVersion": "1"},
            "spec": SPEC.to_wire()}
    pods = [pod_observation(p) for p in (pod("bare-0"), pod("with", sidecar=True),
                                         pod("other", group="payments"))]
    plan = decide(Observation(body=body, leases=GroupLeases(), pods=pods, synced=True),
                  Memory(started_at=0.0), 1.0, wall=T0, status_min_interval=0.0)
    assert plan.status is not None
    assert plan.status["sidecarMissing"] == {"count": 1, "pods": ["bare-0"]}
    (missing,) = [c for c in plan.status["conditions"] if c["type"] == "SidecarMissing"]
    assert missing["status"] == "True" and "bare-0" in missing["message"]
    everyone = [PodObservation(name=p.name, labels=p.labels, uid=p.uid) for p in pods]
    plan = decide(Observation(body=body, leases=GroupLeases(), pods=everyone, synced=True),
                  Memory(started_at=0.0), 1.0, wall=T0, status_min_interval=0.0)
    assert plan.status is not None and "sidecarMissing" not in plan.status


def test_a_pod_event_pokes_the_group_the_pod_is_labelled_with_even_unselected() -> None:
    """A pod that carries only the injector's label is reported on that group: its
    events wake that group's loop, though the group's selector does not match it."""
    class Loop:
        def __init__(self, selector: dict[str, str]) -> None:
            self.selector = LabelSelector(match_labels=selector)
            self.pokes = 0

        def poke(self) -> None:
            self.pokes += 1

    rt = GroupLoops(kube=None, settings=OperatorSettings())  # type: ignore[arg-type]
    loops = {("ns", "orders"): Loop({"app": "w"}), ("ns", "payments"): Loop({"app": "p"}),
             ("other", "orders"): Loop({"app": "w"})}
    rt.controllers.update(loops)  # type: ignore[arg-type]
    bare = pod_observation(pod("bare", group="orders"))
    only_label = PodObservation(name="bare", labels={C.LABEL_GROUP: "orders"})
    rt.poke_pod("ns", None, only_label)
    rt.poke_pod("ns", only_label, None)
    assert [loop.pokes for loop in loops.values()] == [2, 0, 0]
    rt.poke_pod("ns", None, bare)  # labelled and selected: one poke, not two
    assert [loop.pokes for loop in loops.values()] == [3, 0, 0]
