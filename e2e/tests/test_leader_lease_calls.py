"""The operator's leader election on the real API server: the exact calls each case makes,
counted at the Kubernetes client (as client-go's leaderelection tests count a clientset's
actions), with the election's clock moved by the test (kgroup.core.operator.leader_election decides;
kgroup_operator.leader calls)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from kgroup_operator.leader import LABELS, LeaseElector

pytestmark = pytest.mark.cluster
DURATION = 6.0
NAME = "kgroup-operator-leader"


class Counted:
    """The real CoordinationV1Api, with every call's method name recorded."""

    def __init__(self, real: client.CoordinationV1Api) -> None:
        self.real = real
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name.removesuffix("_namespaced_lease"))
            return method(*args, **kwargs)

        return call

    def take(self) -> list[str]:
        out, self.calls = self.calls, []
        return out


class Replica:
    def __init__(self, kube: client.ApiClient, namespace: str, identity: str) -> None:
        self.now = 0.0
        self.elector = LeaseElector(kube, namespace=namespace, name=NAME, identity=identity,
                                    duration=DURATION, clock=lambda: self.now)
        self.api = Counted(self.elector.coord)
        self.elector.coord = self.api  # type: ignore[assignment]

    def attempt(self) -> tuple[bool, list[str]]:
        won = self.elector._try_acquire()
        return won, self.api.take()


def holder(kube: client.ApiClient, namespace: str) -> tuple[str | None, int]:
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(NAME, namespace)
    assert lease.metadata is not None and lease.spec is not None
    assert lease.metadata.labels == LABELS
    return lease.spec.holder_identity, int(lease.spec.lease_transitions or 0)


def test_each_case_makes_exactly_its_calls(kube: client.ApiClient, namespace: str) -> None:
    a, b = Replica(kube, namespace, "a"), Replica(kube, namespace, "b")
    # no Lease: a read (404) and a create
    assert a.attempt() == (True, ["read", "create"])
    assert holder(kube, namespace) == ("a", 0)
    # a live leader: the standby reads, writes nothing
    assert b.attempt() == (False, ["read"])
    # the leader renews: a read and a replace
    assert a.elector._renew() is True and a.api.take() == ["read", "replace"]
    # renewed since b's last look: b's clock restarts, even a duration later
    b.now += DURATION
    assert b.attempt() == (False, ["read"])
    b.now += DURATION - 0.5
    assert b.attempt() == (False, ["read"])
    # unrenewed for a full duration on b's clock: a read and one replace (precondition)
    b.now += 0.5
    assert b.attempt() == (True, ["read", "replace"])
    assert holder(kube, namespace) == ("b", 1)
    # the old leader's renewal finds the Lease taken: a read, no write
    assert a.elector._renew() is False and a.api.take() == ["read"]

