"""The operator's lock creates for a large group, on the real API server.

An empty group of 10,000 partitions used to wait minutes for its locks: the operator
created them one request after the other, then marked each for its owner with a second
write. Now a pass hands over at most ``CREATES_PER_PASS`` creates, runs them concurrently
(``kgroup_operator.kube.LOCK_WRITES_IN_FLIGHT`` at a time) and each lock created once the
target is known carries its owner's mark. Timings live in ``bench/bench_cost.py``; here
only what must hold: every lock exists, each was created with its mark, none was written
again, and the creates overlapped (their commit order is not the partition order).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from operator_harness import GROUP, Members, OperatorProcess
from test_operator import make_group, make_pods, status_where, stays, target

from kgroup import constants as C
from kgroup.core.operator.decide import CREATES_PER_PASS
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster


class LockEvents:
    """Every watch event of the group's partition Leases from before the operator starts:
    (type, partition, assigned mark, resourceVersion)."""

    def __init__(self, kube: client.ApiClient, namespace: str) -> None:
        self.coord = client.CoordinationV1Api(kube)
        self.namespace = namespace
        self.events: list[tuple[str, int, str | None, int]] = []
        self.closed = False
        self.selector = f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}={C.ROLE_PARTITION}"
        listing: Any = self.coord.list_namespaced_lease(namespace, label_selector=self.selector)
        self.rv = listing.metadata.resource_version
        self.w = watch.Watch()  # type: ignore[no-untyped-call]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._stream()
        except Exception:
            if not self.closed:  # the namespace's deletion ends the stream after close
                raise

    def _stream(self) -> None:
        for ev in self.w.stream(  # type: ignore[no-untyped-call]
                self.coord.list_namespaced_lease, self.namespace,
                label_selector=self.selector, resource_version=self.rv, timeout_seconds=300):
            md = ev["object"].metadata
            self.events.append((ev["type"], int(md.labels[C.LABEL_PARTITION]),
                                (md.annotations or {}).get(C.ANNOTATION_ASSIGNED),
                                int(md.resource_version)))

    def close(self) -> None:
        self.closed = True
        self.w.stop()  # type: ignore[no-untyped-call]


@pytest.fixture
def lock_events(kube: client.ApiClient, namespace: str) -> Iterator[LockEvents]:
    events = LockEvents(kube, namespace)
    yield events
    events.close()


def test_a_large_groups_locks_are_created_concurrently_each_with_its_owners_mark(
        cluster: Cluster, crd: list[str], namespace: str, kube: client.ApiClient,
        tmp_path: Path, lock_events: LockEvents) -> None:
    n = 2 * CREATES_PER_PASS + 100  # three passes of creates
    pods = ("w-0", "w-1")
    make_pods(kube, namespace, *pods)
    uid = make_group(kube, namespace, partitions=n, stabilizationWindowSeconds=0)
    members = Members(kube, namespace, uid)  # sessions renewed; no lock is taken
    members.join(*pods)
    op = OperatorProcess(cluster, namespace, tmp_path)
    op.start()
    try:
        st = status_where(kube, namespace, "a target for both members",
                          lambda s: set(target(s)) == set(pods), timeout=60)
        owner = {p: m for m, ps in target(st).items() for p in ps}

        def added() -> list[tuple[str, int, str | None, int]]:
            return [e for e in lock_events.events if e[0] == "ADDED"]

        wait_for(f"{n} locks created", lambda: len(added()) >= n, timeout=120)
        stays("no lock written again after its create",
              lambda: all(e[0] == "ADDED" for e in lock_events.events), 3.0)
        creates = added()
        assert sorted(e[1] for e in creates) == list(range(n))
        unmarked = [(p, mark) for _, p, mark, _ in creates if mark != owner[p]]
        assert unmarked == [], f"created without (or with another) owner's mark: {unmarked[:5]}"
        modified = [e for e in lock_events.events if e[0] != "ADDED"]
        assert modified == [], f"locks written again after their create: {modified[:5]}"
        by_commit = [p for _, p, _, _ in sorted(creates, key=lambda e: e[3])]
        assert by_commit != sorted(by_commit), "the creates were sent one after the other"
    finally:
        members.close()
        op.stop()
        assert "Traceback" not in op.log_text()
