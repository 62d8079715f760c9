"""The sidecar on the real local API server, with real sidecar processes and a scripted
target (the test plays the operator). Every test ends with the safety audit: per
partition, no two sessions' active-ownership intervals overlap and tokens increase.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup.client import SidecarClient
from kgroup_sidecar.testing import (
    ScriptedTarget,
    SidecarProcess,
    read_audit,
    safety_violations,
    wait_until,
)

pytestmark = pytest.mark.cluster
GROUP = "orders"


class Harness:
    def __init__(self, kube: client.ApiClient, namespace: str, kubeconfig: str,
                 workdir: Path) -> None:
        self.target = ScriptedTarget(kube, namespace, GROUP)
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.sidecars: dict[str, SidecarProcess] = {}

    def start(self, pod: str) -> SidecarProcess:
        sc = SidecarProcess(pod=pod, group=GROUP, namespace=self.namespace,
                            kubeconfig=self.kubeconfig, workdir=self.workdir).start()
        self.sidecars[pod] = sc
        return sc

    def client(self, pod: str) -> SidecarClient:
        return SidecarClient(self.sidecars[pod].url)

    def view(self, pod: str) -> dict[int, tuple[str, int]]:
        a = self.client(pod).assignment()
        return {p.partition: (p.state, p.token) for p in a.partitions}

    def acked(self, pod: str, epoch: int) -> bool:
        a = self.client(pod).assignment()
        return a.acked_epoch == epoch

    def converged(self, assignment: dict[str, list[int]], epoch: int) -> bool:
        for pod, parts in assignment.items():
            a = self.client(pod).assignment()
            if a.acked_epoch != epoch or sorted(p.partition for p in a.active) != sorted(parts):
                return False
        return True

    def audit(self) -> list[str]:
        files = [sc.audit_file for sc in self.sidecars.values()]
        ended = {pod: sc.killed_at for pod, sc in self.sidecars.items()
                 if sc.killed_at is not None}
        return safety_violations(read_audit(files), ended_at=ended)

    def logs(self) -> str:
        return "\n".join(f"--- {pod}\n{sc.log_text()[-4000:]}"
                         for pod, sc in self.sidecars.items())


@pytest.fixture
def harness(cluster: object, kube: client.ApiClient, crd: list[str], namespace: str,
            tmp_path: Path) -> Iterator[Harness]:
    h = Harness(kube, namespace, str(cluster.kubeconfig), tmp_path)  # type: ignore[attr-defined]
    try:
        yield h
    finally:
        for sc in h.sidecars.values():
            sc.stop()
    problems = h.audit()
    assert not problems, "\n".join(problems) + "\n" + h.logs()
    for sc in h.sidecars.values():
        assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_two_members_join_split_the_target_and_acknowledge(harness: Harness) -> None:
    h = harness
    h.target.create(partitions=4)
    h.start("pod-a")
    h.start("pod-b")
    target = {"pod-a": [0, 1], "pod-b": [2, 3]}
    epoch = h.target.assign(target)
    wait_until("both members converge and ack", lambda: h.converged(target, epoch), timeout=30)
    for p, pod in ((0, "pod-a"), (1, "pod-a"), (2, "pod-b"), (3, "pod-b")):
        holder, session, token = h.target.holder(p)
        assert (holder, token) == (pod, 1)
        assert session == h.client(pod).assignment().session
    lease = h.target.member_lease("pod-a")
    assert lease is not None
    assert lease["metadata"]["annotations"]["kgroup.dev/epoch"] == str(epoch)
    assert lease["metadata"]["ownerReferences"][0]["uid"] == h.target.uid
