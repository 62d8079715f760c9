"""The operator's kopf-side driver (kgroup_operator.controller) on the real API server: for
each decision case, the exact sequence of Kubernetes calls one reconcile pass makes, on a
fake clock.

The decisions are tested pass by pass in tests/test_operator_logic.py; this checks the
driver's half: each plan becomes the right calls, in order (partition Leases, status
write with the read resourceVersion, Events, marks carrying the pod's uid), and a real
409 is answered by a re-read: of the group after a status write, of the lock after a
mark decided on a stale view of it (the mark is a conditional patch).
The calls go through a recording ``Kube`` to the real server; the cache is fed by the
test (the pods and member Leases it would have watched), so no watch runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from operator_harness import operator_api, run_closing

from kgroup import constants as C
from kgroup.apiclient import ApiClient
from kgroup.core.objects import Obj
from kgroup.core.operator.lease_cache import Cache
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster.cluster import Cluster
from kgroup_operator.controller import GroupController
from kgroup_operator.kube import Conflict, Kube
from kgroup_operator.lock_gate import LockGate, Urgency
from kgroup_operator.metrics import Metrics
from kgroup_operator.settings import OperatorSettings

pytestmark = pytest.mark.cluster
GROUP = "drv"


class Recording(Kube):
    """The real Kube, with every call written down as (verb, what)."""

    calls: list[tuple[str, str]]
    completions = False

    async def create_partition_lease(self, *, namespace: str, body: Obj) -> Obj | None:
        partition = str(body["metadata"]["labels"][C.LABEL_PARTITION])
        self.calls.append(("create-lease", partition))
        out = await super().create_partition_lease(namespace=namespace, body=body)
        if self.completions:  # a create waits for the gate: when it was done, too
            self.calls.append(("created", partition))
        return out

    async def mark_partition_lease(self, *, namespace: str, group: str, partition: int,
                                   member: str, uid: str | None, seen_rv: str,
                                   wanted: Callable[[], bool] | None = None) -> Obj | None:
        def turn() -> bool:  # written down as its turn comes: sent, or dropped unsent
            ok = wanted is None or wanted()
            self.calls.append(("mark" if ok else "superseded", f"{partition}={member}"))
            return ok

        stored = await super().mark_partition_lease(namespace=namespace, group=group,
                                                    partition=partition, member=member,
                                                    uid=uid, seen_rv=seen_rv, wanted=turn)
        if stored is None:
            self.calls.append(("409", str(partition)))
        return stored

    async def get_lease(self, namespace: str, name: str,
                        urgency: Urgency = Urgency.EXPIRY) -> Obj | None:
        self.calls.append(("get-lease", name))
        return await super().get_lease(namespace, name, urgency)

    async def replace_status(self, body: Obj, status: Obj) -> Obj:
        self.calls.append(("replace-status", str(status.get("epoch"))))
        try:
            return await super().replace_status(body, status)
        except Conflict:
            self.calls.append(("409", ""))
            raise

    async def get_group(self, namespace: str, name: str) -> Obj | None:
        self.calls.append(("get-group", name))
        return await super().get_group(namespace, name)

    async def post_event(self, body: Obj, *, type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))
        await super().post_event(body, type_=type_, reason=reason, message=message)


def pod(name: str) -> Obj:
    return {"metadata": {"name": name, "labels": {"app": "drv"}, "resourceVersion": "1",
                         "uid": f"uid-{name}"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def member_lease(member: str, rv: str) -> Obj:
    return {"metadata": {"name": f"{GROUP}-member-{member}", "resourceVersion": rv,
                         "annotations": {C.ANNOTATION_SESSION: f"s-{member}"},
                         "labels": {C.LABEL_GROUP: GROUP, C.LABEL_ROLE: C.ROLE_MEMBER,
                                    C.LABEL_MEMBER: member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 15}}


def test_one_pass_makes_exactly_the_calls_its_plan_asks_for(
    cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
) -> None:
    custom: Any = client.CustomObjectsApi(kube)
    body = custom.create_namespaced_custom_object(C.API_GROUP, C.API_VERSION, namespace,
                                                  C.PLURAL, {
        "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
        "metadata": {"name": GROUP},
        "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "drv"}},
                 "stabilizationWindowSeconds": 0,
                 "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5}}})
    now = [100.0]
    cache = Cache(synced=True, known={(namespace, GROUP)})
    for name in ("a", "b"):
        cache.put_pod(namespace, pod(name))
        cache.put_lease(namespace, member_lease(name, "1" + name.encode().hex()), now[0])

    async def scenario(api: ApiClient) -> None:
        rec = Recording(api, identity="e2e-driver")
        rec.calls = []
        ctl = GroupController((namespace, GROUP), cache=cache, kube=rec, metrics=Metrics(),
                              settings=OperatorSettings(), clock=lambda: now[0])
        ctl.update(body)
        ctl.leases_listed = True  # the cache above stands in for the group's Lease watch

        async def reconcile() -> tuple[list[tuple[str, str]], float | None]:
            rec.calls = []
            wait = await ctl.reconcile()
            await ctl.drained()  # the marks run behind the pass
            return rec.calls, wait

        # first pass: every lock, then the first target, then its Event
        calls, _ = await reconcile()
        assert calls == [("create-lease", "0"), ("create-lease", "1"), ("create-lease", "2"),
                         ("create-lease", "3"), ("replace-status", "1"),
                         ("event", "RebalanceStarted")]
        leases: Any = client.CoordinationV1Api(kube).list_namespaced_lease(
            namespace, label_selector=f"{C.LABEL_ROLE}={C.ROLE_PARTITION}")
        assert len(leases.items) == 4
        # created marked for their target owner (no write of their own)
        assert {int(x.metadata.labels[C.LABEL_PARTITION]):
                x.metadata.annotations[C.ANNOTATION_ASSIGNED]
                for x in leases.items} == {0: "a", 1: "a", 2: "b", 3: "b"}
        assert {x.metadata.annotations[C.ANNOTATION_ASSIGNED_UID] for x in leases.items} == {
            "uid-a", "uid-b"}  # and for their pods
        for x in leases.items:  # as the Lease watch would deliver them
            cache.put_lease(namespace, kube.sanitize_for_serialization(x), now[0])  # type: ignore[no-untyped-call]
        stored = custom.get_namespaced_custom_object(C.API_GROUP, C.API_VERSION, namespace,
                                                     C.PLURAL, GROUP)
        assert stored["status"]["assignment"] == {"a": "0-1", "b": "2-3"}
        # quiet: nothing changed, nothing called
        assert (await reconcile())[0] == []
        # the group changes behind the controller's back (a label: a new version, same
        # status); a member joins: the write is refused (409), the group is read again,
        # and the next pass writes the new target on the fresh version
        custom.patch_namespaced_custom_object(C.API_GROUP, C.API_VERSION, namespace, C.PLURAL,
                                              GROUP, {"metadata": {"labels": {"x": "y"}}})
        cache.put_pod(namespace, pod("c"))
        cache.put_lease(namespace, member_lease("c", "300"), now[0])
        now[0] += 2.0
        calls, wait = await reconcile()
        assert calls == [("replace-status", "2"), ("409", ""), ("get-group", GROUP)]
        assert wait == 0.0
        calls, _ = await reconcile()
        # the new target, its Event, then one mark per moved partition, after the write
        stored = custom.get_namespaced_custom_object(C.API_GROUP, C.API_VERSION, namespace,
                                                     C.PLURAL, GROUP)
        owner = {p: m for m, r in stored["status"]["assignment"].items()
                 for p in parse_ranges(r)}
        before = {0: "a", 1: "a", 2: "b", 3: "b"}
        moved = sorted(p for p in owner if owner[p] != before[p])
        assert moved and calls == [("replace-status", "2"), ("event", "RebalanceStarted")] + [
            ("mark", f"{p}={owner[p]}") for p in moved]
        leases = client.CoordinationV1Api(kube).list_namespaced_lease(
            namespace, label_selector=f"{C.LABEL_ROLE}={C.ROLE_PARTITION}")
        assert {int(x.metadata.labels[C.LABEL_PARTITION]):
                x.metadata.annotations[C.ANNOTATION_ASSIGNED] for x in leases.items} == owner
        assert (await reconcile())[0] == []  # the answers went into the cache: no re-mark
        # a hand edit of a mark is repaired by the next pass
        victim = moved[0]
        client.CoordinationV1Api(kube).patch_namespaced_lease(
            f"{GROUP}-partition-{victim}", namespace,
            {"metadata": {"annotations": {C.ANNOTATION_ASSIGNED: "mallory"}}})
        edited = client.CoordinationV1Api(kube).read_namespaced_lease(
            f"{GROUP}-partition-{victim}", namespace)
        cache.put_lease(namespace, kube.sanitize_for_serialization(edited),  # type: ignore[no-untyped-call]
                        now[0])
        assert (await reconcile())[0] == [("mark", f"{victim}={owner[victim]}")]
        # a mark decided on a stale view: the cache shows a hand edit, but the lock changed
        # again since (a second edit the watch has not delivered); the conditional patch is
        # refused (409) and changes nothing, the lock is re-read into the cache, and the
        # next pass marks the lock as it is
        lock_name = f"{GROUP}-partition-{victim}"
        coord: Any = client.CoordinationV1Api(kube)
        coord.patch_namespaced_lease(lock_name, namespace, {"metadata": {"annotations": {
            C.ANNOTATION_ASSIGNED: "mallory"}}})
        cache.put_lease(namespace, kube.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            coord.read_namespaced_lease(lock_name, namespace)), now[0])
        coord.patch_namespaced_lease(lock_name, namespace, {"metadata": {"annotations": {
            C.ANNOTATION_ASSIGNED: "mallory-2"}}})
        ctl.poked.clear()
        assert (await reconcile())[0] == [("mark", f"{victim}={owner[victim]}"),
                                          ("409", str(victim)), ("get-lease", lock_name)]
        assert coord.read_namespaced_lease(lock_name, namespace).metadata.annotations[
            C.ANNOTATION_ASSIGNED] == "mallory-2"  # the stale patch changed nothing
        assert ctl.poked.is_set()  # decided again at once
        assert (await reconcile())[0] == [("mark", f"{victim}={owner[victim]}")]
        notes = coord.read_namespaced_lease(lock_name, namespace).metadata.annotations
        assert (notes[C.ANNOTATION_ASSIGNED], notes[C.ANNOTATION_ASSIGNED_UID]) == (
            owner[victim], f"uid-{owner[victim]}")

    api = operator_api(cluster)
    run_closing(api, scenario(api))


def test_queued_marks_give_way_to_a_newer_target_and_go_before_creates(
    cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
) -> None:
    """The marks run behind the pass, one request at a time here (a gate of one slot) so
    that a queue forms: a pass that moves a queued mark's lock again drops the queued mark
    unsent; the next pass's creates wait behind the marks already waiting (each mark lets
    its owner start at once), and the pass still returns before the marks are done."""
    custom: Any = client.CustomObjectsApi(kube)
    coord: Any = client.CoordinationV1Api(kube)
    spec = {"partitions": 96, "selector": {"matchLabels": {"app": "drv"}},
            "stabilizationWindowSeconds": 0, "reshape": {"policy": "Append"},
            "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5}}
    body = custom.create_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL,
        {"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
         "metadata": {"name": GROUP}, "spec": spec})
    now = [100.0]
    cache = Cache(synced=True, known={(namespace, GROUP)})

    def join(name: str) -> None:
        cache.put_pod(namespace, pod(name))
        cache.put_lease(namespace, member_lease(name, str(1000 + len(cache.pods[namespace]))),
                        now[0])
        now[0] += 2.0

    def owners() -> dict[int, str]:
        st = custom.get_namespaced_custom_object(C.API_GROUP, C.API_VERSION, namespace,
                                                 C.PLURAL, GROUP)["status"]
        return {p: m for m, r in st["assignment"].items() for p in parse_ranges(r)}

    def marks_stored() -> dict[int, str]:
        items = coord.list_namespaced_lease(
            namespace, label_selector=f"{C.LABEL_ROLE}={C.ROLE_PARTITION}").items
        for x in items:  # as the Lease watch would deliver them
            cache.put_lease(namespace, kube.sanitize_for_serialization(x), now[0])  # type: ignore[no-untyped-call]
        return {int(x.metadata.labels[C.LABEL_PARTITION]):
                x.metadata.annotations[C.ANNOTATION_ASSIGNED] for x in items}

    join("a")
    join("b")

    async def scenario(api: ApiClient) -> None:
        rec = Recording(api, identity="e2e-driver")
        rec.calls = []
        rec.gate = LockGate(1)
        rec.completions = True
        ctl = GroupController((namespace, GROUP), cache=cache, kube=rec, metrics=Metrics(),
                              settings=OperatorSettings(), clock=lambda: now[0])
        ctl.update(body)
        ctl.leases_listed = True

        async def settle() -> None:  # until a pass sends nothing more
            for _ in range(4):
                await ctl.drained()
                marks_stored()
                rec.calls = []
                await ctl.reconcile()
                await ctl.drained()
                if not rec.calls:
                    return
            raise AssertionError(f"still writing: {rec.calls}")

        await settle()
        assert marks_stored() == owners()
        # c joins: its marks queue behind the one slot; d joins before they are all sent,
        # and takes some of the locks the queued marks were for
        join("c")
        rec.calls = []
        await ctl.reconcile()
        second = owners()  # a blocking read: the queue stands still meanwhile
        join("d")
        await ctl.reconcile()
        third = owners()
        await ctl.drained()
        dropped = [what for verb, what in rec.calls if verb == "superseded"]
        moved_twice = {p for p, m in second.items() if m == "c" and third[p] != "c"}
        assert dropped, f"no queued mark was dropped: {rec.calls}"
        assert {int(w.split("=")[0]) for w in dropped} <= moved_twice
        assert all(w.endswith("=c") for w in dropped)
        await settle()
        assert marks_stored() == third
        # e joins (its marks queue), then the group grows by four partitions (Append: they
        # are assigned at once): the next pass's creates are sent after the marks waiting
        join("e")
        rec.calls = []
        await ctl.reconcile()
        while sum(verb == "mark" for verb, _ in rec.calls) < 2:  # the queue has formed
            await asyncio.sleep(0.001)
        queued_from, queued = len(rec.calls), rec.gate.waiting
        grown = custom.patch_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP, {"spec": {"partitions": 100}})
        ctl.update(grown)
        await ctl.reconcile()
        await ctl.drained()
        # what went through the gate, in order (a create is written down at its end)
        after = [c for c in rec.calls[queued_from:] if c[0] in ("mark", "superseded", "created")]
        assert queued >= 5 and sum(c[0] == "created" for c in after) == 4
        assert all(verb != "created" for verb, _ in after[:queued]), (
            f"creates went before the {queued} marks waiting: {after}")
        await settle()
        assert marks_stored() == owners()
        assert set(owners().values()) == {"a", "b", "c", "d", "e"}

    api = operator_api(cluster)
    run_closing(api, scenario(api))
