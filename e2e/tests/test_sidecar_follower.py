"""The app's follower (``kgroup.follower``) against a real sidecar process on the real API
server, at the CRD's default lease (8 s, renewed every 2 s): the app reads its assignment
as often as it likes while the sidecar answers about one long-poll every 2 s on one
connection, the promise never lapses while the sidecar renews, and it runs out on its own
once the sidecar stops answering (SIGSTOP)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kgroup.follower import AssignmentFollower
from kgroup_testing.sidecar_harness import ScriptedTarget, SidecarProcess, wait_until

pytestmark = pytest.mark.cluster
GROUP = "followed"


@pytest.fixture
def sidecar(cluster: object, kube: client.ApiClient, crd: list[str], namespace: str,
            tmp_path: Path) -> Iterator[SidecarProcess]:
    from kgroup_devcluster.cluster import Cluster
    assert isinstance(cluster, Cluster)
    target = ScriptedTarget(kube, namespace, GROUP)
    target.create(partitions=2, duration=8, renew=2)
    sc = SidecarProcess(pod="pod-a", group=GROUP, namespace=namespace,
                        kubeconfig=str(cluster.kubeconfig), workdir=tmp_path)
    sc.start()
    target.assign({"pod-a": [0, 1]})
    try:
        yield sc
    finally:
        sc.signal(signal.SIGCONT)
        sc.stop()
    assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_the_app_reads_from_memory_and_its_promise_holds_until_the_sidecar_stops(
        sidecar: SidecarProcess) -> None:
    follower = AssignmentFollower(sidecar.url).start()
    try:
        def owns_both() -> bool:
            a = follower.latest()
            return a is not None and [p.partition for p in a.active] == [0, 1]

        wait_until("the follower sees both partitions", owns_both, timeout=60)
        polls, reads, lapses = follower.polls, 0, []
        opened = follower.client.connections_opened  # (attempts before the sidecar listened)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 12:  # six renewals
            if not owns_both():
                lapses.append(round(time.monotonic() - t0, 2))
            reads += 1
            time.sleep(0.01)
        assert lapses == [], f"the app's promise lapsed at {lapses} s"
        # about one answer per 2 s (half of a 5-7 s promise), not one per read
        assert reads > 500 and follower.polls - polls <= 12
        assert follower.client.connections_opened == opened  # one kept-alive connection

        sidecar.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until("the promise runs out", lambda: not owns_both(), timeout=10)
        # the last answer's promise: at most the lease duration minus the fencing margin
        assert time.monotonic() - stopped <= 8.0
        a = follower.latest()
        assert a is not None and a.partitions == () and a.expired
    finally:
        follower.stop()
