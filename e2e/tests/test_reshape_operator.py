"""A reshape on the group's side, against the real local control plane: the real operator
(a subprocess) keeps ``status.layout`` and assigns a new generation's partitions only once
the partitions they replace are recorded completed on their Leases.

The members are scripted (:class:`operator_harness.Members`, converging like sidecars);
a completion is written as the sidecar writes it (``lease_codec.released_partition_lease``
with ``completed``: the release and ``kgroup.dev/completed`` in one update). Once a
generation retires, the operator deletes its partitions' Leases that are free and record
their completion, and no other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP, Members, OperatorProcess
from test_operator import (  # noqa: F401 - fixtures
    get_status,
    make_group,
    make_pods,
    members_factory,
    operator,
    patch_spec,
    stable_group,
    status_where,
    stays,
    target,
)

from kgroup import constants as C
from kgroup.client import SidecarClient, SidecarError
from kgroup.core import lease_codec
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess, read_audit, safety_violations

pytestmark = pytest.mark.cluster


def assigned(status: dict[str, Any]) -> set[int]:
    return {p for ps in target(status).values() for p in ps}


def partition_leases(kube: client.ApiClient, namespace: str) -> set[int]:
    leases: Any = client.CoordinationV1Api(kube).list_namespaced_lease(
        namespace, label_selector=f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}={C.ROLE_PARTITION}")
    return {int(x.metadata.labels[C.LABEL_PARTITION]) for x in leases.items}


def complete(kube: client.ApiClient, namespace: str, partition: int,
             holder: str | None = None) -> None:
    """Record ``partition`` read to its seal marker, as a sidecar's completed release does
    (again on a conflict with the scripted member's writes); ``holder``: in the same write,
    the lock taken again by that pod (the completed record kept)."""
    coord = client.CoordinationV1Api(kube)
    name = C.partition_lease_name(GROUP, partition)

    def written() -> bool:
        last: Any = kube.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            coord.read_namespaced_lease(name, namespace))
        body: Any = lease_codec.released_partition_lease(last, token=7, position="seal-0",
                                                         completed=True)
        if holder is not None:
            body["spec"]["holderIdentity"] = holder
            body["metadata"]["annotations"][C.ANNOTATION_SESSION] = f"s-{holder}"
        try:
            coord.replace_namespaced_lease(name, namespace, body)
        except client.ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    wait_for(f"partition {partition}'s completion written", written, timeout=20)


def test_four_to_two_partitions_waits_for_every_predecessors_completion(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,  # noqa: F811
    members_factory: Callable[..., Members],  # noqa: F811
) -> None:
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"), partitions=4)
    first = get_status(kube, namespace)["layout"]
    assert first == {"generation": 1, "nextPartition": 4, "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-3"}],
        "states": {"open": "0-3"}}

    patch_spec(kube, namespace, {"partitions": 2})
    st = status_where(kube, namespace, "generation 2 in status.layout",
                      lambda s: s.get("layout", {}).get("generation") == 2)
    assert st["layout"]["states"] == {"open": "4-5", "sealed": "0-3"}
    assert st["layout"]["generations"][1] == {
        "generation": 2, "placement": "range", "partitions": "4-5", "widths": "1/2*2"}
    assert assigned(st) == {0, 1, 2, 3}  # the sealed ones stay assigned: they are read on

    for p in (0, 1, 2):
        complete(kube, namespace, p)
    status_where(kube, namespace, "0-2 recorded completed", lambda s: s.get(
        "layout", {}).get("states", {}).get("completed") == "0-2")
    def waiting() -> bool:
        st = get_status(kube, namespace)
        ok = assigned(st) <= {3} and not partition_leases(kube, namespace) & {4, 5}
        assert ok, (st, partition_leases(kube, namespace))
        return ok

    stays("4 and 5 neither assigned nor locked while 3 is not completed", waiting, seconds=5)

    complete(kube, namespace, 3)
    st = status_where(kube, namespace, "4 and 5 assigned",
                      lambda s: assigned(s) == {4, 5}, timeout=30)
    assert st["layout"] == {"generation": 2, "nextPartition": 6, "generations": [
        {"generation": 2, "placement": "range", "partitions": "4-5", "widths": "1/2*2"}],
        "states": {"open": "4-5"}}  # generation 1 read to its end: retired
    wait_for("locks of 4 and 5", lambda: {4, 5} <= partition_leases(kube, namespace))
    status_where(kube, namespace, "Stable on the new generation",
                 lambda s: s.get("phase") == "Stable" and s.get("unowned") == 0, timeout=60)


def release_by_hand(kube: client.ApiClient, namespace: str, partition: int) -> None:
    """Clear the holder of ``partition``'s lock, its other annotations kept."""
    coord = client.CoordinationV1Api(kube)
    name = C.partition_lease_name(GROUP, partition)
    body: Any = kube.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        coord.read_namespaced_lease(name, namespace))
    body["spec"].pop("holderIdentity", None)
    body["metadata"]["annotations"].pop(C.ANNOTATION_SESSION, None)
    coord.replace_namespaced_lease(name, namespace, body)


def test_a_retired_generations_leases_are_deleted_once_free_and_the_live_ones_stay(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,  # noqa: F811
    members_factory: Callable[..., Members],  # noqa: F811
) -> None:
    """4 -> 2, then 0-3 recorded completed: generation 1 retires from status.layout and the
    operator deletes the Leases of 0, 1 and 2 (free, completed); 3's, taken again by a pod
    in the same write as its completion, stays while it is held and goes once released;
    4 and 5 (the live generation) keep theirs throughout. The scripted members stop
    before the completions, so nothing but the operator and this test writes the locks."""
    members = stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"),
                           partitions=4)
    patch_spec(kube, namespace, {"partitions": 2})
    status_where(kube, namespace, "generation 2 in status.layout",
                 lambda s: s.get("layout", {}).get("generation") == 2)
    for pod in ("w-0", "w-1"):
        members.crash(pod)
    for p in (0, 1, 2):
        complete(kube, namespace, p)
    complete(kube, namespace, 3, holder="w-9")
    st = status_where(kube, namespace, "generation 1 retired", lambda s: len(
        s.get("layout", {}).get("generations", [])) == 1, timeout=30)
    assert st["layout"]["states"] == {"open": "4-5"} and st["layout"]["nextPartition"] == 6
    wait_for("the Leases of 0-2 deleted, 4 and 5 created", lambda: partition_leases(
        kube, namespace) == {3, 4, 5}, timeout=30)
    stays("3 (held) and 4-5 (live) keep their Leases",
          lambda: partition_leases(kube, namespace) == {3, 4, 5}, seconds=5)

    release_by_hand(kube, namespace, 3)
    wait_for("3's Lease deleted once free", lambda: partition_leases(
        kube, namespace) == {4, 5}, timeout=30)
    stays("4 and 5 keep their Leases", lambda: partition_leases(kube, namespace) == {4, 5},
          seconds=3)
    assert get_status(kube, namespace)["layout"]["nextPartition"] == 6
    log = operator.log_text()
    assert all(f"deleted Lease {GROUP}-partition-{p}" in log for p in range(4)), log[-3000:]
    assert "forbidden" not in log


def group_events(kube: client.ApiClient, namespace: str, reason: str) -> list[str]:
    events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
    return [e.message for e in events.items
            if e.involved_object.kind == C.KIND and e.reason == reason]


def test_a_split_in_the_spec_cuts_one_partition_and_only_its_halves_wait(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess,  # noqa: F811
    members_factory: Callable[..., Members],  # noqa: F811
) -> None:
    """4 -> 2 (partitions 4-5, key-hash halves), then a split of 4 in the spec: 6 and 7
    succeed 4 alone, 5 is not touched; a change with the wrong count is refused by the
    operator with a reason and does nothing."""
    stable_group(kube, namespace, members_factory, pods=("w-0", "w-1"), partitions=4)
    patch_spec(kube, namespace, {"partitions": 2})
    status_where(kube, namespace, "generation 2 in status.layout",
                 lambda s: s.get("layout", {}).get("generation") == 2)
    for p in range(4):
        complete(kube, namespace, p)
    status_where(kube, namespace, "4 and 5 assigned", lambda s: assigned(s) == {4, 5},
                 timeout=30)

    wrong = {"generation": 3, "split": 4}
    patch_spec(kube, namespace, {"partitions": 2, "reshape": {"change": wrong}})
    wait_for("the wrong count's Event", lambda: any(
        "set spec.partitions: 3 with it" in m
        for m in group_events(kube, namespace, "LayoutNotApplied")), timeout=30)
    assert get_status(kube, namespace)["layout"]["generation"] == 2

    patch_spec(kube, namespace, {"partitions": 3, "reshape": {"change": wrong}})
    st = status_where(kube, namespace, "generation 3 in status.layout",
                      lambda s: s.get("layout", {}).get("generation") == 3)
    # in key-hash order: 4's two quarters, then 5's half
    assert st["layout"]["generations"][-1] == {
        "generation": 3, "placement": "range", "partitions": "6-7,5", "widths": "1/4*2,1/2"}
    assert st["layout"]["states"] == {"open": "5-7", "sealed": "4"}
    assert assigned(st) == {4, 5}  # 5 carries on; 4 is read to its seal
    stays("6 and 7 neither assigned nor locked while 4 is not completed",
          lambda: not assigned(get_status(kube, namespace)) & {6, 7}
          and not partition_leases(kube, namespace) & {6, 7}, seconds=4)

    complete(kube, namespace, 4)
    status_where(kube, namespace, "5, 6 and 7 assigned", lambda s: assigned(s) == {5, 6, 7},
                 timeout=30)
    status_where(kube, namespace, "Stable after the split",
                 lambda s: s.get("phase") == "Stable" and s.get("unowned") == 0, timeout=60)


def test_real_sidecars_complete_a_shrink_and_take_up_the_successors(
    cluster: Cluster, kube: client.ApiClient, namespace: str,
    operator: OperatorProcess, tmp_path: Path,  # noqa: F811
) -> None:
    """The whole group side with real sidecar processes: 4 -> 2, each owner's app
    releases its sealed partitions with ``completed`` (the seal marker as position),
    and the successors 4 and 5 are then assigned, locked and held by the sidecars."""
    pods = ("w-0", "w-1")
    make_pods(kube, namespace, *pods)
    make_group(kube, namespace, partitions=4)
    sidecars = {pod: SidecarProcess(pod=pod, group=GROUP, namespace=namespace,
                                    kubeconfig=str(cluster.kubeconfig),
                                    workdir=tmp_path).start() for pod in pods}
    try:
        apps = {pod: SidecarClient(sc.url) for pod, sc in sidecars.items()}

        def held() -> dict[int, tuple[str, int]]:
            try:
                return {p.partition: (pod, p.token) for pod, app in apps.items()
                        for p in app.assignment().active}
            except SidecarError:  # not listening yet
                return {}

        wait_for("0-3 held", lambda: set(held()) == {0, 1, 2, 3}, timeout=60)
        patch_spec(kube, namespace, {"partitions": 2})
        status_where(kube, namespace, "generation 2",
                     lambda s: s.get("layout", {}).get("generation") == 2)
        def sealed() -> dict[int, int | None]:
            return {p.partition: p.sealed_by for app in apps.values()
                    for p in app.assignment().active}

        # each app's view says which held partitions the reshape sealed, and by which
        # generation: what an app seals them with when no producer has
        wait_for("the views say 0-3 sealed by generation 2",
                 lambda: sealed() == {0: 2, 1: 2, 2: 2, 3: 2}, timeout=30)
        owners = held()
        for p in (0, 1, 2, 3):
            pod, token = owners[p]
            assert apps[pod].release(p, token, f"seal-{p}", completed=True) is True
        st = status_where(kube, namespace, "4 and 5 assigned",
                          lambda s: assigned(s) == {4, 5}, timeout=30)
        assert st["layout"]["states"] == {"open": "4-5"}
        wait_for("4 and 5 held by the sidecars", lambda: set(held()) == {4, 5}, timeout=60)
    finally:
        for sc in sidecars.values():
            sc.stop()
    records = read_audit([sc.audit_file for sc in sidecars.values()])
    assert not safety_violations(records)
    assert all("Traceback" not in sc.log_text() for sc in sidecars.values())
