"""Owned means consumed, on the real local API server with real sidecar processes (the test
plays the operator with a scripted target, and the app with the client): a sidecar joins
only when its app asks, its pod is Ready only once the app took its partitions up, a
silent app's sidecar leaves, and what the app never saw is released at once
(kgroup.core.member.app_presence; docs/design.md, "Owned means consumed")."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup.client import SidecarClient
from kgroup_devcluster.cluster import Cluster
from kgroup_sidecar.probe import probe
from kgroup_testing.sidecar_harness import (
    ScriptedTarget,
    SidecarProcess,
    read_audit,
    safety_violations,
    wait_until,
)

pytestmark = pytest.mark.cluster
GROUP = "orders"
DRAIN = 30  # long: a release within seconds is not the drain timeout's


class Pods:
    def __init__(self, kube: client.ApiClient, namespace: str, kubeconfig: str,
                 workdir: Path) -> None:
        self.target = ScriptedTarget(kube, namespace, GROUP)
        self.namespace, self.kubeconfig, self.workdir = namespace, kubeconfig, workdir
        self.sidecars: dict[str, SidecarProcess] = {}

    def start(self, pod: str, *, app_timeout: float) -> SidecarClient:
        sc = SidecarProcess(pod=pod, group=GROUP, namespace=self.namespace,
                            kubeconfig=self.kubeconfig, workdir=self.workdir,
                            env={"KGROUP_APP_TIMEOUT_SECONDS": f"{app_timeout:g}"}).start()
        self.sidecars[pod] = sc
        wait_until(f"{pod}'s sidecar answers", lambda: probe("/healthz", sc.listen)[0],
                   timeout=30)
        return SidecarClient(sc.url)

    def one_pod_group(self, *, app_timeout: float) -> SidecarClient:
        """A group of 4 partitions whose target gives all of them to ``pod-a``, its sidecar
        started; -> the client its app would use (nothing asked yet)."""
        self.target.create(partitions=4, drain=DRAIN)
        app = self.start("pod-a", app_timeout=app_timeout)
        self.target.assign({"pod-a": [0, 1, 2, 3]})
        return app

    def wait_held_by(self, holder: str | None, what: str) -> None:
        wait_until(what, lambda: self.holders(range(4)) == [holder] * 4, timeout=20)

    def ready(self, pod: str) -> tuple[bool, str]:
        return probe("/readyz", self.sidecars[pod].listen)

    def holders(self, partitions: range) -> list[str | None]:
        return [self.target.holder(p)[0] for p in partitions]

    def releases(self) -> dict[tuple[int, int], str]:
        """(partition, token) -> the reason of its release, from the audit files."""
        out: dict[tuple[int, int], str] = {}
        for sc in self.sidecars.values():
            lines = sc.audit_file.read_text().splitlines() if sc.audit_file.exists() else []
            for rec in map(json.loads, lines):
                if rec["event"] == "release":
                    out[(rec["partition"], rec["token"])] = rec.get("reason", "")
        return out


@pytest.fixture
def pods(cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
         tmp_path: Path) -> Iterator[Pods]:
    h = Pods(kube, namespace, str(cluster.kubeconfig), tmp_path)
    try:
        yield h
    finally:
        for sc in h.sidecars.values():
            sc.stop()
    files = [sc.audit_file for sc in h.sidecars.values()]
    ended = {pod: sc.killed_at for pod, sc in h.sidecars.items() if sc.killed_at is not None}
    problems = safety_violations(read_audit(files), ended_at=ended)
    assert not problems, "\n".join(problems)
    for sc in h.sidecars.values():
        assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_a_sidecar_joins_when_its_app_asks_and_is_ready_once_the_app_took_its_partitions_up(
        pods: Pods) -> None:
    h = pods
    app = h.one_pod_group(app_timeout=60)
    wait_until("the sidecar says why it is not ready",
               lambda: "waiting for its app to ask" in h.ready("pod-a")[1], timeout=20)
    assert app.group()["partitions"] == 4  # reading the group is no ask: it joins nothing
    time.sleep(3)  # a live sidecar with a target, whose app has not asked: it joins nothing
    assert h.target.member_lease("pod-a") is None
    assert h.holders(range(4)) == [None] * 4
    first = app.assignment()  # the app is ready: it asks
    assert first.partitions == ()  # nothing held yet: the session starts now
    h.wait_held_by("pod-a", "the partitions are taken")
    assert h.target.member_lease("pod-a") is not None
    wait_until("not ready until the app took them up",
               lambda: "its app has not taken up" in h.ready("pod-a")[1]
               or "acknowledged" in h.ready("pod-a")[1], timeout=20)
    assert h.ready("pod-a")[0] is False
    served = app.assignment()  # served the four partitions...
    assert len(served.partitions) == 4
    assert h.ready("pod-a")[0] is False
    app.assignment()  # ...and came back after them: taken up
    wait_until("ready", lambda: h.ready("pod-a")[0], timeout=20)


def test_a_silent_app_makes_its_sidecar_leave_and_what_it_never_saw_goes_at_once(
        pods: Pods) -> None:
    h = pods
    app = h.one_pod_group(app_timeout=3)
    assert app.assignment().partitions == ()  # joins; the locks are taken after this answer
    h.wait_held_by("pod-a", "the partitions are taken")
    taken = time.monotonic()
    # The app says nothing more: 3 s later its sidecar leaves, releasing at once the four
    # partitions the app never saw (not after the 30 s drain timeout), and ends its session.
    h.wait_held_by(None, "released")
    released_after = time.monotonic() - taken
    assert released_after < DRAIN / 2, released_after
    wait_until("session ended", lambda: h.target.member_lease("pod-a") is None, timeout=10)
    assert set(h.releases().values()) == {"unseen"}
    assert h.ready("pod-a")[0] is False
    app.assignment()  # the app is back: it joins again with a new session
    wait_until("joined again", lambda: h.target.member_lease("pod-a") is not None, timeout=20)
    h.wait_held_by("pod-a", "taken again")


def test_a_pod_stopped_before_its_app_saw_its_partitions_frees_them_at_once(
        pods: Pods) -> None:
    h = pods
    app = h.one_pod_group(app_timeout=60)
    app.assignment()
    h.wait_held_by("pod-a", "the partitions are taken")
    h.sidecars["pod-a"].signal(signal.SIGTERM)
    stopped = time.monotonic()
    h.wait_held_by(None, "released")
    assert time.monotonic() - stopped < 5
    assert set(h.releases().values()) == {"unseen"}
