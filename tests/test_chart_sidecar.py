"""The chart's sidecar named templates (rendered in a parent chart, as an app's chart
uses them) and the examples written from them (no cluster, only `helm`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_render import REPO, one, parent_chart, render

from kgroup.core.objects import Obj

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
    parent = parent_chart(tmp_path, POD_TEMPLATE % {"where": "initContainers", "extra": ""})
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
    # the default probes: httpGet on a port of the pod's IP that serves only the probes
    probes = {k: side[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["startupProbe"] == probes["livenessProbe"] == {
        "path": "/livez", "port": "kgroup-probe"}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "kgroup-probe"}
    assert side["ports"] == [{"name": "kgroup-probe", "containerPort": 8471, "protocol": "TCP"}]
    assert env["KGROUP_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KGROUP_PROBE_LISTEN"]["value"] == "$(KGROUP_POD_IP):8471"
    assert "KGROUP_PROBE_DIR" not in env
    assert side["readinessProbe"]["periodSeconds"] == 2
    assert side["volumeMounts"] == [TOKEN_MOUNT,
                                   {"name": "kgroup-sidecar", "mountPath": "/var/run/kgroup"}]
    assert side["securityContext"]["readOnlyRootFilesystem"] is True
    assert side["securityContext"]["runAsNonRoot"] is True


def no_interpreter(command: list[str]) -> bool:
    return not any("python" in word for word in command)


def test_exec_probes_test_the_sidecars_files_with_find_not_python(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, POD_TEMPLATE % {"where": "initContainers", "extra": ""})
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '9.9.9'}, "
        "probes: {mode: exec}}\n")
    (side,) = one(render(chart=parent), "Pod")["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    assert env["KGROUP_PROBE_DIR"] == "/var/run/kgroup/probe"  # in the socket's emptyDir
    assert "KGROUP_PROBE_LISTEN" not in env and "KGROUP_POD_IP" not in env
    assert "ports" not in side  # nothing to collide on a hostNetwork node
    alive = ["find", "/var/run/kgroup/probe/alive", "-mmin", "+0.5", "-exec", "false", "{}",
             "+"]
    ready = ["find", "/var/run/kgroup/probe/ready", "-mmin", "+0.25", "-exec", "false", "{}",
             "+"]
    assert side["startupProbe"]["exec"]["command"] == alive
    assert side["readinessProbe"]["exec"]["command"] == ready
    assert all(no_interpreter(side[k]["exec"]["command"])
               for k in ("startupProbe", "readinessProbe"))
    # an exec costs the container 17-30 ms of CPU (runc): fewer of them than http probes,
    # and no liveness probe at all (the sidecar's watchdog exits a stuck sidecar)
    assert side["readinessProbe"]["periodSeconds"] == 15
    assert "livenessProbe" not in side
    assert "KGROUP_WATCHDOG_SECONDS" not in env  # the sidecar's default (60 s) is on
    # the sidecar's own module writes the files those commands test
    from kgroup_sidecar.probe_files import ALIVE, READY, probe_command
    assert probe_command("/var/run/kgroup/probe", ALIVE) == alive
    assert probe_command("/var/run/kgroup/probe", READY) == ready


def test_exec_probes_need_the_socket_volume(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, POD_TEMPLATE % {
        "where": "initContainers", "extra": '"listen" "127.0.0.1:9470"'})
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '9.9.9'}, "
        "probes: {mode: exec}}\n")
    with pytest.raises(AssertionError, match=r"sidecar\.listen must be unix"):
        render(chart=parent)


def test_sidecar_template_renders_a_plain_container_when_not_native(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, POD_TEMPLATE % {
        "where": "initContainers", "extra": '"native" false "listen" "127.0.0.1:9470"'})
    (side,) = one(render(chart=parent), "Pod")["spec"]["initContainers"]
    assert "restartPolicy" not in side
    assert {e["name"]: e.get("value") for e in side["env"]}["KGROUP_LISTEN"] == "127.0.0.1:9470"
    assert side["volumeMounts"] == [TOKEN_MOUNT]  # loopback TCP: no socket volume


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


def app_pod(tmp_path: Path, values: str) -> Obj:
    parent = parent_chart(tmp_path, APP_TEMPLATE)
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '0.1.0'}}\n" + values)
    pod: Obj = one(render(chart=parent), "Pod")  # one() is Any to mypy (chart_render unfollowed)
    return pod


def test_the_app_container_shares_the_sidecars_socket_volume(tmp_path: Path) -> None:
    spec = app_pod(tmp_path, "")["spec"]
    (app,) = spec["containers"]
    (side,) = spec["initContainers"]
    assert app["env"] == [{"name": "KGROUP_SIDECAR_URL",
                           "value": "unix:///var/run/kgroup/sidecar.sock"}]
    socket = {"name": "kgroup-sidecar", "mountPath": "/var/run/kgroup"}
    assert app["volumeMounts"] == [socket]
    assert side["volumeMounts"] == [TOKEN_MOUNT, socket]
    assert spec["volumes"][0] == {"name": "kgroup-sidecar",
                                  "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert [v["name"] for v in spec["volumes"]] == ["kgroup-sidecar", "kgroup-sidecar-token"]


TOKEN_MOUNT = {"name": "kgroup-sidecar-token", "readOnly": True,
               "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}


def test_only_the_sidecar_mounts_an_api_token(tmp_path: Path) -> None:
    """The app container must not hold the worker's token. The token volume is a
    projected, pod-bound service-account token (what automount would give), mounted at
    the standard path into the sidecar alone."""
    spec = app_pod(tmp_path, "")["spec"]
    (app,) = spec["containers"]
    (side,) = spec["initContainers"]
    assert TOKEN_MOUNT in side["volumeMounts"]
    assert all("serviceaccount" not in m["mountPath"] for m in app["volumeMounts"])
    token = next(v for v in spec["volumes"] if v["name"] == "kgroup-sidecar-token")
    sources = token["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    assert {"key": "ca.crt", "path": "ca.crt"} in sources[1]["configMap"]["items"]
    assert sources[2]["downwardAPI"]["items"][0]["path"] == "namespace"


@pytest.mark.parametrize("name", ["worker-deployment.yaml", "worker-statefulset.yaml"])
def test_the_examples_give_the_app_container_no_token(name: str) -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / name).read_text()))
    pod = next(d for d in docs if d and d["kind"] in ("Deployment", "StatefulSet"))[
        "spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (side,) = [c for c in pod["initContainers"] if c["name"] == "kgroup-sidecar"]
    assert TOKEN_MOUNT in side["volumeMounts"]
    for app in pod["containers"]:
        assert all("serviceaccount" not in m["mountPath"] for m in app.get("volumeMounts", []))
    assert any(v["name"] == "kgroup-sidecar-token" for v in pod["volumes"])


def test_a_loopback_sidecar_needs_no_volume_and_the_api_address_reaches_the_sidecar(
        tmp_path: Path) -> None:
    spec = app_pod(tmp_path, "  sidecar: {listen: '127.0.0.1:9470', image: {tag: '0.1.0'}}\n"
                              "  kubernetesApi: {host: 127.0.0.1, port: 6443}\n")["spec"]
    (app,) = spec["containers"]
    (side,) = spec["initContainers"]
    assert app["env"] == [{"name": "KGROUP_SIDECAR_URL", "value": "http://127.0.0.1:9470"}]
    assert not app["volumeMounts"]
    assert [v["name"] for v in spec["volumes"]] == ["kgroup-sidecar-token"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
        "127.0.0.1", "6443")


def test_example_worker_deployment_matches_the_sidecar_template(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "worker-deployment.yaml").read_text()))
    example = one(docs, "Deployment")
    pod = example["spec"]["template"]["spec"]
    (side,) = [c for c in pod["initContainers"] if c["name"] == "kgroup-sidecar"]
    (app,) = pod["containers"]
    rendered = app_pod(tmp_path, "")["spec"]
    assert side == rendered["initContainers"][0]  # the chart's default probes: httpGet
    (url_env,) = rendered["containers"][0]["env"]
    assert url_env in app["env"]
    (mount,) = rendered["containers"][0]["volumeMounts"]
    assert mount in app["volumeMounts"]
    assert all(v in pod["volumes"] for v in rendered["volumes"])
    assert pod["automountServiceAccountToken"] is False
    # The worker starts: its Redis and stream settings come from the ConfigMap.
    config = one(docs, "ConfigMap")
    assert app["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    assert {"KGROUP_REDIS_URL", "KGROUP_STREAM"} <= set(config["data"])
    assert example["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


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


def test_log_format_reaches_both_components(tmp_path: Path) -> None:
    dep = one(render("operator.logFormat=json", "operator.logLevel=WARNING"), "Deployment")
    env = {e["name"]: e.get("value") for e in
           dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["KGROUP_LOG_FORMAT"], env["KGROUP_LOG_LEVEL"]) == ("json", "WARNING")
    pod = app_pod(tmp_path, "  sidecar: {logFormat: json, image: {tag: '0.1.0'}}\n")
    side = pod["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_LOG_FORMAT"]["value"] == "json"
    assert env["KGROUP_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "KGROUP_METRICS_LISTEN" not in env
    assert [p["name"] for p in side["ports"]] == ["kgroup-probe"]  # the probes' port only


def test_sidecar_metrics_bind_the_pod_ip_or_the_host_given(tmp_path: Path) -> None:
    side = app_pod(tmp_path, "  sidecar: {metrics: {enabled: true}, image: {tag: '0.1.0'}}\n"
                    )["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [e["name"] for e in side["env"]]
    assert names.index("KGROUP_POD_IP") < names.index("KGROUP_METRICS_LISTEN")  # $(...) order
    assert env["KGROUP_METRICS_LISTEN"]["value"] == "$(KGROUP_POD_IP):9471"
    assert side["ports"] == [
        {"name": "kgroup-probe", "containerPort": 8471, "protocol": "TCP"},
        {"name": "kgroup-metrics", "containerPort": 9471, "protocol": "TCP"}]
    assert names.count("KGROUP_POD_IP") == 1  # shared by the probes and the metrics
    side = app_pod(tmp_path / "b", "  sidecar: {metrics: {enabled: true, host: 127.0.0.1, "
                    "port: 9500}, image: {tag: '0.1.0'}}\n")["spec"]["initContainers"][0]
    env = {e["name"]: e for e in side["env"]}
    assert env["KGROUP_METRICS_LISTEN"]["value"] == "127.0.0.1:9500"
    side = app_pod(tmp_path / "c", "  sidecar: {metrics: {enabled: true, host: 127.0.0.1}, "
                    "probes: {mode: exec}, image: {tag: '0.1.0'}}\n")["spec"]["initContainers"][0]
    assert "KGROUP_POD_IP" not in {e["name"] for e in side["env"]}  # neither needs it


def test_a_readiness_period_set_by_hand_wins_in_either_mode(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, POD_TEMPLATE % {"where": "initContainers", "extra": ""})
    for mode in ("http", "exec"):
        (parent / "values.yaml").write_text(
            "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '9.9.9'}, "
            f"probes: {{mode: {mode}}}, readinessProbe: {{periodSeconds: 4}}}}\n")
        (side,) = one(render(chart=parent), "Pod")["spec"]["initContainers"]
        assert side["readinessProbe"]["periodSeconds"] == 4
        assert side["readinessProbe"]["failureThreshold"] == 1
