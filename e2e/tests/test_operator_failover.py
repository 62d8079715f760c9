"""Losing the active operator and a member at the same moment, as losing one node would:
on the real API server, two real ``kgroup-operator`` processes (a leader and a standby)
and three real ``kgroup-sidecar`` processes on kwok pods.

The leader and one sidecar are SIGKILLed together (no leader Lease released, no lock
released, the pod object left Running, as after a node loss). The standby takes the
leader Lease, observes the dead member's session go silent for one group lease duration
on its own clock, expires it, and the survivors acquire its partitions. Measured and
printed: the standby's takeover (kill -> the standby leads) and the failover (kill ->
every partition of the dead member held by another member), and the difference, which
the promise bounds by one group lease duration plus the operator's start and the
sidecars' acquisition (SLACK).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import OperatorProcess

from kgroup import constants as C
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess

pytestmark = pytest.mark.cluster

GROUP = "orders"
PODS = ("w-0", "w-1", "w-2")
PARTITIONS = 6
LEASE_SECONDS = 6  # the group's lease duration (renewal every 2 s)
LEADER_LEASE_SECONDS = 6  # the operator harness's --leader-lease-seconds
SLACK = 4.0  # the new leader's start and first plan, the survivors' acquisition


def make_pods(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    uids = {}
    for name in PODS:
        pod: Any = core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": GROUP}),
            spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
                client.V1Container(name="main", image="example.invalid/worker:1")])))
        uids[name] = str(pod.metadata.uid)

    def running() -> bool:
        pods: Any = core.list_namespaced_pod(namespace)
        return all(p.status.phase == "Running" for p in pods.items if p.metadata.name in PODS)

    wait_for("pods running", running, timeout=90)
    return uids


def holders(kube: client.ApiClient, namespace: str) -> dict[int, str | None]:
    leases: Any = client.CoordinationV1Api(kube).list_namespaced_lease(
        namespace, label_selector=f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}={C.ROLE_PARTITION}")
    out: dict[int, str | None] = {}
    for lease in leases.items:
        out[int(lease.metadata.labels[C.LABEL_PARTITION])] = lease.spec.holder_identity
    return out


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for p in reversed(started):
        p.stop()


def is_leader(op: OperatorProcess) -> bool:
    return "kgroup_operator_leader 1.0" in op.metrics()


def test_the_leader_and_a_member_lost_together_fail_over_within_takeover_plus_a_lease(
        cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
        tmp_path: Path, processes: list[Any]) -> None:
    core = client.CoreV1Api(kube)
    uids = make_pods(core, namespace)
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL,
        {"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
         "metadata": {"name": GROUP},
         "spec": {"partitions": PARTITIONS, "selector": {"matchLabels": {"app": GROUP}},
                  "lease": {"durationSeconds": LEASE_SECONDS, "renewIntervalSeconds": 2},
                  "stabilizationWindowSeconds": 1}})
    ops = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        op = OperatorProcess(cluster, namespace, tmp_path / name)
        op.start()
        processes.append(op)
        ops.append(op)
        if name == "a":
            wait_for("the first operator leading", lambda: is_leader(ops[0]), timeout=60)
    wait_for("the standby's metrics", lambda: "kgroup_operator_leader 0.0" in ops[1].metrics(),
             timeout=60)
    leader, standby = ops
    sidecars = {}
    for pod in PODS:
        sc = SidecarProcess(pod=pod, group=GROUP, namespace=namespace,
                            kubeconfig=str(cluster.kubeconfig), workdir=tmp_path,
                            env={"KGROUP_POD_UID": uids[pod]})
        processes.append(sc.start())
        sidecars[pod] = sc

    def settled() -> bool:
        held = holders(kube, namespace)
        return len(held) == PARTITIONS and set(held.values()) == set(PODS)

    wait_for("every partition held, by all three members", settled, timeout=120)
    victim = "w-0"
    lost = sorted(p for p, h in holders(kube, namespace).items() if h == victim)
    assert lost

    assert leader.proc is not None
    t0 = time.monotonic()
    leader.proc.send_signal(signal.SIGKILL)  # the node is lost: both at once
    sidecars[victim].signal(signal.SIGKILL)
    leader.proc.wait(10)
    leader.proc = None

    takeover = moved = None
    while time.monotonic() - t0 < LEADER_LEASE_SECONDS + LEASE_SECONDS + 60:
        now = time.monotonic() - t0
        if takeover is None and is_leader(standby):
            takeover = now
        held = holders(kube, namespace)
        if moved is None and all(held.get(p) not in (None, victim) for p in lost):
            moved = now
        if takeover is not None and moved is not None:
            break
        time.sleep(0.2)
    assert takeover is not None, "the standby never took the leader Lease"
    assert moved is not None, f"{victim}'s partitions never moved: {holders(kube, namespace)}"
    print(f"failover after losing the leader and {victim} together: the standby leads "
          f"after {takeover:.1f} s; {victim}'s partitions {lost} held by others after "
          f"{moved:.1f} s, {moved - takeover:.1f} s after the takeover (group lease "
          f"{LEASE_SECONDS} s, leader Lease {LEADER_LEASE_SECONDS} s)")
    assert moved - takeover <= LEASE_SECONDS + SLACK, (takeover, moved)
    assert set(holders(kube, namespace).values()) == {"w-1", "w-2"}
