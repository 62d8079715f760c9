"""spec.autoscaling on the real API server: the operator (a real subprocess, as in
test_operator.py) sets a real Deployment's replicas through its scale subresource, and
the chart's RBAC lets the operator's service account do exactly that.

The members are scripted (operator_harness.Members, converging like sidecars) and report
load on their member Leases: each member processes 100/s and is 30,000 events behind, so
the recommendation is 4 (demand 200 + 60,000 / 300 = 400/s at 100/s per member).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import GROUP, Members, OperatorProcess
from test_operator import event_reasons, get_status, make_group, make_pods

from kgroup.apiclient import ApiClient, ApiConfig, kubeconfig_config
from kgroup.core.load import encode_load
from kgroup.core.operator.status import parse_timestamp
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import admin_api_client
from kgroup_operator.kube import Kube

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
TARGET = "orders-batch"


@pytest.fixture
def operator(cluster: Cluster, crd: list[str], namespace: str,
             tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, namespace, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()
        text = op.log_text()
        sys.stdout.write(text[-4000:])
        assert "Traceback" not in text, "the operator logged a traceback"


def make_deployment(kube: client.ApiClient, namespace: str, replicas: int) -> None:
    labels = {"app": TARGET}  # not the group's selector: its pods are only counted here
    client.AppsV1Api(kube).create_namespaced_deployment(namespace, client.V1Deployment(
        metadata=client.V1ObjectMeta(name=TARGET),
        spec=client.V1DeploymentSpec(
            replicas=replicas, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
                    client.V1Container(name="main", image="example.invalid/worker:1")])))))


def deployment(kube: client.ApiClient, namespace: str) -> Any:
    return client.AppsV1Api(kube).read_namespaced_deployment(TARGET, namespace)


def reporting_members(kube: client.ApiClient, namespace: str, *, replicas: int, delay: int,
                      rate: float, lag: int) -> Members:
    """The target Deployment at ``replicas``, a group autoscaling it (1 to 6, the delay)
    and two members joined, each reporting every partition at ``rate`` and partition 0
    ``lag`` behind (the caller closes them)."""
    make_deployment(kube, namespace, replicas=replicas)
    make_pods(kube, namespace, "w-0", "w-1")
    uid = make_group(kube, namespace, autoscaling={
        "minMembers": 1, "maxMembers": 6, "scaleDownDelaySeconds": delay,
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET}})
    members = Members(kube, namespace, uid, converge=True)
    for pod in ("w-0", "w-1"):
        text = encode_load({p: rate for p in range(8)}, {0: lag})
        assert text is not None
        members.loads[pod] = text
    members.join("w-0", "w-1")
    return members


def test_the_operator_sets_a_deployments_replicas_through_its_scale_subresource(
        kube: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    # every member reports every partition at 25/s: a rate counts only for the
    # partitions the reporter holds (4 each: 100/s), and 30,000 behind each
    members = reporting_members(kube, namespace, replicas=1, delay=600, rate=25.0,
                                lag=30_000)
    try:

        def scaled() -> Any:
            st = get_status(kube, namespace)
            auto = st.get("autoscaling") or {}
            return st if auto.get("replicas") == 4 and auto.get("lastScaleTime") else None

        # the first figures measure no growth, the second recommend 4, the third confirm
        # it (a scale-up waits for a second look): about 60 s of takes every 30 s
        st = wait_for("status.autoscaling shows 4 replicas", scaled, timeout=150)
        assert st["load"]["recommendedMembers"] == 4
        assert st["autoscaling"]["desiredMembers"] == 4
        assert st["autoscaling"]["reason"] == \
            "1 -> 4: recommended 4 members, 1 replicas: up"
        dep = deployment(kube, namespace)
        assert dep.spec.replicas == 4
        # written through the scale subresource, by the operator's client, nothing else
        # of the Deployment: its managed fields say which subresource each writer used
        writers = [(f.manager, f.operation, f.subresource or "")
                   for f in dep.metadata.managed_fields or []]
        scale_writes = [w for w in writers if w[2] == "scale"]
        assert len(scale_writes) == 1 and scale_writes[0][1] == "Update", writers
        assert "Scaled" in wait_for("a Scaled Event", lambda: [
            r for r in event_reasons(kube, namespace) if r == "Scaled"], timeout=30)
        # one change: the recommendation stands, nothing else is written
        assert event_reasons(kube, namespace).count("Scaled") == 1
        assert deployment(kube, namespace).spec.replicas == 4

        # the replicas are never set above maxMembers
        client.CustomObjectsApi(kube).patch_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", namespace, "consumergroups", GROUP,
            {"spec": {"autoscaling": {"maxMembers": 3}}})
        wait_for("replicas brought down to maxMembers",
                 lambda: deployment(kube, namespace).spec.replicas == 3, timeout=90)
    finally:
        members.close()


def test_the_crd_refuses_bounds_that_make_no_sense(kube: client.ApiClient, namespace: str,
                                                   crd: list[str]) -> None:
    def refused(auto: dict[str, Any], partitions: int = 8) -> str:
        with pytest.raises(client.ApiException) as exc:
            make_group(kube, namespace, partitions=partitions, autoscaling={
                "scaleTargetRef": {"kind": "Deployment", "name": TARGET}, **auto})
        return str(json.loads(exc.value.body or "{}").get("message"))

    assert "spec.autoscaling.minMembers (5) must be at most maxMembers (3)" in refused(
        {"minMembers": 5, "maxMembers": 3})
    assert ("spec.autoscaling.maxMembers (9) must be at most spec.partitions (8): a member "
            "beyond the partitions would hold nothing") in refused({"maxMembers": 9})
    assert "spec.autoscaling.minMembers" in refused({"minMembers": 0, "maxMembers": 3})
    assert 'Unsupported value: "ReplicaSet"' in refused(
        {"maxMembers": 3, "scaleTargetRef": {"kind": "ReplicaSet", "name": TARGET}})


def test_the_charts_rbac_lets_the_operator_scale_and_nothing_more(
        cluster: Cluster, kube: client.ApiClient, namespace: str, crd: list[str]) -> None:
    """The chart's operator Role (namespaced: operator.watchNamespaces) applied for real;
    the operator's own adapter call made as its service account (impersonated) succeeds,
    a write to the Deployment itself is refused, and the authorizer says the same."""
    rendered = cluster.helm("template", "kgroup", str(CHART), "--namespace", namespace,
                            "--kube-version", "1.35.4",
                            "--set", f"operator.watchNamespaces={{{namespace}}}").stdout
    rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in (
        "Role", "RoleBinding") and d["metadata"]["name"] == "kgroup-operator"]
    assert len(rbac) == 2
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                              input=yaml.safe_dump_all(rbac), check=False)
    assert applied.returncode == 0, applied.stderr
    make_deployment(kube, namespace, replicas=1)
    user = f"system:serviceaccount:{namespace}:kgroup-operator"
    authz = client.AuthorizationV1Api(kube)

    def allowed(verb: str, resource: str, subresource: str = "") -> bool:
        review: Any = authz.create_subject_access_review(client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(user=user, resource_attributes=(
                client.V1ResourceAttributes(namespace=namespace, verb=verb, group="apps",
                                            resource=resource, subresource=subresource,
                                            name=TARGET)))))
        return bool(review.status.allowed)

    for resource in ("deployments", "statefulsets"):
        assert allowed("get", resource, "scale") and allowed("patch", resource, "scale")
        assert not allowed("update", resource, "scale")  # the operator never PUTs a Scale
        for verb in ("patch", "update", "delete", "get"):
            assert not allowed(verb, resource), (verb, resource)
    assert not allowed("patch", "replicasets", "scale")

    impersonated = admin_api_client(cluster)
    impersonated.set_default_header("Impersonate-User", user)  # type: ignore[no-untyped-call]
    admin = kubeconfig_config(cluster.kubeconfig)

    class AsOperator(ApiConfig):  # the shipped client, impersonating the operator
        def headers(self) -> dict[str, str]:
            return {**super().headers(), "Impersonate-User": user}

    as_operator = AsOperator(admin.server, admin.ssl_context, admin.token, admin.token_file)
    try:
        async def scale() -> dict[str, Any] | None:
            api = ApiClient(as_operator)
            try:
                ops = Kube(api, identity="e2e")
                seen = await ops.read_scale(namespace, "Deployment", TARGET)
                assert seen is not None and seen["spec"]["replicas"] == 1
                return await ops.patch_scale(namespace, "Deployment", TARGET, replicas=2,
                                             seen_rv=seen["metadata"]["resourceVersion"])
            finally:
                await api.close()

        stored = asyncio.run(scale())
        assert stored is not None and stored["spec"]["replicas"] == 2
        assert deployment(kube, namespace).spec.replicas == 2
        with pytest.raises(client.ApiException) as refused:
            client.AppsV1Api(impersonated).patch_namespaced_deployment(
                TARGET, namespace, {"spec": {"replicas": 3}})
        assert refused.value.status == 403
    finally:
        impersonated.close()  # type: ignore[no-untyped-call]


def test_a_restarted_operator_resumes_the_scale_down_delay(
        kube: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    """The window of a coming scale-down is kept in status.autoscaling: an operator
    restarted in the middle of the delay scales down when the delay ends, not one delay
    after its start."""
    delay = 45
    # two members keeping up at 20/s each (4 partitions at 5/s): 2 are enough,
    # 4 replicas are more than 2 x 1.5: a scale-down to 2 is coming
    members = reporting_members(kube, namespace, replicas=4, delay=delay, rate=5.0, lag=0)
    try:

        def coming() -> str | None:
            auto = get_status(kube, namespace).get("autoscaling") or {}
            since = auto.get("scaleDownSince")
            return str(since) if since and auto.get("scaleDownTo") == 2 else None

        since = parse_timestamp(str(wait_for("status.autoscaling.scaleDownSince", coming,
                                             timeout=90)))
        assert since is not None
        # restart a third of the way into the delay
        pause = since.timestamp() + delay / 3 - time.time()
        if pause > 0:
            time.sleep(pause)
        operator.stop()
        operator.start()

        def scaled() -> Any:
            auto = get_status(kube, namespace).get("autoscaling") or {}
            return auto if auto.get("lastScaleTime") and auto.get("replicas") == 2 else None

        auto = wait_for("scaled down to 2", scaled, timeout=delay + 60)
        at = parse_timestamp(auto["lastScaleTime"])
        assert at is not None
        waited = (at - since).total_seconds()
        # not before the delay; and not one delay after the restart (delay / 3 later)
        assert delay - 1 <= waited < delay + delay / 3 - 2, (since, at)
        assert auto["reason"].startswith("4 -> 2: ")
        assert deployment(kube, namespace).spec.replicas == 2
    finally:
        members.close()
