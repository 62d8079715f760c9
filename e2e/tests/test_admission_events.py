"""A worker posts Events only about its own pod: a table of (request, expected answer) on
the real API server, with the chart's RBAC and policies as installed.

The caller is pod-a's pod-bound token (service account kgroup-worker); pod-b is another
member of its namespace. Each row is one request; ``allowed`` rows are stored (the test's
namespace is deleted afterwards), refused ones name the rule in their message.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes import client
from test_admission_privilege import WORKER_SA, _render

from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import pod_api_client, token_pod

pytestmark = pytest.mark.cluster


@dataclass
class Env:
    ns: str
    admin: Any  # CoreV1Api as cluster admin
    worker: Any  # CoreV1Api with pod-a's pod-bound token
    worker_events: Any  # EventsV1Api with pod-a's token
    pod_a: Any
    pod_b: Any


@pytest.fixture(scope="module")
def env(cluster: Cluster, kube: client.ApiClient, crd: list[str],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    core = client.CoreV1Api(kube)
    ns = f"t-events-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    objs = _render(cluster, ns, f"ev-{secrets.token_hex(3)}")
    assert any(o["metadata"]["name"].endswith("-worker-events") for o in objs)
    api = None
    try:
        out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs), check=False)
        assert out.returncode == 0, out.stderr
        pod_a = token_pod(core, ns, "pod-a", WORKER_SA)
        pod_b = token_pod(core, ns, "pod-b", WORKER_SA)
        api = pod_api_client(cluster, pod_a, tmp_path_factory.mktemp("events") / "a.kubeconfig")
        e = Env(ns, core, client.CoreV1Api(api), client.EventsV1Api(api), pod_a, pod_b)

        def enforced() -> bool:
            try:
                e.worker.create_namespaced_event(ns, event(e, "Pod", "pod-b", "x"),
                                                 dry_run="All")
            except client.ApiException as exc:
                return "ValidatingAdmissionPolicy" in str(exc.body)
            return False

        wait_for("the events policy", enforced, timeout=60)
        yield e
    finally:
        if api is not None:
            api.close()  # type: ignore[no-untyped-call]
        for o in objs:
            if "namespace" not in o["metadata"] and o["kind"] != "ServiceAccount":
                cluster.kubectl("delete", "--ignore-not-found", o["kind"].lower(),
                                o["metadata"]["name"], check=False)
        core.delete_namespace(ns, propagation_policy="Background")


def event(env: Env, kind: str, name: str, uid: str | None, *, api_version: str = "v1",
          namespace: str | None = None, related: dict[str, Any] | None = None) -> Any:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name}
    if namespace != "":
        involved["namespace"] = namespace or env.ns
    if uid:
        involved["uid"] = uid
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": env.ns},
        "involvedObject": involved, "type": "Warning", "reason": "PartitionStalled",
        "message": "row", "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": "kgroup-sidecar"}}
    if related:
        body["related"] = related
    return body


def own(env: Env) -> Any:
    return event(env, "Pod", "pod-a", env.pod_a.metadata.uid)


def create(body: Callable[[Env], Any]) -> Callable[[Env], object]:
    return lambda env: env.worker.create_namespaced_event(env.ns, body(env))


def patch_count_of(body: Callable[[Env], Any]) -> Callable[[Env], object]:
    """The sidecar's aggregation: an existing Event's count and lastTimestamp patched."""
    def call(env: Env) -> object:
        made: Any = env.admin.create_namespaced_event(env.ns, body(env))
        return env.worker.patch_namespaced_event(made.metadata.name, env.ns,
                                                 {"count": 2, "lastTimestamp": made.last_timestamp})
    return call


def events_v1_about(kind: str, name: str, uid: Callable[[Env], str]) -> Callable[[Env], object]:
    def call(env: Env) -> object:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return env.worker_events.create_namespaced_event(env.ns, {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": env.ns},
            "eventTime": now, "reportingController": "kgroup.dev/sidecar",
            "reportingInstance": "pod-a", "action": "Stall", "reason": "PartitionStalled",
            "type": "Warning", "note": "row",
            "regarding": {"apiVersion": "v1", "kind": kind, "name": name, "namespace": env.ns,
                          "uid": uid(env)}})
    return call


OWN_POD = "allowed"
NOT_OWN = "may post Events only about its own pod (Pod pod-a, uid "
RBAC = "RBAC"

# (row, request, expected: "allowed", RBAC, or a piece of the policy's message)
ROWS: list[tuple[str, Callable[[Env], object], str]] = [
    ("its own pod, name and uid", create(own), OWN_POD),
    ("its own pod's count patched (aggregation)", patch_count_of(own), OWN_POD),
    ("another pod of its namespace",
     create(lambda e: event(e, "Pod", "pod-b", e.pod_b.metadata.uid)), NOT_OWN),
    ("its own pod's name with another uid (a pod re-created under the name)",
     create(lambda e: event(e, "Pod", "pod-a", "00000000-0000-0000-0000-000000000000")),
     "this Event is about Pod pod-a (uid 00000000-0000-0000-0000-000000000000)"),
    ("its own pod's name without a uid", create(lambda e: event(e, "Pod", "pod-a", None)),
     "this Event is about Pod pod-a"),
    ("the ConsumerGroup",
     create(lambda e: event(e, "ConsumerGroup", "g", None, api_version="kgroup.dev/v1alpha1")),
     "this Event is about ConsumerGroup g"),
    ("a node", create(lambda e: event(e, "Node", "kwok-node-0", None)),
     "this Event is about Node kwok-node-0"),
    ("its own pod with another pod as related object",
     create(lambda e: event(e, "Pod", "pod-a", e.pod_a.metadata.uid, related={
         "apiVersion": "v1", "kind": "Pod", "name": "pod-b", "namespace": e.ns})),
     "names no related object"),
    ("another pod's Event, its count patched",
     patch_count_of(lambda e: event(e, "Pod", "pod-b", e.pod_b.metadata.uid)), NOT_OWN),
    ("events.k8s.io/v1 about another pod",
     events_v1_about("Pod", "pod-b", lambda e: str(e.pod_b.metadata.uid)), RBAC),
]


@pytest.mark.parametrize(("row", "request_", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_a_worker_posts_events_only_about_its_own_pod(
        env: Env, row: str, request_: Callable[[Env], object], expected: str) -> None:
    t0 = time.monotonic()
    try:
        request_(env)
        answer: tuple[int, str] = (201, "")
    except client.ApiException as exc:
        answer = (exc.status, str(exc.body))
    ms = (time.monotonic() - t0) * 1000
    print(f"{row}: {answer[0]} in {ms:.0f} ms: {answer[1][:260]}")
    if expected == OWN_POD:
        assert answer[0] in (200, 201), answer
    elif expected == RBAC:
        assert answer[0] == 403 and "cannot create resource" in answer[1], answer
    else:
        assert answer[0] == 403, answer
        assert "ValidatingAdmissionPolicy" in answer[1] and "-worker-events" in answer[1]
        assert expected in answer[1], answer
