"""The Helm chart (charts/kgroup) renders what it promises: no cluster, only `helm`
(helpers: tests/chart_render.py). This file: the operator's Deployment, the values
schema, the CRD, monitoring; RBAC and the admission policies: test_chart_rbac.py; the
sidecar's named templates and the examples: test_chart_sidecar.py.

Why these checks: the operator's securityContext is the hardened one, the CRD is kept on
uninstall, the values schema refuses a misspelt key, and the chart's CRD copy is
byte-identical to crds/ (generated from the pydantic models) so the two cannot drift.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest
import yaml
from chart_render import (
    CHART,
    CRD_FILE,
    KUBE_VERSION,
    REPO,
    by_kind,
    helm,
    one,
    render,
    render_file,
)


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


def _probe_script(port: int) -> list[str]:
    dep = one(render(f"operator.healthPort={port}"), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    live = c["livenessProbe"]["exec"]["command"]
    assert live[:2] == ["python3", "-c"]  # readiness: tests/test_chart_replicas.py
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


def test_the_real_node_values_keep_every_socket_on_loopback_and_pods_on_the_node() -> None:
    objs = render_file(REPO / "e2e" / "values-real-node.yaml", "kubernetesApi.port=40123")
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    # one node, host ports: a second replica would stay Pending (and no PDB over one pod)
    assert one(objs, "Deployment")["spec"]["replicas"] == 1
    assert not by_kind(objs, "PodDisruptionBudget")
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


def test_monitoring_objects_and_the_pdb_render_only_when_enabled() -> None:
    kinds = {o["kind"] for o in render("workerRbac.namespaces={orders}",
                                       "operator.podDisruptionBudget.enabled=false")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PodDisruptionBudget"}
    objs = render("workerRbac.namespaces={orders}", "metrics.serviceMonitor.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom", "metrics.podMonitor.enabled=true",
                  "operator.podDisruptionBudget.maxUnavailable=1")
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
