"""The sidecar's own Kubernetes client (kgroup.apiclient, aiohttp) and its watches
(kgroup_sidecar.kube) on the real API server, at the edges a client library would
otherwise cover: a watch whose resourceVersion is gone (410, re-list), a watch broken by
an API server restart, a stale conditional write (409), a rotated service-account token,
the in-cluster configuration, a session of member-Lease writes apart from the rest, a
watch line longer than aiohttp's own line limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client

from kgroup import kube_watch
from kgroup.apiclient import (
    LEASES,
    ApiClient,
    ApiError,
    Resource,
    in_cluster_config,
    kubeconfig_config,
)
from kgroup.core import watch_stream as ws
from kgroup.core.lease_codec import slim
from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.tokens import request_token
from kgroup_sidecar.kube import KubeAdapter
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.settings import Settings

pytestmark = pytest.mark.cluster
T = TypeVar("T")
GROUP = "cli"
REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def member_lease(name: str, holder: str = "pod-a") -> Obj:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "labels": {"kgroup.dev/group": GROUP,
                                                  "kgroup.dev/role": "member"}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 8}}


def partition_lease(partition: int) -> Obj:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"{GROUP}-partition-{partition}",
                         "labels": {"kgroup.dev/group": GROUP, "kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(partition)}},
            "spec": {"leaseDurationSeconds": 8}}


async def eventually(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def run(coro: Awaitable[T]) -> T:
    async def go() -> T:
        return await coro
    return asyncio.run(go())


class Watcher:
    """A KubeAdapter whose lists and events are written down."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.lists: list[tuple[str, list[str]]] = []
        self.events: list[tuple[str, str, str]] = []
        self.settings = Settings(group=GROUP, namespace=namespace, pod_name="pod-a",
                                 kubeconfig=str(cluster.kubeconfig))

    def adapter(self, *, watch_all_partitions: bool = False) -> KubeAdapter:
        return KubeAdapter(self.settings, loop=asyncio.get_running_loop(),
                           watch_all_partitions=watch_all_partitions,
                           on_list=lambda kind, items, scope: self.lists.append(
                               (kind, sorted(o["metadata"]["name"] for o in items))),
                           on_event=lambda kind, t, obj: self.events.append(
                               (kind, t, obj["metadata"]["name"])),
                           metrics=Metrics(process=False))

    def listed(self, kind: str) -> int:
        return sum(1 for k, _ in self.lists if k == kind)

    def saw(self, kind: str, type_: str, name: str) -> bool:
        return (kind, type_, name) in self.events


@pytest.fixture
def api(cluster: Cluster) -> Iterator[Callable[[], ApiClient]]:
    """A factory of admin clients made inside the test's loop."""
    yield lambda: ApiClient(kubeconfig_config(cluster.kubeconfig))


def compact_etcd(cluster: Cluster, revision: int) -> None:
    """Compact etcd's history up to ``revision`` (its JSON gateway, on loopback)."""
    url = f"http://127.0.0.1:{cluster.ports['etcd_client']}/v3/kv/compaction"
    body = json.dumps({"revision": str(revision), "physical": True}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"),
                                timeout=10) as resp:
        assert resp.status == 200


def test_a_stale_conditional_write_is_refused_with_409(
        api: Callable[[], ApiClient], namespace: str) -> None:
    async def go() -> None:
        c = api()
        try:
            made = await c.create(LEASES, namespace, member_lease("stale"), timeout=5)
            fresh = dict(made, spec=dict(made["spec"], holderIdentity="pod-b"))
            written = await c.replace(LEASES, namespace, fresh, timeout=5)
            assert written["metadata"]["resourceVersion"] != made["metadata"]["resourceVersion"]
            stale = dict(made, spec=dict(made["spec"], holderIdentity="pod-c"))
            with pytest.raises(ApiError) as refused:
                await c.replace(LEASES, namespace, stale, timeout=5)
            assert refused.value.status == 409 and refused.value.reason == "Conflict"
            with pytest.raises(ApiError) as not_that_one:  # delete with a stale precondition
                await c.delete(LEASES, namespace, "stale", timeout=5,
                               resource_version=made["metadata"]["resourceVersion"])
            assert not_that_one.value.status == 409
            got = await c.get(LEASES, namespace, "stale", timeout=5)
            assert got is not None and got["spec"]["holderIdentity"] == "pod-b"
            assert await c.delete(LEASES, namespace, "stale", timeout=5,
                                  resource_version=written["metadata"]["resourceVersion"])
            assert await c.get(LEASES, namespace, "stale", timeout=5) is None
            assert not await c.delete(LEASES, namespace, "stale", timeout=5)  # 404: gone
        finally:
            await c.close()

    run(go())


def test_a_write_built_from_a_slim_cached_lock_keeps_the_servers_managed_fields(
        api: Callable[[], ApiClient], namespace: str) -> None:
    """The caches keep Leases without ``metadata.managedFields`` (lease_codec.slim: half of
    a lock's JSON); a sidecar's PUT built from such a copy must neither be refused nor
    wipe what the server records of who wrote which field."""
    async def go() -> None:
        c = api()
        try:
            made = await c.create(LEASES, namespace, partition_lease(7), timeout=5)
            before = made["metadata"].get("managedFields") or []
            assert before, "the server records no managedFields: nothing to keep"
            cached = slim(made)
            assert "managedFields" not in cached["metadata"] and made["metadata"]["managedFields"]
            taken = await c.replace(LEASES, namespace, dict(
                cached, spec=dict(cached["spec"], holderIdentity="pod-a")), timeout=5)
            after = taken["metadata"].get("managedFields") or []
            assert taken["spec"]["holderIdentity"] == "pod-a"
            kept = [(e["manager"], e["operation"]) for e in before]
            assert all(k in [(e["manager"], e["operation"]) for e in after] for k in kept), (
                before, after)
            assert any("f:holderIdentity" in json.dumps(e.get("fieldsV1")) for e in after)
        finally:
            await c.close()

    run(go())


def test_the_adapters_writes_answer_as_the_logic_expects(
        cluster: Cluster, namespace: str) -> None:
    """A member-Lease write goes through the session client, a partition write through the
    shared one; a refusal is an ApiError whose status the runtime reads (status_of)."""
    async def go() -> None:
        w = Watcher(cluster, namespace)
        kube = w.adapter()
        try:
            made = await kube.create_lease(member_lease(f"{GROUP}-member-pod-a"), timeout=5)
            shared, own = kube._clients()
            assert own is not shared
            renewed = await kube.replace_lease(
                dict(made, spec=dict(made["spec"], leaseDurationSeconds=9)), timeout=5)
            with pytest.raises(ApiError) as refused:  # the old resourceVersion
                await kube.replace_lease(
                    dict(made, spec=dict(made["spec"], leaseDurationSeconds=10)), timeout=5)
            from kgroup_sidecar.kube import status_of
            assert status_of(refused.value) == 409
            assert status_of(TimeoutError()) is None
            await kube.delete_lease(made["metadata"]["name"], timeout=5, session=True,
                                    resource_version=renewed["metadata"]["resourceVersion"])
            assert await kube.get_lease(made["metadata"]["name"], timeout=5) is None
        finally:
            await kube.aclose()

    run(go())


def test_a_watch_whose_version_is_gone_relists_and_a_restart_rewatches(
        cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
        api: Callable[[], ApiClient]) -> None:
    """The API server restarts while the adapter watches (the group's partition Leases,
    whole); meanwhile the etcd history its watch stood on was compacted, so its resumed
    watch gets 410 Gone: it lists again and then sees new events."""
    async def go() -> None:
        w = Watcher(cluster, namespace)
        adapter = w.adapter(watch_all_partitions=True)
        c = api()
        try:
            adapter.start()
            await eventually("the partition Leases listed", lambda: w.listed("partition") == 1)
            await c.create(LEASES, namespace, partition_lease(0), timeout=5)
            await eventually("an event",
                             lambda: w.saw("partition", "ADDED", f"{GROUP}-partition-0"))
            # writes the adapter does not watch move etcd's revision past its watch...
            for i in range(3):
                other = await c.create(LEASES, namespace, {
                    "metadata": {"name": f"unrelated-{i}"}, "spec": {}}, timeout=5)
            await asyncio.to_thread(compact_etcd, cluster,
                                    int(other["metadata"]["resourceVersion"]))
            # ...and the restart drops the API server's own history
            await asyncio.to_thread(cluster.restart_apiserver)
            await eventually("a re-list after 410 Gone", lambda: w.listed("partition") >= 2)
            created = await c.create(LEASES, namespace, partition_lease(1), timeout=5)
            await eventually("an event after the restart",
                             lambda: w.saw("partition", "ADDED", f"{GROUP}-partition-1"))
            assert ("partition", [f"{GROUP}-partition-0"]) in w.lists[1:]
            assert created["metadata"]["name"] == f"{GROUP}-partition-1"
            with pytest.raises(ws.Gone):  # the server's own answer to that version
                await kube_watch.stream(
                    lambda params, timeout: c.open_watch(LEASES, namespace, params,
                                                         timeout=timeout),
                    ws.Resume("2"), lambda kind, obj: None, loads=json.loads, seconds=2)
        finally:
            await adapter.aclose()
            await c.close()

    run(go())


def _service_account_dir(tmp: Path, cluster: Cluster, token: str) -> Path:
    """A projected service-account volume as the kubelet writes it: ..data -> a dated
    directory, token and ca.crt through it."""
    root = tmp / "serviceaccount"
    root.mkdir()
    _project(root, token, cluster.pki.ca_cert.read_bytes(), "v1")
    for name in ("token", "ca.crt"):
        (root / name).symlink_to(f"..data/{name}")
    return root


def _project(root: Path, token: str, ca: bytes, version: str) -> None:
    data = root / f"..{version}"
    data.mkdir()
    (data / "token").write_text(token)
    (data / "ca.crt").write_bytes(ca)
    link = root / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, root / "..data")  # the atomic swap


def test_in_cluster_config_reads_a_rotated_token_at_once(
        cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(kube)
    for sa in ("first", "second"):
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=sa)))
    first = request_token(cluster, namespace=namespace, service_account="first")
    second = request_token(cluster, namespace=namespace, service_account="second")
    account = _service_account_dir(tmp_path, cluster, first)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(cluster.ports["apiserver"])}

    async def whoami(c: ApiClient) -> str:
        review = await c.request("POST", REVIEWS, timeout=5, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        return str(review["status"]["userInfo"]["username"])

    async def go() -> None:
        config = in_cluster_config(env, account)
        assert config.server == f"https://127.0.0.1:{cluster.ports['apiserver']}"
        c = ApiClient(config)
        try:
            assert await whoami(c) == f"system:serviceaccount:{namespace}:first"
            _project(account, second, cluster.pki.ca_cert.read_bytes(), "v2")  # rotated
            assert await whoami(c) == f"system:serviceaccount:{namespace}:second"
            _project(account, "not-a-token", cluster.pki.ca_cert.read_bytes(), "v3")
            with pytest.raises(ApiError) as refused:
                await whoami(c)
            assert refused.value.status == 401
            assert config.token_file is not None and config.token_file.reads == 3
        finally:
            await c.close()

    run(go())


def test_in_cluster_config_needs_the_service_host(tmp_path: Path) -> None:
    from kgroup.apiclient import ConfigError
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_config({}, tmp_path)


def test_a_watch_line_longer_than_aiohttps_line_cap_arrives_whole(
        api: Callable[[], ApiClient], namespace: str) -> None:
    """aiohttp's readline refuses a line longer than twice its read buffer (512 KiB in
    3.14, 128 KiB before); one watch event is one line, and an object may be 1.5 MiB (a
    ConsumerGroup with a large status). A ConfigMap of 700 kB stands in for it."""
    configmaps = Resource("", "v1", "configmaps")

    class Found(Exception):
        pass

    def deliver(kind: str, obj: Obj) -> None:
        if obj["metadata"]["name"] == "big":
            assert len(obj["data"]["padding"]) == 700_000
            raise Found

    async def go() -> None:
        c = api()
        try:
            listed = await c.list(configmaps, namespace, timeout=5)
            await c.create(configmaps, namespace, {
                "metadata": {"name": "big"}, "data": {"padding": "x" * 700_000}}, timeout=10)
            with pytest.raises(Found):  # else the stream ended at its timeout without it
                await kube_watch.stream(
                    lambda params, timeout: c.open_watch(configmaps, namespace, params,
                                                         timeout=timeout),
                    ws.Resume(listed["metadata"]["resourceVersion"]), deliver,
                    loads=json.loads, seconds=5)
        finally:
            await c.close()

    run(go())


def test_resources_have_the_api_servers_paths() -> None:
    assert Resource("", "v1", "events").path("ns", "e.1") == "/api/v1/namespaces/ns/events/e.1"
    assert LEASES.path("ns") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases"


def test_a_scope_of_the_largest_selected_size_lists_and_watches_only_its_partitions(
        cluster: Cluster, namespace: str, api: Callable[[], ApiClient]) -> None:
    """A member interested in MAX_SELECTED_PARTITIONS partitions still selects them by
    label (a selector of about 9 KB): the real API server lists and watches exactly those."""
    from kgroup.core.member.watch_scope import MAX_SELECTED_PARTITIONS as MAX

    async def go() -> None:
        c = api()
        w = Watcher(cluster, namespace)
        kube = w.adapter()
        names = {p: f"{GROUP}-partition-{p}" for p in (0, MAX - 1, MAX, MAX + 7)}
        try:
            for p in names:
                await c.create(LEASES, namespace, partition_lease(p), timeout=5)
            scope = frozenset(range(MAX))
            kube.set_partition_scope(scope)
            kube.start()
            await eventually("the scoped list", lambda: w.listed("partition") >= 1)
            assert ("partition", sorted([names[0], names[MAX - 1]])) in w.lists
            for p in (MAX + 7, MAX - 1):  # out of scope first: its event must not come
                got = await c.get(LEASES, namespace, names[p], timeout=5)
                assert got is not None
                await c.replace(LEASES, namespace, dict(
                    got, spec=dict(got["spec"], holderIdentity="pod-z")), timeout=5)
            await eventually("the in-scope event",
                             lambda: w.saw("partition", "MODIFIED", names[MAX - 1]))
            assert not w.saw("partition", "MODIFIED", names[MAX + 7])
        finally:
            await kube.aclose()
            await c.close()

    run(go())


def test_a_watch_keeps_no_reference_to_what_it_listed(
        cluster: Cluster, namespace: str, api: Callable[[], ApiClient]) -> None:
    """Once a list is handed to ``on_list`` the watch that follows holds none of its
    objects: the handler decides what stays (a member's 1,000 listed locks kept by the
    watch's frame were about 5 MB of its memory, for as long as the watch ran)."""
    import gc

    async def go() -> None:
        c = api()
        kept: list[list[Obj]] = []
        kube = KubeAdapter(Settings(group=GROUP, namespace=namespace, pod_name="pod-a",
                                    kubeconfig=str(cluster.kubeconfig)),
                           loop=asyncio.get_running_loop(), watch_all_partitions=True,
                           on_list=lambda kind, items, scope: kept.append(items),
                           on_event=lambda kind, t, obj: None, metrics=Metrics(process=False))
        try:
            for p in range(3):
                await c.create(LEASES, namespace, partition_lease(p), timeout=5)
            kube.start()
            await eventually("the partitions listed", lambda: any(len(k) == 3 for k in kept))
            await asyncio.sleep(0.5)  # the watch is open and waiting
            listed = next(k for k in kept if len(k) == 3)
            gc.collect()
            holders = [r for r in gc.get_referrers(listed[0]) if r is not listed]
            assert holders == [], f"the watch still holds a listed lock: {holders!r:.300}"
        finally:
            await kube.aclose()
            await c.close()

    run(go())


def test_a_list_in_pages_arrives_whole_and_slim_and_the_watch_follows_it(
        cluster: Cluster, namespace: str, api: Callable[[], ApiClient],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The partition list is read in pages (``LIST_PAGE``) and handed over once, whole,
    each object without ``managedFields``; the watch starts from the list's version, so
    a lock created after it arrives as an event and none listed arrives again."""
    from kgroup_sidecar import kube as kube_module
    monkeypatch.setattr(kube_module, "LIST_PAGE", 2)

    async def go() -> None:
        c = api()
        lists: list[list[Obj]] = []
        events: list[tuple[str, str]] = []

        def on_list(kind: str, items: list[Obj], scope: object) -> None:
            if kind == "partition":
                lists.append(items)

        def on_event(kind: str, type_: str, obj: Obj) -> None:
            if kind == "partition":
                events.append((type_, obj["metadata"]["name"]))

        kube = KubeAdapter(Settings(group=GROUP, namespace=namespace, pod_name="pod-a",
                                    kubeconfig=str(cluster.kubeconfig)),
                           loop=asyncio.get_running_loop(), watch_all_partitions=True,
                           on_list=on_list, on_event=on_event, metrics=Metrics(process=False))
        try:
            for p in range(5):
                created = await c.create(LEASES, namespace, partition_lease(p), timeout=5)
            assert created["metadata"].get("managedFields")  # the server sends them
            kube.start()
            await eventually("the partitions listed", lambda: len(lists) == 1)
            listed = lists[0]
            assert sorted(o["metadata"]["name"] for o in listed) == [
                f"{GROUP}-partition-{p}" for p in range(5)]
            assert not any("managedFields" in o["metadata"] for o in listed)
            await c.create(LEASES, namespace, partition_lease(5), timeout=5)
            await eventually("the new lock's event",
                             lambda: ("ADDED", f"{GROUP}-partition-5") in events)
            assert events == [("ADDED", f"{GROUP}-partition-5")]
        finally:
            await kube.aclose()
            await c.close()

    run(go())
