"""The local control plane is a real cluster: controllers, scheduler, kwok, optimistic
concurrency, CEL validation, bound service-account tokens and RBAC all do their job.

Each test states one behaviour kgroup relies on; if one fails, the cluster (not kgroup)
is broken.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import (
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    api_client_from_kubeconfig,
    pod_kubeconfig,
    whoami,
)

pytestmark = pytest.mark.cluster

APP = "smoke"


def _create_deployment(kube: client.ApiClient, namespace: str, replicas: int = 3) -> None:
    labels = {"app": APP}
    body = client.V1Deployment(
        metadata=client.V1ObjectMeta(name=APP),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector={"type": "kwok"},
                    containers=[client.V1Container(name="main", image="example.invalid/smoke:1")],
                ),
            ),
        ),
    )
    client.AppsV1Api(kube).create_namespaced_deployment(namespace, body)


def _ready_pods(kube: client.ApiClient, namespace: str) -> dict[str, str]:
    """Pods of the deployment that are Running, Ready and not being deleted: name -> node."""
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"app={APP}")
    ready: dict[str, str] = {}
    pod: Any
    for pod in pods.items:
        if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
            continue
        conditions = pod.status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            ready[pod.metadata.name] = pod.spec.node_name
    return ready


def _three_ready(kube: client.ApiClient, namespace: str,
                 without: str = "") -> dict[str, str]:
    """The ready pods when there are exactly 3 and `without` is not one of them, else {}."""
    ready = _ready_pods(kube, namespace)
    return ready if len(ready) == 3 and without not in ready else {}


def _all_pod_names(kube: client.ApiClient, namespace: str) -> set[str]:
    pods: Any = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"app={APP}")
    return {str(p.metadata.name) for p in pods.items}


def test_deployment_of_three_gets_three_running_ready_pods_on_fake_nodes(
    kube: client.ApiClient, namespace: str
) -> None:
    _create_deployment(kube, namespace)

    ready = wait_for("3 ready pods", lambda: _three_ready(kube, namespace))

    assert len(ready) == 3
    # on fake nodes: the three standing ones, or those a benchmark added to this dev
    # cluster for its 1,000 pods (Cluster.ensure_pod_capacity: added, never removed)
    fake: Any = client.CoreV1Api(kube).list_node(label_selector="type=kwok")
    fake_names = {str(n.metadata.name) for n in fake.items}
    assert {"kwok-node-0", "kwok-node-1", "kwok-node-2"} <= fake_names
    assert set(ready.values()) <= fake_names
    apps = client.AppsV1Api(kube)

    def deployment_ready() -> bool:
        deployment: Any = apps.read_namespaced_deployment_status(APP, namespace)
        return bool(deployment.status.ready_replicas == 3)

    wait_for("the Deployment's status to count 3 ready", deployment_ready)


def test_a_deleted_pod_is_replaced_by_the_replicaset(
    kube: client.ApiClient, namespace: str
) -> None:
    _create_deployment(kube, namespace)
    before = wait_for("3 ready pods", lambda: _three_ready(kube, namespace))
    victim = sorted(before)[0]

    client.CoreV1Api(kube).delete_namespaced_pod(victim, namespace)

    after = wait_for("3 ready pods without the deleted one",
                     lambda: _three_ready(kube, namespace, without=victim))
    assert victim not in after
    assert len(set(after) - set(before)) == 1
    # kwok plays the kubelet's part of a deletion too: the pod object goes away.
    wait_for(f"pod {victim} to be gone", lambda: victim not in _all_pod_names(kube, namespace))


def test_two_updates_with_the_same_resource_version_one_wins_one_conflicts(
    cluster: Cluster, namespace: str
) -> None:
    from kgroup_devcluster.tokens import admin_api_client

    apis = [admin_api_client(cluster), admin_api_client(cluster)]
    try:
        coord = [client.CoordinationV1Api(a) for a in apis]
        coord[0].create_namespaced_lease(namespace, client.V1Lease(
            metadata=client.V1ObjectMeta(name="contended"), spec=client.V1LeaseSpec()))
        reads: list[Any] = [c.read_namespaced_lease("contended", namespace) for c in coord]
        assert reads[0].metadata.resource_version == reads[1].metadata.resource_version

        barrier = threading.Barrier(2)
        outcomes: dict[str, int] = {}

        def update(i: int) -> None:
            lease = reads[i]
            lease.spec.holder_identity = f"writer-{i}"
            barrier.wait()
            try:
                coord[i].replace_namespaced_lease("contended", namespace, lease)
                outcomes[f"writer-{i}"] = 200
            except client.ApiException as e:
                outcomes[f"writer-{i}"] = int(e.status)

        threads = [threading.Thread(target=update, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

        assert sorted(outcomes.values()) == [200, 409]
        winner = next(w for w, code in outcomes.items() if code == 200)
        final: Any = coord[0].read_namespaced_lease("contended", namespace)
        assert final.spec.holder_identity == winner
    finally:
        for a in apis:
            a.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def widget_crd(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A small CRD of our own with a CEL rule; a random group so sessions do not collide."""
    group = f"w{secrets.token_hex(3)}.smoke.kgroup.dev"
    name = f"widgets.{group}"
    manifest = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {name}}}
spec:
  group: {group}
  scope: Namespaced
  names: {{kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [min, max]
            properties:
              min: {{type: integer}}
              max: {{type: integer}}
            x-kubernetes-validations:
            - rule: "self.min <= self.max"
              message: "min must not exceed max"
"""
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
        yield group, name
    finally:
        cluster.kubectl("delete", "crd", name, "--wait=true", "--timeout=60s", check=False)


def test_a_crd_cel_rule_refuses_an_invalid_object_with_its_message(
    kube: client.ApiClient, namespace: str, widget_crd: tuple[str, str]
) -> None:
    group, _ = widget_crd
    custom = client.CustomObjectsApi(kube)

    def widget(name: str, lo: int, hi: int) -> dict[str, Any]:
        return {"apiVersion": f"{group}/v1", "kind": "Widget",
                "metadata": {"name": name}, "spec": {"min": lo, "max": hi}}

    def create_valid() -> bool:
        try:
            custom.create_namespaced_custom_object(group, "v1", namespace, "widgets",
                                                   widget("good", 1, 2))
        except client.ApiException as e:
            if e.status == 404:  # the new resource is not served by this path yet
                return False
            raise
        return True

    wait_for("the Widget resource to be served", create_valid)
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(group, "v1", namespace, "widgets",
                                               widget("bad", 5, 1))

    assert refused.value.status == 422
    assert "min must not exceed max" in str(refused.value.body)
    listed: Any = custom.list_namespaced_custom_object(group, "v1", namespace, "widgets")
    names = [o["metadata"]["name"] for o in listed["items"]]
    assert names == ["good"]


def _pod_with_service_account(kube: client.ApiClient, namespace: str) -> tuple[str, str]:
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="smoke-sa")))
    pod: Any = core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="smoke-pod"),
        spec=client.V1PodSpec(
            service_account_name="smoke-sa",
            node_selector={"type": "kwok"},
            containers=[client.V1Container(name="main", image="example.invalid/smoke:1")],
        ),
    ))
    return "smoke-sa", str(pod.metadata.uid)


def test_a_pod_bound_token_is_seen_as_the_service_account_with_the_pod_name(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    sa, uid = _pod_with_service_account(kube, namespace)

    path = pod_kubeconfig(cluster, namespace=namespace, service_account=sa,
                          pod_name="smoke-pod", pod_uid=uid, path=tmp_path / "pod.kubeconfig")
    with api_client_from_kubeconfig(path) as api:
        info = whoami(api)

    assert info["username"] == f"system:serviceaccount:{namespace}:{sa}"
    assert info["extra"][POD_NAME_EXTRA] == ["smoke-pod"]
    assert info["extra"][POD_UID_EXTRA] == [uid]
    assert path.stat().st_mode & 0o077 == 0


def test_rbac_denies_a_pod_token_what_its_role_does_not_grant(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    sa, uid = _pod_with_service_account(kube, namespace)
    rbac = client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="read-configmaps"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"],
                                   verbs=["get", "list"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="read-configmaps"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                  name="read-configmaps"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)]))
    path = pod_kubeconfig(cluster, namespace=namespace, service_account=sa,
                          pod_name="smoke-pod", pod_uid=uid, path=tmp_path / "pod.kubeconfig")

    with api_client_from_kubeconfig(path) as api:
        core = client.CoreV1Api(api)

        def granted() -> bool:
            try:
                core.list_namespaced_config_map(namespace)
            except client.ApiException as e:
                if e.status == 403:  # the binding may take a moment to reach the authorizer
                    return False
                raise
            return True

        wait_for("the Role to allow listing configmaps", granted)
        with pytest.raises(client.ApiException) as secrets_denied:
            core.list_namespaced_secret(namespace)
        with pytest.raises(client.ApiException) as elsewhere_denied:
            core.list_namespaced_config_map("default")

    assert secrets_denied.value.status == 403
    assert elsewhere_denied.value.status == 403
