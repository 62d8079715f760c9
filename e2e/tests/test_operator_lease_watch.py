"""The operator's per-group Lease watch (kgroup_operator.lease_watch: aiohttp on the
operator's loop) against the real API server: it lists and then sees its own group's
Leases only; it survives an API server restart whose etcd history was compacted (410
Gone: it lists again); it pauses between reads as told and a hurry ends the pause; and,
through GroupLoops, a group created while the operator runs
gets its Leases into the cache and a deleted one stops its watch and forgets them."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from operator_harness import operator_api

from kgroup import constants as C
from kgroup.apiclient import kubeconfig_config
from kgroup.core.objects import Obj
from kgroup.core.operator.wakeup import BUSY_READ_PAUSE, QUIET_AFTER, QUIET_READ_PAUSE
from kgroup_devcluster.cluster import Cluster
from kgroup_operator.controller import GroupController
from kgroup_operator.groups import GroupLoops
from kgroup_operator.kube import Kube
from kgroup_operator.lease_watch import Http, LeaseWatch
from kgroup_operator.settings import OperatorSettings

pytestmark = pytest.mark.cluster


def member_lease(group: str, member: str, session: str = "s1") -> Obj:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": C.member_lease_name(group, member),
                         "labels": {C.LABEL_GROUP: group, C.LABEL_ROLE: C.ROLE_MEMBER,
                                    C.LABEL_MEMBER: member},
                         "annotations": {C.ANNOTATION_SESSION: session}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 8}}


async def eventually(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def compact_etcd(cluster: Cluster, revision: int) -> None:
    url = f"http://127.0.0.1:{cluster.ports['etcd_client']}/v3/kv/compaction"
    body = json.dumps({"revision": str(revision), "physical": True}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"),
                                timeout=10) as resp:
        assert resp.status == 200


class Seen:
    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def on_list(self, items: list[Obj]) -> None:
        self.lists.append(sorted(o["metadata"]["name"] for o in items))

    def on_event(self, kind: str, obj: Obj) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


def test_the_watch_sees_its_group_only_and_lists_again_after_410_and_a_restart(
        cluster: Cluster, kube: client.ApiClient, namespace: str) -> None:
    coord: Any = client.CoordinationV1Api(kube)
    coord.create_namespaced_lease(namespace, member_lease("g", "a"))
    a, b = C.member_lease_name("g", "a"), C.member_lease_name("g", "b")

    async def go() -> None:
        http = Http(kubeconfig_config(cluster.kubeconfig))
        seen = Seen()
        w = LeaseWatch(http, namespace, "g", on_list=seen.on_list, on_event=seen.on_event)
        try:
            w.start()
            await eventually("the first listing", lambda: seen.lists == [[a]])
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("other", "x"))  # another group's
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("g", "b"))
            await asyncio.to_thread(coord.patch_namespaced_lease, a, namespace, {
                "metadata": {"annotations": {C.ANNOTATION_SESSION: "s2"}}})
            await asyncio.to_thread(coord.delete_namespaced_lease, b, namespace)
            await eventually("three events", lambda: len(seen.events) >= 3)
            await asyncio.sleep(0.5)
            assert seen.events == [("ADDED", b), ("MODIFIED", a), ("DELETED", b)]
            # writes the watch does not see move etcd's revision past its version; the
            # compaction and the restart leave it nothing to resume from: 410, a list
            other = None
            for i in range(3):
                other = await asyncio.to_thread(coord.create_namespaced_lease, namespace, {
                    "metadata": {"name": f"unrelated-{i}"}, "spec": {}})
            assert other is not None
            await asyncio.to_thread(compact_etcd, cluster,
                                    int(other.metadata.resource_version))
            await asyncio.to_thread(cluster.restart_apiserver)
            await eventually("a listing after 410 Gone", lambda: len(seen.lists) >= 2)
            assert seen.lists[-1] == [a] and w.alive()
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("g", "c"))
            await eventually("an event after the restart", lambda: (
                "ADDED", C.member_lease_name("g", "c")) in seen.events)
            assert all(name.startswith("g-") for _, name in seen.events)
            assert w.alive()
        finally:
            w.stop()
            await w.wait_stopped()
            await http.close()
        assert w.alive()  # stopped on purpose: not a failure

    asyncio.run(go())


def test_the_watch_pauses_between_reads_as_told_and_a_hurry_ends_the_pause(
        cluster: Cluster, kube: client.ApiClient, namespace: str) -> None:
    """The pace of the reads (``pause``: ``GroupController.read_pause``): after a read the
    watch leaves the stream alone for that long, and a poke of the group (``hurry``) ends
    the pause at once."""
    coord: Any = client.CoordinationV1Api(kube)
    names = [C.member_lease_name("g", m) for m in ("a", "b", "c")]

    async def go() -> None:
        http = Http(kubeconfig_config(cluster.kubeconfig))
        seen = Seen()
        pace = [60.0]  # quiet; then, as a poke makes the group busy, fast
        w = LeaseWatch(http, namespace, "g", on_list=seen.on_list, on_event=seen.on_event,
                       pause=lambda: pace[0])
        try:
            w.start()
            await eventually("the first listing", lambda: seen.lists == [[]])
            # the watch request is open: its response (over TLS) is there to read
            await eventually("the watch open", lambda: w.tls_held_bytes() is not None)
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("g", "a"))
            await eventually("the first event", lambda: len(seen.events) == 1, timeout=10)
            raw = await asyncio.to_thread(lambda: coord.read_namespaced_lease(
                names[0], namespace, _preload_content=False).data)
            one_event_bytes = len(raw) + len('{"type":"ADDED","object":}')
            reads = w.reads
            for m in ("b", "c"):  # arrive while the watch pauses
                await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                        member_lease("g", m))
            await asyncio.sleep(3.0)
            assert seen.events == [("ADDED", names[0])] and w.reads == reads, \
                "the watch read during its pause"
            # and the TLS layer stopped reading the socket after the first record: the
            # second event waits in the kernel (without the read-buffer limits both
            # would be read, one wake-up each, and held undecrypted)
            held = w.tls_held_bytes()
            assert held is not None and 0 < held < 1.5 * one_event_bytes, \
                f"{held} bytes held by the TLS layer during the pause; one event is " \
                f"about {one_event_bytes}"
            pace[0] = 0.1
            w.hurry()
            await eventually("the paused events", lambda: len(seen.events) == 3, timeout=5)
            assert seen.events == [("ADDED", n) for n in names]
        finally:
            w.stop()
            await w.wait_stopped()
            await http.close()

    asyncio.run(go())


def test_a_group_created_and_deleted_while_running_starts_and_stops_its_watch(
        cluster: Cluster, kube: client.ApiClient, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GroupLoops' own wiring (the group loop's passes left out: only the cache is
    looked at): a group seen lists its Leases into the cache, its events follow, its
    watch reads at the group's pace and a poke hurries it; deleted,
    its watch stops and what it wrote later never reaches the cache."""
    async def no_pass(self: GroupController) -> float | None:
        return None

    monkeypatch.setattr(GroupController, "reconcile", no_pass)
    coord: Any = client.CoordinationV1Api(kube)
    coord.create_namespaced_lease(namespace, member_lease("late", "a"))
    key = (namespace, "late")
    body = {"metadata": {"name": "late", "namespace": namespace, "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"app": "late"}}, "partitions": 2}}

    async def go() -> None:
        rt = GroupLoops(kube=Kube(operator_api(cluster), identity="test"),
                        settings=OperatorSettings())
        try:
            rt.group_seen(key, body)
            c = rt.controllers[key]
            await eventually("the group's Leases listed", lambda: c.leases_listed)
            assert set(rt.cache.group(key).members) == {"a"}
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("late", "b"))
            await eventually("b in the cache", lambda: "b" in rt.cache.group(key).members)
            w = rt.watches[key]
            # the watch's pace is its group's: slow once nothing happened in it for
            # QUIET_AFTER; a poke (a pod of the group changed) makes it fast and ends the
            # pause under way
            c.active_at = c.clock() - QUIET_AFTER - 1
            assert w.pause() == QUIET_READ_PAUSE and not w.hurried
            rt.poke_namespace(namespace)
            assert w.pause() == BUSY_READ_PAUSE and w.hurried
            assert rt.problems() == []
            await rt.group_deleted(key)
            await w.wait_stopped()
            assert w.alive() and key not in rt.watches and key not in rt.cache.groups
            await asyncio.to_thread(coord.create_namespaced_lease, namespace,
                                    member_lease("late", "c"))
            await asyncio.sleep(1.0)
            assert key not in rt.cache.groups  # a deleted group's Leases are not kept
            rt.group_seen(key, body)  # created again: listed again, whole
            c = rt.controllers[key]
            await eventually("listed again", lambda: c.leases_listed)
            assert set(rt.cache.group(key).members) == {"a", "b", "c"}
        finally:
            await rt.stop()
            await rt.kube.api.close()

    asyncio.run(go())
