"""The Helm chart (charts/kgroup) renders what it promises: no cluster, only `helm`.

Rule: every assertion is on objects `helm template` rendered (parsed YAML), never on the
template text, so a test fails when what would reach the API server changes. `helm` is the
binary scripts/build-tools.sh builds from its Go module (a no-op when cached).

Why these checks: the chart is where least privilege and the CRD's lifetime are decided.
RBAC verbs are compared exactly (a wildcard or an extra verb is a failure), the operator's
securityContext is the hardened one, the CRD is kept on uninstall, the values schema
refuses a misspelt key, and the chart's CRD copy is byte-identical to crds/ (generated from
the pydantic models) so the two cannot drift.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from kgroup_devcluster.cluster import build_tools

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "kgroup"
CRD_FILE = "kgroup.dev_consumergroups.yaml"
# `helm template` assumes Kubernetes 1.20 unless told; the chart requires >= 1.30.
KUBE_VERSION = "1.35.4"

Obj = dict[str, Any]


@cache
def helm_bin() -> str:
    helm = build_tools() / "helm"
    if not helm.exists():
        pytest.fail(f"{helm} is missing: run scripts/build-tools.sh", pytrace=False)
    return str(helm)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_bin(), *args], capture_output=True, text=True, check=check,
                          timeout=120)


def render(*sets: str, chart: Path = CHART, namespace: str = "kgroup-system") -> list[Obj]:
    argv = ["template", "kg", str(chart), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    out = helm(*argv, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def rule_table(rules: list[Obj]) -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """(apiGroup, resource, sorted verbs, resourceNames) for every rule's group x resource."""
    table = set()
    for r in rules:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                table.add((g, res, tuple(sorted(r["verbs"])),
                           tuple(r.get("resourceNames", ()))))
    return table


def assert_no_wildcards(rules: list[Obj]) -> None:
    for r in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in r.get(key, []), f"wildcard in {key}: {r}"


OPERATOR_RULES = {
    ("kgroup.dev", "consumergroups", ("get", "list", "patch", "watch"), ()),
    ("kgroup.dev", "consumergroups/status", ("get", "patch", "update"), ()),
    ("", "pods", ("get", "list", "watch"), ()),
    ("coordination.k8s.io", "leases", ("create", "list", "patch", "watch"), ()),
    ("", "events", ("create", "patch"), ()),
}
WORKER_RULES = {
    ("coordination.k8s.io", "leases", ("create", "delete", "get", "list", "update", "watch"),
     ()),
    ("kgroup.dev", "consumergroups", ("get", "list", "watch"), ()),
    ("", "events", ("create", "patch"), ()),
}


def test_helm_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_default_render_has_every_component() -> None:
    kinds = {o["kind"] for o in render()}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding", "Role", "RoleBinding", "Service",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds


def test_operator_runs_hardened() -> None:
    dep = one(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["command"] == ["kgroup-operator"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["livenessProbe"] and c["readinessProbe"]
    assert pod["serviceAccountName"] == "kg-kgroup-operator"


def test_operator_settings_follow_values() -> None:
    objs = render("operator.watchNamespaces={orders,billing}", "operator.replicas=3",
                  "operator.metricsPort=9100", "operator.healthPort=9101")
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KGROUP_NAMESPACES"] == "orders,billing"
    assert env["KGROUP_PEERING"] == "lease"
    assert env["KGROUP_METRICS_PORT"] == "9100"
    assert env["KGROUP_LIVENESS_PORT"] == "9101"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert one(objs, "Service")["spec"]["ports"][0]["targetPort"] == "metrics"


def test_operator_rbac_is_exactly_what_it_needs() -> None:
    objs = render()
    role = one(objs, "ClusterRole")
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == OPERATOR_RULES
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kg-kgroup-operator",
                                    "namespace": "kgroup-system"}]


def test_namespaced_operator_gets_roles_not_a_cluster_role() -> None:
    objs = render("operator.watchNamespaces={orders,billing}")
    assert not by_kind(objs, "ClusterRole") and not by_kind(objs, "ClusterRoleBinding")
    roles = {o["metadata"]["namespace"]: o for o in by_kind(objs, "Role")
             if o["metadata"]["name"] == "kg-kgroup-operator"}
    assert set(roles) == {"orders", "billing"}
    for role in roles.values():
        assert rule_table(role["rules"]) == OPERATOR_RULES


def test_leader_election_role_is_scoped_to_its_lease() -> None:
    objs = render("operator.replicas=2", "operator.leaderElection.leaseName=the-leader")
    role = one(objs, "Role", "kg-kgroup-operator-leader-election")
    assert role["metadata"]["namespace"] == "kgroup-system"
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == {
        ("coordination.k8s.io", "leases", ("get", "update"), ("the-leader",)),
        ("coordination.k8s.io", "leases", ("create",), ()),
        ("", "events", ("create", "patch"), ()),
    }
    env = {e["name"]: e.get("value")
           for e in one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KGROUP_LEADER_LEASE"] == "the-leader"


def test_standalone_operator_has_no_leader_election() -> None:
    objs = render("operator.leaderElection.enabled=false")
    assert not [o for o in by_kind(objs, "Role") if "leader" in o["metadata"]["name"]]
    env = {e["name"]: e.get("value")
           for e in one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KGROUP_PEERING"] == "none"


def test_worker_rbac_is_namespaced_and_minimal() -> None:
    objs = render("workerRbac.namespaces={orders}", "workerRbac.serviceAccountName=orders-w")
    sa = one(objs, "ServiceAccount", "orders-w")
    assert sa["metadata"]["namespace"] == "orders"
    role = one(objs, "Role", "orders-w")
    assert role["metadata"]["namespace"] == "orders"
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == WORKER_RULES
    rb = one(objs, "RoleBinding", "orders-w")
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": "orders-w"}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "orders-w",
                               "namespace": "orders"}]


# The Kubernetes client's Lease calls, as RBAC verbs; a watch is a list plus a watch.
_LEASE_CALL = re.compile(r"\.(read|list|create|replace|patch|delete)_(?:namespaced_lease|"
                         r"lease_for_all_namespaces)\b")
_VERB = {"read": "get", "list": "list", "create": "create", "replace": "update",
         "patch": "patch", "delete": "delete"}


def lease_verbs_called(*files: str) -> set[str]:
    """Every Lease verb the code in ``files`` calls (a Watch of a list call adds watch)."""
    verbs: set[str] = set()
    for name in files:
        text = (REPO / name).read_text()
        verbs |= {_VERB[m] for m in _LEASE_CALL.findall(text)}
        if "watch.Watch" in text or "kopf.on.event(\"coordination.k8s.io\"" in text:
            verbs |= {"list", "watch"}
    return verbs


def lease_verbs_granted(rules: set[Any], names: tuple[str, ...] = ()) -> set[str]:
    return {v for g, res, verbs, rn in rules if (g, res) == ("coordination.k8s.io", "leases")
            and rn == names for v in verbs}


def test_every_lease_verb_granted_is_one_the_code_calls_and_no_more() -> None:
    """RBAC against the code: the operator's group Leases (kube.py, the kopf Lease watch),
    its leader Lease (leader.py), the sidecar's Leases (its kube.py)."""
    operator = lease_verbs_called("operator/kgroup_operator/kube.py",
                                  "operator/kgroup_operator/handlers.py")
    assert operator == {"create", "list", "patch", "watch"}
    assert lease_verbs_granted(OPERATOR_RULES) == operator
    leader = lease_verbs_called("operator/kgroup_operator/leader.py")
    role = one(render(), "Role", "kg-kgroup-operator-leader-election")
    granted = rule_table(role["rules"])
    assert lease_verbs_granted(granted, ("kgroup-operator-leader",)) | \
        lease_verbs_granted(granted) == leader == {"create", "get", "update"}
    worker = lease_verbs_called("worker_sidecar/kgroup_sidecar/kube.py")
    assert lease_verbs_granted(WORKER_RULES) == worker


def test_the_operator_admission_policy_binds_the_operator_everywhere() -> None:
    objs = render("operator.leaderElection.leaseName=the-leader",
                  "admissionPolicy.namespaces={orders}")
    policy = one(objs, "ValidatingAdmissionPolicy", "kg-kgroup-operator-leases")
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert conditions["caller-is-the-kgroup-operator"] == (
        "request.userInfo.username == 'system:serviceaccount:kgroup-system:kg-kgroup-operator'")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "request.namespace == 'kgroup-system'" in variables["leader"]
    assert "request.name == 'the-leader'" in variables["leader"]
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "kg-kgroup-operator-leases")
    assert binding["spec"] == {"policyName": "kg-kgroup-operator-leases",
                               "validationActions": ["Deny"]}  # every namespace
    assert not [o for o in render("operator.enabled=false")
                if o["metadata"]["name"] == "kg-kgroup-operator-leases"]


def test_crd_is_kept_on_uninstall_by_default() -> None:
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "consumergroups.kgroup.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    no_keep = one(render("crds.keep=false"), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (no_keep["metadata"].get("annotations") or {})
    assert not by_kind(render("crds.enabled=false"), "CustomResourceDefinition")


def test_chart_crd_copy_equals_the_generated_crd() -> None:
    source = REPO / "crds" / CRD_FILE
    copy = CHART / "files" / "crds" / CRD_FILE
    assert copy.read_bytes() == source.read_bytes(), (
        f"the chart's CRD drifted from crds/: cp {source} {copy}")


def test_rendered_crd_schema_equals_the_generated_one() -> None:
    # fromYaml/toYaml in the template must not change a value (e.g. numbers into floats).
    source = yaml.safe_load((REPO / "crds" / CRD_FILE).read_text())
    crd = one(render(), "CustomResourceDefinition")
    assert json.dumps(crd["spec"], sort_keys=True) == json.dumps(source["spec"], sort_keys=True)


@pytest.mark.parametrize("bad", ["bogus=1", "operator.bogus=1", "sidecar.image.bogus=x",
                                 "admissionPolicy.failurePolicy=Sometimes",
                                 "operator.metricsHost=0.0.0.0", "sidecar.listen=0.0.0.0:8470",
                                 "sidecar.listen=unix://relative.sock",
                                 "sidecar.port=8470", "sidecar.metrics.host=0.0.0.0",
                                 "sidecar.logFormat=xml", "metrics.serviceMonitor.interval=often"])
def test_schema_refuses_unknown_or_invalid_values(bad: str) -> None:
    out = helm("template", "kg", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad,
               check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr


def test_every_value_is_documented_with_an_example() -> None:
    # A key is documented when the comment block right above it has "Example:"; a key
    # without a comment block must sit inside a documented key (e.g. resources.limits.cpu).
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the open ancestors
    comments: list[str] = []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        if not stripped:
            comments = []
            continue
        indent = len(line) - len(line.lstrip())
        while documented and documented[-1][0] >= indent:
            documented.pop()
        key = stripped.split(":")[0]
        own = any("Example:" in c for c in comments)
        inherited = any(d for _, d in documented)
        is_parent = stripped.endswith(":")
        assert is_parent or own or inherited, f"values.yaml: {key} has no '# Example:'"
        documented.append((indent, own))
        comments = []


def test_admission_policy_binds_the_worker_service_accounts() -> None:
    objs = render("workerRbac.serviceAccountName=orders-w",
                  "admissionPolicy.additionalServiceAccountNames={legacy}",
                  "admissionPolicy.namespaces={orders}")
    policy = one(objs, "ValidatingAdmissionPolicy", "kg-kgroup-lease-ownership")
    assert policy["spec"]["failurePolicy"] == "Fail"
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["leases"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert '["orders-w","legacy"]' in conditions["caller-is-a-kgroup-worker"]
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])
    assert set(conditions) == {"caller-is-a-kgroup-worker"}  # every Lease: kgroup's or not
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "kg-kgroup-lease-ownership")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["orders"]}]


def _parent_chart(tmp_path: Path, template: str) -> Path:
    """A chart that depends on kgroup (copied into its charts/) and renders `template`."""
    parent = tmp_path / "parent"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: parent\nversion: 0.0.1\nkubeVersion: '>=1.30.0-0'\n"
        "dependencies:\n- name: kgroup\n  version: 0.1.0\n")
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '9.9.9'}}\n")
    shutil.copytree(CHART, parent / "charts" / "kgroup")
    (parent / "templates" / "pod.yaml").write_text(template)
    return parent


POD_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata: {name: w}
spec:
  serviceAccountName: kgroup-worker
  %(where)s:
    {{- $args := dict "root" $ "values" .Values.kgroup "group" "orders" %(extra)s }}
    {{- include "kgroup.sidecarContainer" $args | nindent 4 }}
  containers:
    - {name: app, image: app}
"""


def test_sidecar_template_renders_a_native_sidecar_with_the_protocol_env(
        tmp_path: Path) -> None:
    parent = _parent_chart(tmp_path, POD_TEMPLATE % {"where": "initContainers", "extra": ""})
    pod = one(render(chart=parent), "Pod")
    (side,) = pod["spec"]["initContainers"]
    assert side["name"] == "kgroup-sidecar"
    assert side["restartPolicy"] == "Always"
    assert side["image"] == "ghcr.io/kgroup/kgroup-sidecar:9.9.9"
    assert side["command"] == ["kgroup-sidecar"]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_GROUP"]["value"] == "orders"
    assert env["KGROUP_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["KGROUP_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KGROUP_LISTEN"]["value"] == "unix:///var/run/kgroup/sidecar.sock"
    assert "KUBERNETES_SERVICE_HOST" not in env
    probes = {k: side[k]["exec"]["command"]
              for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == ["python3", "-m", "kgroup_sidecar.probe", "/healthz"]
    assert probes["readinessProbe"] == ["python3", "-m", "kgroup_sidecar.probe", "/readyz"]
    assert side["readinessProbe"]["periodSeconds"] == 2
    assert side["volumeMounts"] == [{"name": "kgroup-sidecar", "mountPath": "/var/run/kgroup"}]
    assert side["securityContext"]["readOnlyRootFilesystem"] is True
    assert side["securityContext"]["runAsNonRoot"] is True


def test_sidecar_template_renders_a_plain_container_when_not_native(tmp_path: Path) -> None:
    parent = _parent_chart(tmp_path, POD_TEMPLATE % {
        "where": "initContainers", "extra": '"native" false "listen" "127.0.0.1:9470"'})
    (side,) = one(render(chart=parent), "Pod")["spec"]["initContainers"]
    assert "restartPolicy" not in side
    assert {e["name"]: e.get("value") for e in side["env"]}["KGROUP_LISTEN"] == "127.0.0.1:9470"
    assert "volumeMounts" not in side  # loopback TCP: no socket volume


APP_TEMPLATE = """\
{{- $k := dict "root" $ "values" .Values.kgroup }}
apiVersion: v1
kind: Pod
metadata: {name: w}
spec:
  initContainers:
    {{- include "kgroup.sidecarContainer" (merge (dict "group" "orders") $k) | nindent 4 }}
  containers:
    - name: app
      image: app
      env:
        {{- include "kgroup.sidecarUrlEnv" $k | nindent 8 }}
      volumeMounts:
        {{- include "kgroup.sidecarVolumeMount" $k | nindent 8 }}
  volumes:
    {{- include "kgroup.sidecarVolume" $k | nindent 4 }}
"""


def _app_pod(tmp_path: Path, values: str) -> Obj:
    parent = _parent_chart(tmp_path, APP_TEMPLATE)
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '0.1.0'}}\n" + values)
    return one(render(chart=parent), "Pod")


def test_the_app_container_shares_the_sidecars_socket_volume(tmp_path: Path) -> None:
    spec = _app_pod(tmp_path, "")["spec"]
    (app,) = spec["containers"]
    (side,) = spec["initContainers"]
    assert app["env"] == [{"name": "KGROUP_SIDECAR_URL",
                           "value": "unix:///var/run/kgroup/sidecar.sock"}]
    assert app["volumeMounts"] == side["volumeMounts"] == [
        {"name": "kgroup-sidecar", "mountPath": "/var/run/kgroup"}]
    assert spec["volumes"] == [{"name": "kgroup-sidecar",
                                "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]


def test_a_loopback_sidecar_needs_no_volume_and_the_api_address_reaches_the_sidecar(
        tmp_path: Path) -> None:
    spec = _app_pod(tmp_path, "  sidecar: {listen: '127.0.0.1:9470', image: {tag: '0.1.0'}}\n"
                              "  kubernetesApi: {host: 127.0.0.1, port: 6443}\n")["spec"]
    (app,) = spec["containers"]
    (side,) = spec["initContainers"]
    assert app["env"] == [{"name": "KGROUP_SIDECAR_URL", "value": "http://127.0.0.1:9470"}]
    assert not app["volumeMounts"] and not spec["volumes"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
        "127.0.0.1", "6443")


def test_operator_metrics_bind_the_pod_ip_never_a_wildcard() -> None:
    (c,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["KGROUP_METRICS_HOST"] == {
        "name": "KGROUP_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert "KUBERNETES_SERVICE_HOST" not in env
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod


def test_operator_on_the_host_network_with_a_given_api_server() -> None:
    pod = one(render("operator.hostNetwork=true", "operator.metricsHost=127.0.0.1",
                     "kubernetesApi.host=127.0.0.1", "kubernetesApi.port=6443"),
              "Deployment")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    dep = one(render("operator.hostNetwork=true"), "Deployment")
    # the node's ports: the old pod must go before the new one can start
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert one(render(), "Deployment")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1, "maxUnavailable": 0}
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KGROUP_METRICS_HOST"] == "127.0.0.1"
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
        "127.0.0.1", "6443")
    pod = one(render("operator.hostNetwork=true", "operator.dnsPolicy=Default"),
              "Deployment")["spec"]["template"]["spec"]
    assert pod["dnsPolicy"] == "Default"


def test_example_worker_deployment_matches_the_sidecar_template(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "worker-deployment.yaml").read_text()))
    example = one(docs, "Deployment")
    pod = example["spec"]["template"]["spec"]
    (side,) = [c for c in pod["initContainers"] if c["name"] == "kgroup-sidecar"]
    (app,) = pod["containers"]
    rendered = _app_pod(tmp_path, "")["spec"]
    assert side == rendered["initContainers"][0]
    (url_env,) = rendered["containers"][0]["env"]
    assert url_env in app["env"]
    (mount,) = rendered["containers"][0]["volumeMounts"]
    assert mount in app["volumeMounts"]
    assert rendered["volumes"][0] in pod["volumes"]
    # The worker starts: its Redis and stream settings come from the ConfigMap.
    config = one(docs, "ConfigMap")
    assert app["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    assert {"KGROUP_REDIS_URL", "KGROUP_STREAM"} <= set(config["data"])
    assert example["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def _probe_script(port: int) -> list[str]:
    dep = one(render(f"operator.healthPort={port}"), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    live, ready = c["livenessProbe"]["exec"]["command"], c["readinessProbe"]["exec"]["command"]
    assert live == ready and live[:2] == ["python3", "-c"]
    return [sys.executable, "-c", live[2]]


def _serve(status: int) -> tuple[http.server.HTTPServer, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.mark.parametrize(("status", "passes"), [(200, True), (500, False), (None, False)])
def test_operator_probe_passes_a_healthy_endpoint_and_fails_a_sick_or_absent_one(
        status: int | None, passes: bool) -> None:
    # 200: a leader (kopf) or a standby (its own endpoint); None: nothing listens (the
    # process is not serving) -> the probe fails.
    if status is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again when the block ends: refused
        result = subprocess.run(_probe_script(port), capture_output=True, timeout=30)
    else:
        server, port = _serve(status)
        try:
            result = subprocess.run(_probe_script(port), capture_output=True, timeout=30)
        finally:
            server.shutdown()
            server.server_close()
    assert (result.returncode == 0) is passes, result.stderr


def test_the_example_worker_gets_every_setting_it_needs_from_its_pod_spec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The light worker exited with status 2 (no Redis settings) under the old example: its
    command line is now complete from the ConfigMap and the container's env."""
    import argparse

    from kgroup_pipeline.ownership import SidecarOwnership, ownership_from_spec
    from kgroup_pipeline.worker_cli import add_source_arguments, ownership_spec

    docs = list(yaml.safe_load_all((REPO / "examples" / "worker-deployment.yaml").read_text()))
    (app,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert app["command"] == ["python3", "-m", "kgroup_pipeline.light_worker"]
    env = dict(one(docs, "ConfigMap")["data"])
    env.update({e["name"]: e["value"] for e in app["env"]})
    for name in ("KGROUP_REDIS_URL", "KGROUP_STREAM", "KGROUP_SIDECAR_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ap = argparse.ArgumentParser()
    add_source_arguments(ap)
    spec = ownership_spec(ap, ap.parse_args([]))  # ap.error() would exit with status 2
    ownership = ownership_from_spec(spec)
    assert isinstance(ownership, SidecarOwnership)
    assert ownership.client.address.socket_path == "/var/run/kgroup/sidecar.sock"


def test_the_real_node_values_keep_every_socket_on_loopback_and_pods_on_the_node() -> None:
    objs = render_file(REPO / "e2e" / "values-real-node.yaml", "kubernetesApi.port=40123")
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    assert pod["nodeSelector"] == {"kgroup.dev/node": "real"}
    assert pod["tolerations"] == [{"key": "kgroup.dev/node", "operator": "Equal",
                                   "value": "real", "effect": "NoSchedule"}]
    (c,) = pod["containers"]
    assert c["imagePullPolicy"] == "Never"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KGROUP_METRICS_HOST"] == "127.0.0.1"
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
        "127.0.0.1", "40123")
    assert not by_kind(objs, "Service")


def render_file(values: Path, *sets: str) -> list[Obj]:
    out = helm("template", "kg", str(CHART), "--namespace", "kgroup-system",
               "--kube-version", KUBE_VERSION, "-f", str(values),
               *[a for s in sets for a in ("--set", s)], check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_monitoring_objects_and_the_pdb_render_only_when_enabled() -> None:
    kinds = {o["kind"] for o in render("workerRbac.namespaces={orders}")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PodDisruptionBudget"}
    objs = render("workerRbac.namespaces={orders}", "metrics.serviceMonitor.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom", "metrics.podMonitor.enabled=true",
                  "operator.podDisruptionBudget.enabled=true")
    sm = one(objs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    service = one(objs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pm = one(objs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["orders"]}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "kgroup-metrics"
    pdb = one(objs, "PodDisruptionBudget")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    assert not by_kind(render("metrics.serviceMonitor.enabled=true",
                              "metrics.service.enabled=false"), "ServiceMonitor")


def test_log_format_reaches_both_components(tmp_path: Path) -> None:
    dep = one(render("operator.logFormat=json", "operator.logLevel=WARNING"), "Deployment")
    env = {e["name"]: e.get("value") for e in
           dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["KGROUP_LOG_FORMAT"], env["KGROUP_LOG_LEVEL"]) == ("json", "WARNING")
    pod = _app_pod(tmp_path, "  sidecar: {logFormat: json, image: {tag: '0.1.0'}}\n")
    side = pod["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_LOG_FORMAT"]["value"] == "json"
    assert env["KGROUP_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "KGROUP_METRICS_LISTEN" not in env and "ports" not in side


def test_sidecar_metrics_bind_the_pod_ip_or_the_host_given(tmp_path: Path) -> None:
    side = _app_pod(tmp_path, "  sidecar: {metrics: {enabled: true}, image: {tag: '0.1.0'}}\n"
                    )["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [e["name"] for e in side["env"]]
    assert names.index("KGROUP_POD_IP") < names.index("KGROUP_METRICS_LISTEN")  # $(...) order
    assert env["KGROUP_METRICS_LISTEN"]["value"] == "$(KGROUP_POD_IP):9471"
    assert side["ports"] == [{"name": "kgroup-metrics", "containerPort": 9471,
                              "protocol": "TCP"}]
    side = _app_pod(tmp_path / "b", "  sidecar: {metrics: {enabled: true, host: 127.0.0.1, "
                    "port: 9500}, image: {tag: '0.1.0'}}\n")["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_METRICS_LISTEN"]["value"] == "127.0.0.1:9500"
    assert "KGROUP_POD_IP" not in env
