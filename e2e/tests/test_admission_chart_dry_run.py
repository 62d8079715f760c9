"""Everything the chart and the examples render is accepted by a real API server.

Rule: `kubectl apply --dry-run=server` of the whole default chart (CRD, operator Deployment
with its exec probes, RBAC, metrics Service, the ValidatingAdmissionPolicy and binding) and
of examples/ (a worker Deployment with a native sidecar, a 16-partition ConsumerGroup
checked against the CRD's schema and CEL rules). Nothing is persisted.

Why: `helm lint` and the unit tests check the chart's shape; only the API server knows
whether a field is spelt right, a CEL expression compiles, or a native sidecar is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kgroup_devcluster.cluster import Cluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"


def _dry_run(cluster: Cluster, namespace: str, manifest: str) -> str:
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                          input=manifest, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_default_chart_is_accepted_by_the_api_server(cluster: Cluster, crd: list[str],
                                                         namespace: str) -> None:
    rendered = cluster.helm("template", "kgroup", str(CHART), "--namespace", namespace,
                            "--kube-version", "1.35.4",
                            "--set", f"workerRbac.namespaces={{{namespace}}}").stdout
    out = _dry_run(cluster, namespace, rendered)
    for what in ("customresourcedefinition.apiextensions.k8s.io/consumergroups.kgroup.dev",
                 "deployment.apps/kgroup-operator",
                 "validatingadmissionpolicy.admissionregistration.k8s.io/"
                 "kgroup-lease-ownership",
                 "role.rbac.authorization.k8s.io/kgroup-worker",
                 "service/kgroup-operator-metrics"):
        assert what in out, out


def test_the_examples_are_accepted_by_the_api_server(cluster: Cluster, crd: list[str],
                                                     namespace: str) -> None:
    for name, expect in (("consumergroup.yaml", "consumergroup.kgroup.dev/orders"),
                         ("worker-deployment.yaml", "deployment.apps/orders-worker")):
        out = _dry_run(cluster, namespace, (REPO / "examples" / name).read_text())
        assert expect in out, out


def test_an_invalid_consumergroup_is_refused(cluster: Cluster, crd: list[str],
                                             namespace: str) -> None:
    # The example with 0 partitions must fail: the dry run really validates.
    text = (REPO / "examples" / "consumergroup.yaml").read_text()
    assert "partitions: 16" in text
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                          input=text.replace("partitions: 16", "partitions: 0"), check=False)
    assert out.returncode != 0
    assert "partitions" in out.stderr


def test_two_replicas_and_the_injector_are_accepted_and_its_secret_is_all_it_may_touch(
        cluster: Cluster, crd: list[str], namespace: str, kube: client.ApiClient) -> None:
    """The default two replicas (PDB, anti-affinity) with the injector on, dry-run; then
    the injector's Role and RoleBinding applied for real, and the API server's authorizer
    asked what the operator's service account may do with Secrets."""
    rendered = cluster.helm("template", "kgroup", str(CHART), "--namespace", namespace,
                            "--kube-version", "1.35.4", "--set", "injector.enabled=true",
                            "--set", f"workerRbac.namespaces={{{namespace}}}").stdout
    out = _dry_run(cluster, namespace, rendered)
    for what in ("poddisruptionbudget.policy/kgroup-operator", "secret/kgroup-injector-tls",
                 "role.rbac.authorization.k8s.io/kgroup-injector",
                 "rolebinding.rbac.authorization.k8s.io/kgroup-injector"):
        assert what in out, out
    rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in (
        "Role", "RoleBinding") and d["metadata"]["name"] == "kgroup-injector"]
    assert len(rbac) == 2
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                              input=yaml.safe_dump_all(rbac), check=False)
    assert applied.returncode == 0, applied.stderr
    authz = client.AuthorizationV1Api(kube)
    user = f"system:serviceaccount:{namespace}:kgroup-operator"

    def allowed(verb: str, name: str | None) -> bool:
        review: Any = authz.create_subject_access_review(client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(user=user, resource_attributes=(
                client.V1ResourceAttributes(namespace=namespace, verb=verb, resource="secrets",
                                            name=name)))))
        return bool(review.status.allowed)

    assert allowed("get", "kgroup-injector-tls") and allowed("update", "kgroup-injector-tls")
    assert not allowed("get", "another-secret")
    assert not allowed("update", "another-secret")
    assert not allowed("create", None) and not allowed("list", None)
    assert not allowed("delete", "kgroup-injector-tls")
