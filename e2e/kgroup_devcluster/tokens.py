"""Kubeconfigs that act as a pod: a TokenRequest token bound to the Pod object.

Rule: a process that plays a pod on the local control plane authenticates with what the
kubelet would give that pod, a service-account token bound to the pod, never the admin
certificate. The API server then sees `system:serviceaccount:<ns>:<sa>` with the pod's
name and uid in `userInfo.extra`, so RBAC and admission policies judge the pod itself.

Why a bound token: it is invalidated when the pod is deleted, exactly as in a real
cluster, and it is what lets a ValidatingAdmissionPolicy compare a Lease holder with
`request.userInfo.extra['authentication.kubernetes.io/pod-name']`.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from kubernetes import client, config

from .cluster import Cluster

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def admin_api_client(cluster: Cluster) -> client.ApiClient:
    """A kubernetes ApiClient as cluster admin (from the cluster's kubeconfig)."""
    return api_client_from_kubeconfig(cluster.kubeconfig)


def api_client_from_kubeconfig(path: Path) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(path)
    )
    return api


def request_pod_token(
    cluster: Cluster,
    *,
    namespace: str,
    service_account: str,
    pod_name: str,
    pod_uid: str,
    expiration_seconds: int = 3600,
) -> str:
    """A TokenRequest token for `service_account`, bound to the pod (name and uid)."""
    return request_token(
        cluster,
        namespace=namespace,
        service_account=service_account,
        expiration_seconds=expiration_seconds,
        bound_object_ref=client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod_name, uid=pod_uid
        ),
    )


def request_token(
    cluster: Cluster,
    *,
    namespace: str,
    service_account: str,
    expiration_seconds: int = 3600,
    bound_object_ref: client.V1BoundObjectReference | None = None,
) -> str:
    """A TokenRequest token for `service_account` (bound to `bound_object_ref` if given,
    else to no object: what a pod-less client of that service account would hold)."""
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],  # empty: the API server's own audience
            expiration_seconds=expiration_seconds,
            bound_object_ref=bound_object_ref,
        )
    )
    with admin_api_client(cluster) as api:
        out = client.CoreV1Api(api).create_namespaced_service_account_token(
            name=service_account, namespace=namespace, body=body
        )
    if out.status is None or not out.status.token:
        raise RuntimeError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return str(out.status.token)


def token_kubeconfig_text(cluster: Cluster, *, token: str, user: str, namespace: str) -> str:
    ca = base64.b64encode(cluster.pki.ca_cert.read_bytes()).decode()
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kgroup-dev", "cluster": {
            "server": cluster.server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {
            "cluster": "kgroup-dev", "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    return json.dumps(doc, indent=2) + "\n"


def pod_kubeconfig(
    cluster: Cluster,
    namespace: str,
    service_account: str,
    pod_name: str,
    pod_uid: str,
    path: Path | str,
    *,
    expiration_seconds: int = 3600,
) -> Path:
    """Write a kubeconfig (mode 0600) whose user is a token bound to the pod; return its path.

    Call with keywords: `pod_kubeconfig(cluster, namespace=..., service_account=...,
    pod_name=..., pod_uid=..., path=...)`.
    """
    token = request_pod_token(
        cluster,
        namespace=namespace,
        service_account=service_account,
        pod_name=pod_name,
        pod_uid=pod_uid,
        expiration_seconds=expiration_seconds,
    )
    return _write_private(path, token_kubeconfig_text(
        cluster, token=token, user=f"{namespace}-{pod_name}", namespace=namespace))


def service_account_kubeconfig(
    cluster: Cluster,
    *,
    namespace: str,
    service_account: str,
    path: Path | str,
    user: str | None = None,
    expiration_seconds: int = 3600,
) -> Path:
    """Write a kubeconfig (mode 0600) whose user is a token of `service_account` bound to
    no pod (the operator's identity, or a worker token without a pod); return its path."""
    token = request_token(
        cluster,
        namespace=namespace,
        service_account=service_account,
        expiration_seconds=expiration_seconds,
    )
    return _write_private(path, token_kubeconfig_text(
        cluster, token=token, user=user or f"{namespace}-{service_account}",
        namespace=namespace))


def _write_private(path: Path | str, text: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(out)
    return out


def token_pod(
    core: client.CoreV1Api, namespace: str, name: str, service_account: str
) -> client.V1Pod:
    """Create a Pod object only to bind tokens to: nothing runs it (its nodeSelector
    matches no node, its image is never pulled). Delete it and its tokens stop working."""
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            service_account_name=service_account,
            node_selector={"kgroup.dev/no-such-node": "true"},  # never scheduled, never run
            containers=[client.V1Container(name="app", image="registry.invalid/app")],
        ),
    )
    pod: client.V1Pod = core.create_namespaced_pod(namespace, body)
    return pod


def pod_api_client(cluster: Cluster, pod: client.V1Pod, path: Path | str) -> client.ApiClient:
    """An ApiClient acting as `pod` (a token bound to it, its kubeconfig written to
    `path`); the caller closes it."""
    meta, spec = pod.metadata, pod.spec
    if meta is None or spec is None or not (meta.namespace and meta.name and meta.uid):
        raise ValueError("pod_api_client needs a Pod as the API server returned it")
    return api_client_from_kubeconfig(pod_kubeconfig(
        cluster, namespace=meta.namespace, service_account=spec.service_account_name or "default",
        pod_name=meta.name, pod_uid=meta.uid, path=path))


def whoami(api: client.ApiClient) -> dict[str, Any]:
    """The user the API server sees for `api` (a SelfSubjectReview's userInfo, as a dict)."""
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        body=client.V1SelfSubjectReview()
    )
    if review.status is None:
        raise RuntimeError("SelfSubjectReview returned no status")
    info: dict[str, Any] = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        review.status.user_info
    )
    return info
