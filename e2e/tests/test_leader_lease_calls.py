"""The operator's leader election on the real API server: the exact calls each case makes,
counted at the operator's client, kgroup.apiclient (as client-go's leaderelection tests
count a clientset's actions), with the election's clock moved by the test
(kgroup.core.operator.leader_election decides; kgroup_operator.leader calls)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client

from kgroup.apiclient import ApiClient, kubeconfig_config
from kgroup.core.objects import Obj
from kgroup_devcluster import Cluster
from kgroup_operator.leader import LABELS, LeaseElector

pytestmark = pytest.mark.cluster
DURATION = 6.0
NAME = "kgroup-operator-leader"
VERBS = {"get": "read", "create": "create", "replace": "replace", "patch": "patch",
         "delete": "delete"}


class Counted:
    """The real client, with every request's verb recorded."""

    def __init__(self, real: ApiClient) -> None:
        self.real = real
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.real, name)
        if name not in VERBS:
            return method

        async def call(*args: Any, **kwargs: Any) -> Obj | None:
            self.calls.append(VERBS[name])
            out: Obj | None = await method(*args, **kwargs)
            return out

        return call

    def take(self) -> list[str]:
        out, self.calls = self.calls, []
        return out


class Replica:
    def __init__(self, api: ApiClient, namespace: str, identity: str) -> None:
        self.now = 0.0
        self.api = Counted(api)
        self.elector = LeaseElector(self.api, namespace=namespace,  # type: ignore[arg-type]
                                    name=NAME, identity=identity, duration=DURATION,
                                    clock=lambda: self.now)

    async def attempt(self) -> tuple[bool, list[str]]:
        won = await self.elector._try_acquire()
        return won, self.api.take()

    async def renew(self) -> tuple[bool, list[str]]:
        renewed = await self.elector._renew()
        return renewed, self.api.take()


def holder(kube: client.ApiClient, namespace: str) -> tuple[str | None, int]:
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(NAME, namespace)
    assert lease.metadata is not None and lease.spec is not None
    assert lease.metadata.labels == LABELS
    return lease.spec.holder_identity, int(lease.spec.lease_transitions or 0)


def test_each_case_makes_exactly_its_calls(cluster: Cluster, kube: client.ApiClient,
                                           namespace: str) -> None:
    async def scenario() -> None:
        api = ApiClient(kubeconfig_config(cluster.kubeconfig))
        try:
            a, b = Replica(api, namespace, "a"), Replica(api, namespace, "b")
            # no Lease: a read (404) and a create
            assert await a.attempt() == (True, ["read", "create"])
            assert holder(kube, namespace) == ("a", 0)
            # a live leader: the standby reads, writes nothing
            assert await b.attempt() == (False, ["read"])
            # the leader renews: a read and a replace
            assert await a.renew() == (True, ["read", "replace"])
            # renewed since b's last look: b's clock restarts, even a duration later
            b.now += DURATION
            assert await b.attempt() == (False, ["read"])
            b.now += DURATION - 0.5
            assert await b.attempt() == (False, ["read"])
            # unrenewed for a full duration on b's clock: a read and one replace
            # (precondition)
            b.now += 0.5
            assert await b.attempt() == (True, ["read", "replace"])
            assert holder(kube, namespace) == ("b", 1)
            # the old leader's renewal finds the Lease taken: a read, no write
            assert await a.renew() == (False, ["read"])
        finally:
            await api.close()

    asyncio.run(scenario())
