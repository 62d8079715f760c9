"""Leases the operator did not ask for, on the real API server.

- Thousands of member Leases naming groups that do not exist (a worker may create them in
  its namespace): the operator neither keeps them nor lists them at start-up, so its
  memory does not grow with them (RSS from /proc, before and after, and after a restart).
- A group created after its member Lease: the operator lists the group's Leases when the
  group appears (the Lease events seen before were ignored).
- A squatted lock name (someone else's Lease where a partition lock must be created): the
  group is Degraded with a condition naming it, until the object is gone.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP, OperatorProcess
from test_operator import make_group, make_pods, operator, status_where

from kgroup import constants as C
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

__all__ = ["operator"]
pytestmark = pytest.mark.cluster
GHOSTS = int(os.environ.get("KGROUP_GHOST_LEASES", "5000"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def member_lease(group: str, pod: str, *, notes: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": C.member_lease_name(group, pod),
                         "labels": {C.LABEL_GROUP: group, C.LABEL_ROLE: C.ROLE_MEMBER,
                                    C.LABEL_MEMBER: pod},
                         "annotations": {C.ANNOTATION_SESSION: f"s-{pod}", **(notes or {})}},
            "spec": {"holderIdentity": pod, "leaseDurationSeconds": 30}}


def _settled_rss(pid: int, seconds: float = 6.0) -> int:
    """The RSS once it stopped moving (the operator has handled what it was sent)."""
    last, same_since = rss_kib(pid), time.monotonic()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss_kib(pid)
        if abs(now - last) > 256:
            last, same_since = now, time.monotonic()
        elif time.monotonic() - same_since >= seconds:
            return now
    return last


def test_leases_of_groups_that_do_not_exist_do_not_grow_the_operator(
        cluster: Cluster, kube: client.ApiClient, namespace: str,
        operator: OperatorProcess) -> None:
    make_group(kube, namespace, partitions=4)
    make_pods(kube, namespace, "w-0")
    coord: Any = client.CoordinationV1Api(kube)
    coord.create_namespaced_lease(namespace, member_lease(GROUP, "w-0"))
    status_where(kube, namespace, "the real group planned",
                 lambda s: "w-0" in (s.get("assignment") or {}), timeout=60)
    assert operator.proc is not None
    pid = operator.proc.pid
    before = _settled_rss(pid)
    # 5,000 member Leases of groups that do not exist, 4 KiB of annotation each
    pad = {"kgroup.dev/health": "x" * 4000}
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: coord.create_namespaced_lease(
            namespace, member_lease(f"ghost-{i}", "w-0", notes=pad)), range(GHOSTS)))
    created_s = time.monotonic() - t0
    after = _settled_rss(pid)
    assert operator.proc.poll() is None and operator.proc.pid == pid
    operator.stop()  # a restart lists what exists at start-up
    operator.start()
    status_where(kube, namespace, "the restarted operator serving the group",
                 lambda s: "w-0" in (s.get("assignment") or {}), timeout=60)
    assert operator.proc is not None
    restarted = _settled_rss(operator.proc.pid)
    print(f"operator RSS: {before} KiB before {GHOSTS} ghost member Leases (created in "
          f"{created_s:.1f} s), {after} KiB after, {restarted} KiB after a restart")
    # kept, 5,000 x 4 KiB would be 20 MiB and more; what is left is kopf's own
    # passing of the events (allocator noise, not a per-Lease cost)
    assert after - before < 8 * 1024, (before, after)
    assert restarted - before < 8 * 1024, (before, restarted)
    assert operator.metric("kgroup_members") == 1.0


def test_a_group_created_after_its_member_lease_sees_the_member(
        kube: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    make_pods(kube, namespace, "w-0")
    coord: Any = client.CoordinationV1Api(kube)
    coord.create_namespaced_lease(namespace, member_lease(GROUP, "w-0"))
    time.sleep(2.0)  # the operator saw (and ignored) the Lease of a group not yet there
    make_group(kube, namespace, partitions=4)
    st = status_where(kube, namespace, "w-0 a member of the new group",
                      lambda s: (s.get("assignment") or {}).get("w-0") == "0-3", timeout=30)
    assert st["memberCount"] == 1


def test_a_squatted_lock_name_degrades_the_group_until_it_is_gone(
        kube: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    coord: Any = client.CoordinationV1Api(kube)
    squat = C.partition_lease_name(GROUP, 2)
    coord.create_namespaced_lease(namespace, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": squat, "labels": {"app": "someone-else"}},
        "spec": {"holderIdentity": "someone-else-0", "leaseDurationSeconds": 15}})
    make_pods(kube, namespace, "w-0")
    coord.create_namespaced_lease(namespace, member_lease(GROUP, "w-0"))
    make_group(kube, namespace, partitions=4)

    def degraded(st: dict[str, Any]) -> bool:
        c: dict[str, Any] = next(
            (c for c in st.get("conditions") or [] if c["type"] == "Degraded"), {})
        return c.get("status") == "True" and c.get("reason") == "LeaseNameTaken"

    st = status_where(kube, namespace, "Degraded: LeaseNameTaken", degraded, timeout=30)
    cond: dict[str, Any] = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert f"Lease {squat} (partition 2's lock) is taken by an object that is not this " \
           "group's lock" in cond["message"]
    assert st["phase"] == "Degraded"

    def warned() -> bool:  # the Event is posted after the status write that names it
        events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
        return any(e.reason == "LeaseNameTaken" and e.type == "Warning" for e in events.items)

    wait_for("a LeaseNameTaken Warning Event", warned, timeout=15)
    coord.delete_namespaced_lease(squat, namespace)

    def created() -> bool:
        lease: Any = coord.read_namespaced_lease(squat, namespace)
        return bool((lease.metadata.labels or {}).get(C.LABEL_GROUP) == GROUP)

    def exists() -> bool:
        try:
            return created()
        except client.ApiException:
            return False

    wait_for("the lock created once the name is free", exists, timeout=45)
    status_where(kube, namespace, "no longer Degraded by the name",
                 lambda s: not degraded(s), timeout=30)
