"""The sidecar's asyncio driver (kgroup_sidecar.runtime) on the real API server: for each
decision case, the exact sequence of Kubernetes calls it makes, on a fake clock.

The decisions themselves are tested request by request in tests/test_sidecar_logic.py;
this checks the driver's half: each request becomes the right call (with the request's
timeout), and each real outcome (object, 404, 409) comes back as the right answer. The
calls go through a recording ``KubeAdapter`` to the real server; the watches are not
started (the test feeds the lists itself, read from the server), so nothing else writes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kgroup.core.lease_codec import is_member, is_partition
from kgroup.core.locks import LeaseTiming
from kgroup.core.member.pacing import request_timeout
from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import Cluster
from kgroup_sidecar.kube import KubeAdapter
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings
from kgroup_testing.sidecar_harness import ScriptedTarget

pytestmark = pytest.mark.cluster
GROUP = "drv"
POD = "pod-a"
T = request_timeout(LeaseTiming(duration=15, renew_interval=5))


class Recording(KubeAdapter):
    """The real adapter, with every call written down as (verb, Lease name, timeout)."""

    calls: list[tuple[str, str, float]]

    async def get_lease(self, name: str, *, timeout: float, session: bool = False
                        ) -> Obj | None:
        self.calls.append(("get", name, timeout))
        return await super().get_lease(name, timeout=timeout, session=session)

    async def create_lease(self, body: Obj, *, timeout: float) -> Obj:
        self.calls.append(("create", body["metadata"]["name"], timeout))
        return await super().create_lease(body, timeout=timeout)

    async def replace_lease(self, body: Obj, *, timeout: float) -> Obj:
        self.calls.append(("replace", body["metadata"]["name"], timeout))
        return await super().replace_lease(body, timeout=timeout)

    async def delete_lease(self, name: str, *, timeout: float,
                           resource_version: str | None = None, session: bool = False) -> None:
        self.calls.append(("delete", name, timeout))
        await super().delete_lease(name, timeout=timeout, session=session)


class Drive:
    def __init__(self, kube: client.ApiClient, namespace: str, kubeconfig: str) -> None:
        self.target = ScriptedTarget(kube, namespace, GROUP)
        self.custom: Any = client.CustomObjectsApi(kube)
        self.leases: Any = client.CoordinationV1Api(kube)
        self.namespace = namespace
        self.now = 1000.0
        settings = Settings(group=GROUP, namespace=namespace, pod_name=POD,
                            kubeconfig=kubeconfig, app_timeout_seconds=0)
        self.sidecar = Sidecar(settings, clock=lambda: self.now)
        self.settings = settings

    def attach(self, loop: asyncio.AbstractEventLoop) -> Recording:
        kube = Recording(self.settings, loop=loop, on_list=self.sidecar.on_list,
                         on_event=self.sidecar.on_event, metrics=self.sidecar.metrics)
        kube.calls = []
        self.sidecar.kube = kube
        return kube

    def observe(self) -> None:
        """What the three watches would list now."""
        group = self.custom.get_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", self.namespace, "consumergroups", GROUP)
        raw = self.leases.list_namespaced_lease(self.namespace, _preload_content=False)
        items: list[Obj] = json.loads(raw.data)["items"]
        self.sidecar.on_list("group", [group])
        self.sidecar.on_list("member", [o for o in items if is_member(o)])
        self.sidecar.on_list("partition", [o for o in items if is_partition(o)], None)

    async def tick(self, kube: Recording) -> list[tuple[str, str, float]]:
        """One tick; every chain it starts driven to its end. The calls made, in order."""
        kube.calls = []
        for chain in self.sidecar.logic.tick().chains:
            await self.sidecar._drive(chain)
        return kube.calls


@pytest.fixture
def drive(cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str
          ) -> Iterator[Drive]:
    yield Drive(kube, namespace, str(cluster.kubeconfig))


def test_the_driver_makes_exactly_the_calls_each_decision_asks_for(drive: Drive) -> None:
    member, p0, p1 = f"{GROUP}-member-{POD}", f"{GROUP}-partition-0", f"{GROUP}-partition-1"
    drive.target.create(partitions=2, duration=15, renew=5, drain=10)
    drive.target.assign({POD: [0]})
    drive.target.mark(1, POD)  # marked ahead, so the stale cache below differs by a note
    drive.observe()

    async def scenario() -> None:
        kube = drive.attach(asyncio.get_running_loop())
        logic = drive.sidecar.logic
        # a session: read our member Lease (404 -> absent), create it
        assert await drive.tick(kube) == [("get", member, T), ("create", member, T)]
        assert logic.member.session is not None
        # acquire the target: one conditional update of partition 0
        assert await drive.tick(kube) == [("replace", p0, T)]
        assert drive.target.holder(0) == (POD, logic.member.session, 1)
        # partition 1 changes behind the cache's back: the update is refused (409), and a
        # refused acquisition is not read back
        stale = drive.target.lock(1)
        stale["metadata"].setdefault("annotations", {})["note"] = "touched"
        drive.leases.replace_namespaced_lease(p1, drive.namespace, stale)
        drive.target.assign({POD: [0, 1]})
        group = drive.custom.get_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", drive.namespace, "consumergroups", GROUP)
        drive.sidecar.on_event("group", "MODIFIED", group)
        calls = await drive.tick(kube)
        assert calls == [("replace", p1, T)] and 1 not in logic.member.owned
        # the next list brings the changed lock; the retry (a second later) takes it
        drive.observe()
        drive.now += 1.0
        assert await drive.tick(kube) == [("replace", p1, T)]
        assert sorted(logic.member.owned) == [0, 1]
        drive.now += 5.0  # held == target: the renewal acknowledges epoch 2
        assert await drive.tick(kube) == [("replace", member, T)]
        notes = drive.target.member_lease(POD)["metadata"]["annotations"]  # type: ignore[index]
        assert notes["kgroup.dev/epoch"] == "2"
        # our member Lease written behind our back (same session): 409, read it, retry soon
        ours = drive.target.member_lease(POD)
        assert ours is not None
        ours["metadata"]["annotations"]["note"] = "touched"  # a real change: a new version
        drive.leases.replace_namespaced_lease(member, drive.namespace, ours)
        drive.now += 5.0
        assert await drive.tick(kube) == [("replace", member, T), ("get", member, T)]
        drive.now += 0.05
        assert await drive.tick(kube) == [("replace", member, T)]
        # shutdown: revoke, the app releases both, then the member Lease goes
        drive.sidecar.begin_shutdown()
        assert await drive.tick(kube) == []  # revocations: nothing to call yet
        owned = logic.member.owned  # tokens: the resourceVersions the acquisitions replaced
        assert owned[0].token == drive.target.token(0) and owned[1].token > owned[0].token
        drive.sidecar.logic.app_release(0, owned[0].token, "17")
        drive.sidecar.logic.app_release(1, owned[1].token, None)
        assert sorted(await drive.tick(kube)) == [("replace", p0, T), ("replace", p1, T)]
        assert drive.target.holder(0) == (None, None, 1)
        assert await drive.tick(kube) == [("delete", member, T)]
        assert drive.target.member_lease(POD) is None
        assert drive.sidecar.logic.tick().exit == "session ended"
        await kube.aclose()  # stops, and closes its clients (the shared and the session's)

    asyncio.run(scenario())
