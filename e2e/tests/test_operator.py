"""The operator against the real local control plane, with scripted members.

The operator runs as a real subprocess (``.venv/bin/kgroup-operator``, cluster-admin
kubeconfig for now). Pods are real (kwok makes them Running on fake nodes); the sidecars
are stood in for by :class:`Members`, which creates and renews member Leases and, when a
test wants owned counts, takes and releases partition locks the way a sidecar would.
Group settings are short: window 1 s, lease duration 3 s, renew every 1 s.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP, Members, OperatorProcess

from kgroup import constants as C
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster

APP = "orders-worker"


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture
def operator(cluster: Cluster, crd: list[str], namespace: str,
             tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, namespace, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()
        text = op.log_text()
        sys.stdout.write(text[-4000:])
        assert "Traceback" not in text, "the operator logged a traceback"


def make_pods(kube: client.ApiClient, namespace: str, *names: str,
              labels: dict[str, str] | None = None) -> None:
    core = client.CoreV1Api(kube)
    for name in names:
        core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels=labels or {"app": APP}),
            spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
                client.V1Container(name="main", image="example.invalid/worker:1")])))

    def running() -> bool:
        pods: Any = core.list_namespaced_pod(namespace)
        ok = {p.metadata.name for p in pods.items if p.status.phase == "Running"
              and any(c.type == "Ready" and c.status == "True"
                      for c in p.status.conditions or [])}
        return set(names) <= ok

    wait_for(f"pods {names} running", running, timeout=90)


def make_group(kube: client.ApiClient, namespace: str, *, partitions: int = 8,
               selector: dict[str, str] | None = None, **spec: Any) -> str:
    body = {"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
            "metadata": {"name": GROUP},
            "spec": {"partitions": partitions,
                     "selector": {"matchLabels": selector or {"app": APP}},
                     "stabilizationWindowSeconds": 1, "stabilizationMaxDelaySeconds": 10,
                     "lease": {"durationSeconds": 3, "renewIntervalSeconds": 1},
                     "handoff": {"drainTimeoutSeconds": 2}, **spec}}
    obj: Any = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, body)
    return str(obj["metadata"]["uid"])


def get_status(kube: client.ApiClient, namespace: str) -> dict[str, Any]:
    obj: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
    return dict(obj.get("status") or {})


def patch_spec(kube: client.ApiClient, namespace: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP, {"spec": spec})


def target(status: dict[str, Any]) -> dict[str, list[int]]:
    return {m: parse_ranges(r) for m, r in (status.get("assignment") or {}).items()}


def status_where(kube: client.ApiClient, namespace: str, what: str,
                 pred: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        st = get_status(kube, namespace)
        return st if pred(st) else {}

    return wait_for(what, check, timeout=timeout)


def stays(what: str, pred: Callable[[], bool], seconds: float) -> None:
    """Poll `pred` for `seconds`; fail the first time it is false."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pred(), f"no longer true: {what}"
        time.sleep(0.2)


def condition(status: dict[str, Any], ctype: str) -> tuple[str, str]:
    for c in status.get("conditions") or []:
        if c["type"] == ctype:
            return str(c["status"]), str(c["reason"])
    return ("", "")


def event_reasons(kube: client.ApiClient, namespace: str) -> list[str]:
    events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
    return [e.reason for e in events.items if e.involved_object.kind == C.KIND]


@pytest.fixture
def members_factory(kube: client.ApiClient, namespace: str) -> Iterator[
        Callable[..., Members]]:
    made: list[Members] = []

    def make(uid: str, converge: bool = False) -> Members:
        m = Members(kube, namespace, uid, converge=converge)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def stable_group(kube: client.ApiClient, namespace: str, members_factory: Callable[..., Members],
                 pods: tuple[str, ...] = ("w-0", "w-1", "w-2"), **spec: Any) -> Members:
    make_pods(kube, namespace, *pods)
    uid = make_group(kube, namespace, **spec)
    members = members_factory(uid, converge=True)
    members.join(*pods)
    status_where(kube, namespace, "a Stable group", lambda s: s.get("phase") == "Stable"
                 and set(target(s)) == set(pods), timeout=60)
    return members


# -- tests --------------------------------------------------------------------------------


def test_members_joining_get_every_partition_and_the_group_becomes_stable(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    locks: Any = client.CoordinationV1Api(kube).list_namespaced_lease(
        namespace, label_selector=f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}=partition")
    assert sorted(int(x.metadata.labels[C.LABEL_PARTITION]) for x in locks.items) == list(range(8))
    assert all(x.metadata.owner_references[0].kind == C.KIND for x in locks.items)
    st = get_status(kube, namespace)
    assert sorted(p for ps in target(st).values() for p in ps) == list(range(8))
    assert {m["name"]: m["ownedCount"] for m in st["members"]} == {"w-0": 4, "w-1": 4}
    assert condition(st, "Ready") == ("True", "AllPartitionsOwned")
    assert "RebalanceStarted" in event_reasons(kube, namespace)
    wait_for("a RebalanceCompleted Event",
             lambda: "RebalanceCompleted" in event_reasons(kube, namespace))
    cg: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
    assert not cg["metadata"].get("finalizers")  # kopf left no footprint on the group
    assert not any("kopf" in k for k in cg["metadata"].get("annotations") or {})
    pod: Any = client.CoreV1Api(kube).read_namespaced_pod("w-0", namespace)
    assert not pod.metadata.finalizers
    assert not any("kopf" in k for k in pod.metadata.annotations or {})
    assert (operator.metric("kgroup_rebalances_total") or 0) >= 1
    assert operator.alive()


def test_partitions_nobody_takes_degrade_the_group_after_drain_plus_lease(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    make_pods(kube, namespace, "w-0")
    members = members_factory(make_group(kube, namespace), converge=False)
    members.join("w-0")
    st = status_where(kube, namespace, "Degraded", lambda s: s.get("phase") == "Degraded")
    assert condition(st, "Degraded") == ("True", "PartitionsUnowned")
    assert st["unowned"] == 8


def test_a_third_member_joining_moves_only_its_share(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    before = get_status(kube, namespace)
    make_pods(kube, namespace, "w-2")
    members.join("w-2")
    st = status_where(kube, namespace, "w-2 in the target", lambda s: "w-2" in target(s))
    assert st["epoch"] == before["epoch"] + 1
    assert st["lastRebalance"]["reason"] == "member joined: w-2"
    after = target(st)
    for m in ("w-0", "w-1"):
        assert set(after[m]) <= set(target(before)[m])
    assert len(after["w-2"]) == st["lastRebalance"]["moved"] == 2


def test_a_member_leaving_has_its_partitions_reassigned(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory)
    members.leave("w-2")
    client.CoreV1Api(kube).delete_namespaced_pod("w-2", namespace)
    st = status_where(kube, namespace, "w-2 out of the target", lambda s: "w-2" not in target(s))
    assert sorted(p for ps in target(st).values() for p in ps) == list(range(8))
    assert st["lastRebalance"]["reason"] == "member left: w-2"


def test_a_crashed_member_is_reassigned_after_its_session_expires(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory)
    epoch = get_status(kube, namespace)["epoch"]
    members.crash("w-1")  # its pod stays Running and Ready; only the session stops
    st = status_where(kube, namespace, "w-1 out of the target",
                      lambda s: "w-1" not in target(s))
    assert st["epoch"] == epoch + 1
    st = status_where(kube, namespace, "Stable again", lambda s: s.get("phase") == "Stable")
    assert st["unowned"] == 0
    # the operator, the failure detector, marked w-1's locks expired (after re-reading
    # w-1's member Lease); the survivors took them: no sidecar watches w-1's session
    logs = "".join(p.read_text(errors="replace") for p in operator.logs)
    assert "of w-1 is over: marking" in logs, logs[-3000:]
    leases = client.CoordinationV1Api(kube).list_namespaced_lease(
        namespace, label_selector="kgroup.dev/role=partition").items
    holders = [lease.spec.holder_identity if lease.spec else None for lease in leases]
    assert holders and all(h not in (None, "w-1") for h in holders), holders


def test_ten_pods_joining_within_two_seconds_give_at_most_two_rebalances(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    """The first join after a quiet window is acted upon at once, the rest of the burst
    together once no member joined for the window (kgroup.core.operator.planner.window_end)."""
    members = stable_group(kube, namespace, members_factory, pods=("w-0",), partitions=32)
    epoch = get_status(kube, namespace)["epoch"]
    burst = tuple(f"b-{i}" for i in range(10))
    make_pods(kube, namespace, *burst)
    started = time.monotonic()
    members.join(*burst)
    assert time.monotonic() - started < 2
    st = status_where(kube, namespace, "all 11 in the target", lambda s: len(target(s)) == 11)
    assert epoch + 1 <= st["epoch"] <= epoch + 2
    final = st["epoch"]
    stays("no further epoch", lambda: get_status(kube, namespace)["epoch"] == final, 3)


def test_an_operator_restart_moves_nothing(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    stable_group(kube, namespace, members_factory)
    before = get_status(kube, namespace)
    operator.stop()
    operator.start()
    wait_for("the new operator to see the group",
             lambda: operator.metric("kgroup_members") == 3, timeout=60)
    stays("epoch and target unchanged",
          lambda: (lambda s: (s["epoch"], s["assignment"]))(get_status(kube, namespace))
          == (before["epoch"], before["assignment"]), 4)
    assert operator.metric("kgroup_rebalances_total") is None


def test_a_stable_group_gets_no_status_writes(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    stable_group(kube, namespace, members_factory)
    rv: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
    writes = operator.metric("kgroup_status_writes_total")
    stays("no status write", lambda: operator.metric("kgroup_status_writes_total") == writes, 4)
    again: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
    assert again["metadata"]["resourceVersion"] == rv["metadata"]["resourceVersion"]


def test_a_paused_group_keeps_its_target_until_resumed(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    patch_spec(kube, namespace, {"paused": True})
    st = status_where(kube, namespace, "phase Paused", lambda s: s.get("phase") == "Paused")
    make_pods(kube, namespace, "w-2")
    members.join("w-2")
    stays("target frozen", lambda: get_status(kube, namespace)["epoch"] == st["epoch"], 3)
    patch_spec(kube, namespace, {"paused": False})
    resumed = status_where(kube, namespace, "w-2 in the target", lambda s: "w-2" in target(s))
    assert resumed["epoch"] == st["epoch"] + 1


def test_growing_partitions_is_a_reshape_whose_new_partitions_wait(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    """8 -> 16 re-hashes keys: the 16 new partitions (8-23) wait for 0-7 to be read to
    their end (e2e/tests/test_reshape_operator.py follows a reshape to its end)."""
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    before = target(get_status(kube, namespace))
    patch_spec(kube, namespace, {"partitions": 16})
    st = status_where(kube, namespace, "generation 2 in status.layout",
                      lambda s: s.get("layout", {}).get("generation") == 2)
    assert st["layout"]["states"] == {"open": "8-23", "sealed": "0-7"}
    stays("the target moves nothing and gains nothing", lambda: target(
        get_status(kube, namespace)) == before, seconds=3)
    coord = client.CoordinationV1Api(kube)
    assert len(coord.list_namespaced_lease(
        namespace, label_selector=f"{C.LABEL_ROLE}=partition").items) == 8


def test_growing_partitions_under_append_assigns_new_ones_and_moves_none(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    """spec.reshape.policy Append: 8 -> 16 adds partitions 8-15 to the one modulo
    generation, assigned at once; nothing held moves."""
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"),
                 reshape={"policy": "Append"})
    before = target(get_status(kube, namespace))
    patch_spec(kube, namespace, {"partitions": 16})
    st = status_where(kube, namespace, "16 partitions targeted",
                      lambda s: sum(len(v) for v in target(s).values()) == 16)
    for m, ps in before.items():
        assert set(ps) <= set(target(st)[m])
    assert st["lastRebalance"]["reason"] == "partitions grew 8\u219216"
    assert st["layout"] == {"generation": 1, "nextPartition": 16, "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-15"}],
        "states": {"open": "0-15"}}
    coord = client.CoordinationV1Api(kube)
    wait_for("16 partition Leases", lambda: len(coord.list_namespaced_lease(
        namespace, label_selector=f"{C.LABEL_ROLE}=partition").items) == 16)


def test_deleting_the_group_deletes_its_leases(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory, pods=("w-0",))
    members.close()
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
    coord = client.CoordinationV1Api(kube)
    wait_for("no kgroup Lease left", lambda: not coord.list_namespaced_lease(
        namespace, label_selector=C.LABEL_GROUP).items, timeout=60)


def test_a_selector_matching_nothing_is_reported_not_fatal(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
) -> None:
    make_group(kube, namespace, selector={"app": "nobody"})
    st = status_where(kube, namespace, "phase Pending", lambda s: s.get("phase") == "Pending")
    assert condition(st, "Degraded") == ("True", "SelectorMatchesNothing")
    wait_for("a SelectorMatchesNothing Event",
             lambda: "SelectorMatchesNothing" in event_reasons(kube, namespace))


def test_a_malformed_epoch_annotation_is_reported_and_counted_as_zero(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    members.set_epoch_annotation("w-1", "seven")
    st = status_where(kube, namespace, "Degraded", lambda s: s.get("phase") == "Degraded")
    assert condition(st, "Degraded") == ("True", "BadMemberAnnotation")
    assert {m["name"]: m["acknowledgedEpoch"] for m in st["members"]}["w-1"] == 0
    wait_for("a BadMemberAnnotation Event",
             lambda: "BadMemberAnnotation" in event_reasons(kube, namespace))


def test_a_hand_edited_status_is_corrected_under_a_new_epoch(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    before = get_status(kube, namespace)
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP,
        {"status": {"assignment": {"w-0": "0-7", "w-1": ""}, "phase": "Stable"}})
    st = status_where(kube, namespace, "the target restored",
                      lambda s: s["assignment"] == before["assignment"]
                      and s["epoch"] > before["epoch"])
    assert st["epoch"] == before["epoch"] + 1
    wait_for("a StatusEditedByHand Event",
             lambda: "StatusEditedByHand" in event_reasons(kube, namespace))


def test_a_standby_replica_waits_and_takes_over_without_moving_anything(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members], cluster: Cluster, tmp_path: Path,
) -> None:
    stable_group(kube, namespace, members_factory)
    before = get_status(kube, namespace)
    standby = OperatorProcess(cluster, namespace, tmp_path / "standby")
    standby.log_dir.mkdir()
    standby.start()
    try:
        wait_for("the standby to answer its health endpoint",
                 lambda: '"standby"' in standby.health(), timeout=30)
        wait_for("the standby to serve leader 0 and no group",
                 lambda: "kgroup_operator_leader 0.0" in standby.metrics(), timeout=10)
        stays("the standby reports no group", lambda: standby.metric("kgroup_members") is None, 3)
        operator.stop()
        wait_for("the standby to take over",
                 lambda: standby.metric("kgroup_members") == 3, timeout=60)
        assert "kgroup_operator_leader 1.0" in standby.metrics()
        wait_for("kopf's own health endpoint on the same port",
                 lambda: standby.alive() and '"standby"' not in standby.health(), timeout=30)
        stays("epoch and target unchanged",
              lambda: (lambda s: (s["epoch"], s["assignment"]))(get_status(kube, namespace))
              == (before["epoch"], before["assignment"]), 3)
    finally:
        standby.stop()
        assert "Traceback" not in standby.log_text()


def test_switching_to_the_range_assignor_rebalances_into_blocks(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members],
) -> None:
    members = stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"))
    make_pods(kube, namespace, "w-2")
    members.join("w-2")  # sticky: w-2 gets one partition from each, {3, 7}: not blocks
    sticky = status_where(kube, namespace, "w-2 in", lambda s: "w-2" in target(s))
    assert sticky["assignment"]["w-2"] != "6-7"
    epoch = sticky["epoch"]
    patch_spec(kube, namespace, {"assignor": "range"})
    st = status_where(kube, namespace, "a range layout", lambda s: s["epoch"] > epoch)
    assert st["assignment"] == {"w-0": "0-2", "w-1": "3-5", "w-2": "6-7"}
    assert st["lastRebalance"]["reason"] == "spec changed: assignor range"
    assert st["epoch"] == epoch + 1
