"""The sidecar's Events on its own pod, posted with the pod's own bound token under the
chart's worker Role and admission policy, on the real API server.

A real ``kgroup-sidecar`` runs as pod ``w-0`` (service account kgroup-worker, a token bound
to that Pod object, KGROUP_POD_UID from it); a scripted target gives it two partitions;
SIGSTOP for longer than its lease makes it fenced when it resumes, and ``kubectl describe
pod w-0`` then shows the ``Fenced`` Event. The same token posting one Event twice leaves
one object with count 2 (create, then patch), and cannot delete Events (the Role is
create/patch only).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kgroup.apiclient import ApiClient, kubeconfig_config
from kgroup.client import SidecarClient, SidecarError
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import api_client_from_kubeconfig, pod_kubeconfig
from kgroup_sidecar.events import EventPoster, Pod
from kgroup_testing.sidecar_harness import ScriptedTarget, SidecarProcess

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
WORKER_SA = "kgroup-worker"
GROUP = "orders"


@dataclass
class Worker:
    namespace: str
    pod: str
    uid: str
    kubeconfig: Path


@pytest.fixture
def worker(cluster: Cluster, kube: client.ApiClient, crd: list[str],
           tmp_path: Path) -> Iterator[Worker]:
    """A namespace with the chart's worker RBAC and admission policy, and pod w-0."""
    core = client.CoreV1Api(kube)
    ns = f"t-events-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=ns, labels={"kgroup.dev/e2e": "true"})))
    out = cluster.helm(
        "template", f"ev-{secrets.token_hex(3)}", str(CHART), "--namespace", ns,
        "--kube-version", "1.35.4", "--set", "operator.enabled=false",
        "--set", "crds.enabled=false", "--set", f"workerRbac.namespaces={{{ns}}}",
        "--set", f"admissionPolicy.namespaces={{{ns}}}", check=False)
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    try:
        applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs),
                                  check=False)
        assert applied.returncode == 0, applied.stderr
        wait_for("the worker service account", lambda: WORKER_SA in {
            sa.metadata.name for sa in core.list_namespaced_service_account(ns).items
            if sa.metadata is not None}, timeout=30)
        pod: Any = core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name="w-0", labels={"app": GROUP}),
            spec=client.V1PodSpec(
                service_account_name=WORKER_SA,
                node_selector={"kgroup.dev/no-such-node": "true"},  # never run by anything
                containers=[client.V1Container(name="app", image="registry.invalid/app")])))
        uid = str(pod.metadata.uid)
        path = pod_kubeconfig(cluster, namespace=ns, service_account=WORKER_SA,
                              pod_name="w-0", pod_uid=uid, path=tmp_path / "w-0.kubeconfig")
        yield Worker(ns, "w-0", uid, path)
    finally:
        for o in objs:
            if o["kind"].startswith("ValidatingAdmissionPolicy"):
                cluster.kubectl("delete", "--ignore-not-found", o["kind"].lower(),
                                o["metadata"]["name"], check=False)
        core.delete_namespace(ns, propagation_policy="Background")


def events_of(kube: client.ApiClient, namespace: str, pod: str) -> list[Any]:
    found: Any = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},involvedObject.kind=Pod")
    return list(found.items)


def test_a_fenced_sidecar_posts_an_event_that_describe_pod_shows(
        cluster: Cluster, kube: client.ApiClient, worker: Worker, tmp_path: Path) -> None:
    target = ScriptedTarget(kube, worker.namespace, GROUP)
    target.create(partitions=2, duration=3, renew=1)
    target.pod_uids[worker.pod] = worker.uid
    epoch = target.assign({worker.pod: [0, 1]})
    sc = SidecarProcess(pod=worker.pod, group=GROUP, namespace=worker.namespace,
                        kubeconfig=str(worker.kubeconfig), workdir=tmp_path,
                        env={"KGROUP_POD_UID": worker.uid}).start()
    try:
        app = SidecarClient(sc.url)

        def holds_both() -> bool:
            try:
                a = app.assignment()
            except SidecarError:  # not listening yet
                return False
            return len(a.partitions) == 2 and a.acked_epoch == epoch

        wait_for("w-0 holds both partitions", holds_both, timeout=60)
        sc.signal(signal.SIGSTOP)
        try:
            time.sleep(5)  # longer than its 3 s lease: the session runs out while stopped
        finally:
            sc.signal(signal.SIGCONT)
        fenced = wait_for("a Fenced Event on w-0", lambda: [
            e for e in events_of(kube, worker.namespace, worker.pod) if e.reason == "Fenced"],
            timeout=30)
        assert fenced[0].type == "Warning"
        assert fenced[0].involved_object.uid == worker.uid
        assert fenced[0].source.component == "kgroup-sidecar"
        described = cluster.kubectl("describe", "pod", worker.pod, "-n", worker.namespace)
        print(described.stdout[-800:])
        assert "Fenced" in described.stdout and "kgroup-sidecar" in described.stdout
    finally:
        sc.stop()
        log = sc.log_file.read_text() if sc.log_file.exists() else ""
        assert "could not post Event" not in log, log[-2000:]


def test_a_partition_the_app_does_not_release_in_time_posts_handoff_timed_out(
        kube: client.ApiClient, worker: Worker, tmp_path: Path) -> None:
    target = ScriptedTarget(kube, worker.namespace, GROUP)
    target.create(partitions=1, duration=6, renew=2, drain=1)
    target.pod_uids[worker.pod] = worker.uid
    epoch = target.assign({worker.pod: [0]})
    sc = SidecarProcess(pod=worker.pod, group=GROUP, namespace=worker.namespace,
                        kubeconfig=str(worker.kubeconfig), workdir=tmp_path,
                        env={"KGROUP_POD_UID": worker.uid}).start()
    try:
        app = SidecarClient(sc.url)

        def acked(n: int) -> bool:
            try:
                a = app.assignment()
            except SidecarError:  # not listening yet
                return False
            return len(a.partitions) == n and a.acked_epoch == epoch

        wait_for("w-0 holds partition 0", lambda: acked(1), timeout=60)
        epoch = target.assign({worker.pod: []})  # revoke; the app never releases it
        timed_out = wait_for("a HandoffTimedOut Event on w-0", lambda: [
            e for e in events_of(kube, worker.namespace, worker.pod)
            if e.reason == "HandoffTimedOut"], timeout=30)
        assert "partition 0" in timed_out[0].message
        assert target.holder(0)[0] is None  # released all the same
    finally:
        sc.stop()


def test_the_pod_token_creates_and_patches_events_but_cannot_delete_them(
        kube: client.ApiClient, worker: Worker) -> None:
    api = api_client_from_kubeconfig(worker.kubeconfig)
    try:
        async def twice() -> tuple[str | None, str | None]:
            # the sidecar's own client with the pod's token, as the sidecar posts them
            own = ApiClient(kubeconfig_config(worker.kubeconfig))
            try:
                poster = EventPoster(own, Pod(worker.namespace, worker.pod, worker.uid))
                first = await poster.post("Warning", "HandoffTimedOut", "partition 3: test")
                second = await poster.post("Warning", "HandoffTimedOut", "partition 3: test")
            finally:
                await own.close()
            return first, second

        first, second = asyncio.run(twice())
        assert first is not None and first == second
        (event,) = [e for e in events_of(kube, worker.namespace, worker.pod)
                    if e.reason == "HandoffTimedOut"]
        assert event.count == 2
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).delete_namespaced_event(first, worker.namespace)
        assert refused.value.status == 403
    finally:
        api.close()  # type: ignore[no-untyped-call]
