"""The controller's lock creates (kgroup_operator.controller): the core's creation chains
(kgroup.core.operator.lock_creation) performed by its dispatcher on a fake API server, one
pass at a time, with the exact calls each pass makes. The same calls on the real API
server: e2e/tests/test_operator_driver.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from kgroup import constants as C
from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup.core.operator.decide import API_RETRY_SECONDS
from kgroup.core.operator.lease_cache import Cache
from kgroup_operator.controller import GroupController
from kgroup_operator.kube import Kube
from kgroup_operator.lock_gate import Urgency
from kgroup_operator.metrics import Metrics
from kgroup_operator.settings import OperatorSettings

NS, GROUP = "ns", "g"


class FakeKube:
    """The calls the controller makes, written down; ``taken``: Lease names held by an
    object already (a create answers 409, a read returns it); ``down``: Lease names whose
    create gets no answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.taken: dict[str, Obj] = {}
        self.down: set[str] = set()
        self.rv = 10

    async def create_partition_lease(self, *, namespace: str, body: Obj) -> Obj | None:
        name = codec.meta(body)["name"]
        self.calls.append(("create", name))
        if name in self.down:
            raise OSError("connection reset")
        if name in self.taken:
            return None
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def get_lease(self, namespace: str, name: str,
                        urgency: Urgency = Urgency.EXPIRY) -> Obj | None:
        self.calls.append(("get-lease", name, urgency))
        return self.taken.get(name)

    async def replace_status(self, body: Obj, status: Obj) -> Obj:
        self.calls.append(("replace-status", status.get("epoch")))
        self.rv += 1
        return {**body, "status": status,
                "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}

    async def post_event(self, body: Obj, *, type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))


def group() -> Obj:
    return {"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
            "metadata": {"name": GROUP, "namespace": NS, "uid": "u", "resourceVersion": "10",
                         "generation": 1},
            "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "x"}},
                     "stabilizationWindowSeconds": 0,
                     "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5}}}


def controller(kube: FakeKube, now: list[float]) -> GroupController:
    cache = Cache(synced=True, known={(NS, GROUP)})
    cache.put_pod(NS, {"metadata": {"name": "a", "labels": {"app": "x"}, "uid": "uid-a",
                                    "resourceVersion": "1"},
                       "status": {"phase": "Running",
                                  "conditions": [{"type": "Ready", "status": "True"}]}})
    cache.put_lease(NS, {"metadata": {"name": f"{GROUP}-member-a", "resourceVersion": "5",
                                      "annotations": {C.ANNOTATION_SESSION: "s-a"},
                                      "labels": {C.LABEL_GROUP: GROUP,
                                                 C.LABEL_ROLE: C.ROLE_MEMBER,
                                                 C.LABEL_MEMBER: "a"}},
                         "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}, now[0])
    ctl = GroupController((NS, GROUP), cache=cache, kube=cast(Kube, kube), metrics=Metrics(),
                          settings=OperatorSettings(), clock=lambda: now[0])
    ctl.update(group())
    ctl.leases_listed = True  # the cache above stands in for the group's Lease watch
    return ctl


def test_a_pass_creates_each_missing_lock_as_the_codec_builds_it_then_writes_the_status(
) -> None:
    kube, now = FakeKube(), [100.0]
    ctl = controller(kube, now)
    bodies: list[Obj] = []
    create = kube.create_partition_lease

    async def recording(*, namespace: str, body: Obj) -> Obj | None:
        bodies.append(body)
        return await create(namespace=namespace, body=body)

    kube.create_partition_lease = recording  # type: ignore[method-assign]
    asyncio.run(ctl.reconcile())
    assert kube.calls == [("create", f"{GROUP}-partition-{p}") for p in range(4)] + [
        ("replace-status", 1), ("event", "RebalanceStarted")]
    assert bodies[2] == codec.new_partition_lease(
        namespace=NS, group=ctl.body or {}, partition=2, duration=15, assigned="a",
        assigned_uid="uid-a")
    kube.calls = []
    now[0] += 1.0
    asyncio.run(ctl.reconcile())
    assert kube.calls == []  # created, the watch not there yet: not asked again


def test_a_create_answered_409_reads_the_name_back_on_the_create_lane_and_names_a_squatter(
) -> None:
    kube, now = FakeKube(), [100.0]
    squat = {"metadata": {"name": f"{GROUP}-partition-2", "labels": {"app": "other"}}}
    kube.taken[f"{GROUP}-partition-2"] = squat
    ctl = controller(kube, now)
    asyncio.run(ctl.reconcile())
    assert ("get-lease", f"{GROUP}-partition-2", Urgency.CREATE) in kube.calls
    assert kube.calls.index(("get-lease", f"{GROUP}-partition-2", Urgency.CREATE)) < \
        kube.calls.index(("replace-status", 1))
    kube.calls = []
    now[0] += 6.0  # past the 5 s recheck of a create: not yet the 30 s of a squatted name
    asyncio.run(ctl.reconcile())
    assert [c for c in kube.calls if c[0] == "create"] == [
        ("create", f"{GROUP}-partition-0"), ("create", f"{GROUP}-partition-1"),
        ("create", f"{GROUP}-partition-3")]  # not shown by the watch: asked again
    assert ("event", "LeaseNameTaken") in kube.calls
    status = (ctl.body or {})["status"]
    assert status["phase"] == "Degraded"
    assert any(c.get("reason") == "LeaseNameTaken" for c in status["conditions"])


def test_a_create_without_an_answer_ends_the_pass_before_the_status_write() -> None:
    kube, now = FakeKube(), [100.0]
    kube.down.add(f"{GROUP}-partition-1")
    ctl = controller(kube, now)
    assert asyncio.run(ctl.reconcile()) == API_RETRY_SECONDS
    assert kube.calls == [("create", f"{GROUP}-partition-{p}") for p in range(4)]
    kube.calls, kube.down = [], set()
    now[0] += API_RETRY_SECONDS
    asyncio.run(ctl.reconcile())
    assert kube.calls == [("create", f"{GROUP}-partition-1"), ("replace-status", 1),
                          ("event", "RebalanceStarted")]
