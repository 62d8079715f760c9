"""The controller's lock creates (kgroup_operator.controller) on the real API server: the
core's creation chains (kgroup.core.operator.lock_creation) performed by its dispatcher,
one pass at a time, with the calls each pass makes. A squatter is a real Lease holding a
lock's name; a create that gets no answer is a broken connection injected into the real
client for one name (the only call not sent). The cache is fed by the test (the pods and
member Leases it would have watched), so no watch runs."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from operator_harness import operator_api, run_closing

from kgroup import constants as C
from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup.core.operator.decide import API_RETRY_SECONDS
from kgroup.core.operator.lease_cache import Cache
from kgroup_devcluster.cluster import Cluster
from kgroup_operator.controller import GroupController
from kgroup_operator.kube import Kube
from kgroup_operator.lock_gate import Urgency
from kgroup_operator.metrics import Metrics
from kgroup_operator.settings import OperatorSettings

pytestmark = pytest.mark.cluster
GROUP = "crt"


class Recording(Kube):
    """The real Kube, its lock calls written down; ``down``: Lease names whose create
    breaks before it is sent (no answer)."""

    calls: list[tuple[Any, ...]]
    down: set[str]
    bodies: list[Obj]

    async def create_partition_lease(self, *, namespace: str, body: Obj) -> Obj | None:
        name = codec.meta(body)["name"]
        self.calls.append(("create", name))
        self.bodies.append(body)
        if name in self.down:
            raise OSError("connection reset")
        return await super().create_partition_lease(namespace=namespace, body=body)

    async def get_lease(self, namespace: str, name: str,
                        urgency: Urgency = Urgency.EXPIRY) -> Obj | None:
        self.calls.append(("get-lease", name, urgency))
        return await super().get_lease(namespace, name, urgency)

    async def replace_status(self, body: Obj, status: Obj) -> Obj:
        self.calls.append(("replace-status", status.get("epoch")))
        return await super().replace_status(body, status)

    async def post_event(self, body: Obj, *, type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))
        await super().post_event(body, type_=type_, reason=reason, message=message)


def make_group(kube: client.ApiClient, namespace: str) -> Obj:
    custom: Any = client.CustomObjectsApi(kube)
    body: Obj = custom.create_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, {
            "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
            "metadata": {"name": GROUP},
            "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "crt"}},
                     "stabilizationWindowSeconds": 0,
                     "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5}}})
    return body


def controller(cluster: Cluster, namespace: str, body: Obj, now: list[float]
               ) -> tuple[GroupController, Recording]:
    cache = Cache(synced=True, known={(namespace, GROUP)})
    cache.put_pod(namespace, {"metadata": {"name": "a", "labels": {"app": "crt"},
                                           "uid": "uid-a", "resourceVersion": "1"},
                              "status": {"phase": "Running", "conditions": [
                                  {"type": "Ready", "status": "True"}]}})
    cache.put_lease(namespace, {
        "metadata": {"name": f"{GROUP}-member-a", "resourceVersion": "5",
                     "annotations": {C.ANNOTATION_SESSION: "s-a"},
                     "labels": {C.LABEL_GROUP: GROUP, C.LABEL_ROLE: C.ROLE_MEMBER,
                                C.LABEL_MEMBER: "a"}},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}, now[0])
    rec = Recording(operator_api(cluster), identity="e2e-creates")
    rec.calls, rec.down, rec.bodies = [], set(), []
    ctl = GroupController((namespace, GROUP), cache=cache, kube=rec, metrics=Metrics(),
                          settings=OperatorSettings(), clock=lambda: now[0])
    ctl.update(body)
    ctl.leases_listed = True  # the cache above stands in for the group's Lease watch
    return ctl, rec


def locks(kube: client.ApiClient, namespace: str) -> dict[str, Any]:
    coord: Any = client.CoordinationV1Api(kube)
    return {x.metadata.name: x for x in coord.list_namespaced_lease(namespace).items}


def test_a_pass_creates_each_missing_lock_as_the_codec_builds_it_and_a_squatter_is_named(
    cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
) -> None:
    # a Lease that is not this group's lock holds partition 2's name
    squat = f"{GROUP}-partition-2"
    coord: Any = client.CoordinationV1Api(kube)
    coord.create_namespaced_lease(namespace, {
        "metadata": {"name": squat, "labels": {"app": "other"}}, "spec": {}})
    body, now = make_group(kube, namespace), [100.0]
    ctl, rec = controller(cluster, namespace, body, now)
    run_closing(rec.api, ctl.reconcile())
    creates = [("create", f"{GROUP}-partition-{p}") for p in range(4)]
    # the 409 is read back on the create lane, before the status write
    assert rec.calls[:4] == creates
    assert rec.calls[4:6] == [("get-lease", squat, Urgency.CREATE), ("replace-status", 1)]
    assert rec.bodies[1] == codec.new_partition_lease(
        namespace=namespace, group=body, partition=1, duration=15, assigned="a",
        assigned_uid="uid-a")
    stored = locks(kube, namespace)
    assert {f"{GROUP}-partition-{p}" for p in (0, 1, 3)} <= set(stored)
    assert stored[squat].metadata.labels == {"app": "other"}  # left as it was
    rec.calls = []
    now[0] += 6.0  # past the 5 s recheck of a create: not yet the 30 s of a squatted name
    run_closing(rec.api, ctl.reconcile())
    # not shown by the watch (none runs): asked again, the squatted name not yet
    assert [c for c in rec.calls if c[0] == "create"] == [creates[0], creates[1], creates[3]]
    assert ("event", "LeaseNameTaken") in rec.calls
    status = (ctl.body or {})["status"]
    assert status["phase"] == "Degraded"
    assert any(c.get("reason") == "LeaseNameTaken" for c in status["conditions"])


def test_a_create_without_an_answer_ends_the_pass_before_the_status_write(
    cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
) -> None:
    body, now = make_group(kube, namespace), [100.0]
    ctl, rec = controller(cluster, namespace, body, now)
    rec.down.add(f"{GROUP}-partition-1")
    assert run_closing(rec.api, ctl.reconcile()) == API_RETRY_SECONDS
    assert rec.calls == [("create", f"{GROUP}-partition-{p}") for p in range(4)]
    assert f"{GROUP}-partition-1" not in locks(kube, namespace)
    custom: Any = client.CustomObjectsApi(kube)
    assert not custom.get_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP).get("status")
    rec.calls, rec.down = [], set()
    now[0] += API_RETRY_SECONDS
    run_closing(rec.api, ctl.reconcile())
    assert rec.calls == [("create", f"{GROUP}-partition-1"), ("replace-status", 1),
                         ("event", "RebalanceStarted")]
    assert f"{GROUP}-partition-1" in locks(kube, namespace)
