"""A stall the app does not report, through the operator to the group: a real operator
process, a real sidecar process whose app's part is on, the app as a real follower of its
sidecar. The app follows its assignment (so it takes part) and reports on every partition
but one: the sidecar sees the silent one itself (kgroup.core.member.app_presence,
``stalls``), and the status, the Stalled condition, a Warning Event and ``kgroup status``
show it, while nothing of the app's own reports says "stalled"."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP
from test_operator import get_status, make_group, make_pods, operator, status_where
from test_status_cli import condition, kgroup_status

from kgroup.client import Report, SidecarClient
from kgroup.follower import AssignmentFollower
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess

__all__ = ["operator"]
pytestmark = pytest.mark.cluster
POD = "w-0"
APP_TIMEOUT = 4


class App:
    """A follower of its sidecar that reports on the partitions in ``reporting`` every
    0.3 s, on a thread, until stopped."""

    def __init__(self, url: str) -> None:
        self.follower = AssignmentFollower(url).start()
        self.client = SidecarClient(url)
        self.reporting: set[int] | None = None  # None: every partition it holds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="app-reports", daemon=True)

    def held(self) -> dict[int, int]:
        a = self.follower.latest()
        return {p.partition: p.token for p in a.partitions} if a is not None else {}

    def start(self) -> App:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            held = self.held()
            chosen = held if self.reporting is None else {
                p: t for p, t in held.items() if p in self.reporting}
            if chosen:
                self.client.report_health([Report(p, t, "1-0", lag=0) for p, t in chosen.items()])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.follower.stop()


@pytest.fixture
def sidecar(cluster: Cluster, kube: client.ApiClient, operator: Any, namespace: str,
            tmp_path: Path) -> Iterator[SidecarProcess]:
    make_group(kube, namespace, partitions=4)
    make_pods(kube, namespace, POD)
    sc = SidecarProcess(POD, GROUP, namespace, str(cluster.kubeconfig), tmp_path,
                        env={"KGROUP_APP_TIMEOUT_SECONDS": str(APP_TIMEOUT)}).start()
    try:
        yield sc
    finally:
        sc.stop()
    assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def test_a_partition_its_app_is_silent_on_is_stalled_in_the_status_an_event_and_the_cli(
        cluster: Cluster, kube: client.ApiClient, namespace: str,
        sidecar: SidecarProcess) -> None:
    app = App(sidecar.url)
    try:
        wait_for("the app holds the four partitions", lambda: len(app.held()) == 4,
                 timeout=60)
        held = app.held()
        quiet = min(held)
        app.reporting = set(held) - {quiet}
        app.start()
        st = status_where(kube, namespace, "Stalled",
                          lambda s: condition(s, "Stalled")[0] == "True", timeout=60)
        assert st["stalled"] == 1 and st["stalledPartitions"] == str(quiet)
        assert condition(st, "Ready") == ("False", "PartitionsStalled")
        events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
        warnings = [e for e in events.items if e.reason == "PartitionsStalled"]
        assert warnings and warnings[0].type == "Warning"
        assert POD in warnings[0].message
        assert f"has not reported on it within {APP_TIMEOUT}s" in warnings[0].message

        view = json.loads(kgroup_status(cluster, namespace, "-o", "json"))
        states = {r["partition"]: r["state"] for r in view["partitions"]}
        assert states == {p: "stalled" if p == quiet else "active" for p in held}

        app.reporting = None  # the app takes the silent partition up again
        status_where(kube, namespace, "Ready again",
                     lambda s: condition(s, "Ready")[0] == "True" and s.get("stalled") == 0,
                     timeout=60)
        assert condition(get_status(kube, namespace), "Stalled")[0] == "False"
    finally:
        app.stop()
