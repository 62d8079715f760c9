"""The injector's decision (kgroup.core.operator.injection), pure: pods in, pods out.
That the injected sidecar equals the chart's: tests/test_injection_chart.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kgroup.core.objects import Obj
from kgroup.core.operator.injection import (
    ANNOTATION_INJECTED,
    InjectionRefused,
    SidecarDefaults,
    defaults_from_values,
    has_sidecar,
    inject,
    needs_sidecar,
)

D = SidecarDefaults(image="ghcr.io/kgroup/kgroup-sidecar:0.1.0",
                    readiness={"periodSeconds": None, "timeoutSeconds": 3},
                    resources={"requests": {"cpu": "20m"}})


def pod(labels: Obj | None = None, annotations: Obj | None = None, **spec: Any) -> Obj:
    meta: Obj = {"name": "w", "namespace": "orders",
                 "labels": {"kgroup.dev/group": "orders"} if labels is None else labels}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "app", "image": "app"}], **spec}}


def env(c: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_a_labelled_pod_gets_the_native_sidecar_its_volumes_and_the_apps_env() -> None:
    out = inject(pod(), D)
    assert out is not None
    spec = out["spec"]
    (side,) = spec["initContainers"]
    assert side["name"] == "kgroup-sidecar" and side["restartPolicy"] == "Always"
    assert env(side)["KGROUP_GROUP"] == "orders"
    assert side["readinessProbe"]["periodSeconds"] == 2  # http's default
    (app,) = spec["containers"]
    assert env(app)["KGROUP_SIDECAR_URL"] == "unix:///var/run/kgroup/sidecar.sock"
    assert app["volumeMounts"] == [{"name": "kgroup-sidecar", "mountPath": "/var/run/kgroup"}]
    assert [v["name"] for v in spec["volumes"]] == ["kgroup-sidecar", "kgroup-sidecar-token"]
    assert spec["serviceAccountName"] == "kgroup-worker"
    assert spec["automountServiceAccountToken"] is False
    assert out["metadata"]["annotations"][ANNOTATION_INJECTED] == D.image


def test_the_input_is_not_changed_and_a_second_pass_changes_nothing() -> None:
    p = pod()
    before = copy.deepcopy(p)
    out = inject(p, D)
    assert p == before
    assert out is not None and has_sidecar(out) and not needs_sidecar(out)
    assert inject(out, D) is None  # reinvocation


def test_unlabelled_pods_and_pods_with_a_sidecar_are_left_alone() -> None:
    assert inject(pod(labels={"app": "x"}), D) is None
    assert inject(pod(labels={"kgroup.dev/group": ""}), D) is None
    by_hand = pod(initContainers=[{"name": "kgroup-sidecar", "image": "mine"}])
    assert inject(by_hand, D) is None
    plain = pod()
    plain["spec"]["containers"].append({"name": "kgroup-sidecar", "image": "mine"})
    assert inject(plain, D) is None
    assert needs_sidecar(pod()) and not needs_sidecar(pod(labels={}))


def test_the_automounted_token_is_taken_back_out() -> None:
    auto = {"name": "kube-api-access-x1z2q", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}
    mount = {"name": "kube-api-access-x1z2q",
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    mine = {"name": "kube-api-access-mine", "configMap": {"name": "c"}}  # not a token
    p = pod(volumes=[auto, mine], serviceAccountName="default")
    p["spec"]["containers"][0]["volumeMounts"] = [mount]
    out = inject(p, D)
    assert out is not None
    names = [v["name"] for v in out["spec"]["volumes"]]
    assert "kube-api-access-x1z2q" not in names and "kube-api-access-mine" in names
    assert all(m["name"] != mount["name"] for m in out["spec"]["containers"][0]["volumeMounts"])
    assert out["spec"]["serviceAccountName"] == "kgroup-worker"  # "default" is replaced


def test_the_pods_own_service_account_and_env_win() -> None:
    p = pod(serviceAccountName="legacy-worker")
    p["spec"]["containers"][0]["env"] = [{"name": "KGROUP_SIDECAR_URL", "value": "x"}]
    out = inject(p, D)
    assert out is not None
    assert out["spec"]["serviceAccountName"] == "legacy-worker"
    assert env(out["spec"]["containers"][0])["KGROUP_SIDECAR_URL"] == "x"


def test_overrides_by_annotation() -> None:
    out = inject(pod(annotations={
        "sidecar.kgroup.dev/resources": json.dumps({"limits": {"memory": "64Mi"}}),
        "sidecar.kgroup.dev/log-level": "debug",
        "sidecar.kgroup.dev/probe-mode": "exec",
        "sidecar.kgroup.dev/listen": "unix:///run/kg/s.sock"}), D)
    assert out is not None
    (side,) = out["spec"]["initContainers"]
    assert side["resources"] == {"limits": {"memory": "64Mi"}}
    e = env(side)
    assert e["KGROUP_LOG_LEVEL"] == "DEBUG" and e["KGROUP_LISTEN"] == "unix:///run/kg/s.sock"
    assert e["KGROUP_PROBE_DIR"] == "/run/kg/probe" and "ports" not in side
    assert side["readinessProbe"]["exec"]["command"][1] == "/run/kg/probe/ready"
    assert env(out["spec"]["containers"][0])["KGROUP_SIDECAR_URL"] == "unix:///run/kg/s.sock"


def test_an_audit_volume_is_mounted_in_the_sidecar_alone_with_its_file_per_pod() -> None:
    audit = {"name": "audit", "hostPath": {"path": "/var/log/kgroup", "type": "Directory"}}
    out = inject(pod(annotations={"sidecar.kgroup.dev/audit-volume": "audit"},
                     volumes=[audit]), D)
    assert out is not None
    (side,) = out["spec"]["initContainers"]
    assert env(side)["KGROUP_AUDIT_FILE"] == "/var/run/kgroup-audit/$(KGROUP_POD_NAME).jsonl"
    assert {"name": "audit", "mountPath": "/var/run/kgroup-audit"} in side["volumeMounts"]
    app = out["spec"]["containers"][0]
    assert "KGROUP_AUDIT_FILE" not in env(app)
    assert all(m["name"] != "audit" for m in app.get("volumeMounts", []))
    assert out["spec"]["volumes"][0] == audit  # the pod's own, unchanged and not doubled
    assert [v["name"] for v in out["spec"]["volumes"]].count("audit") == 1
    # without the annotation: no audit
    plain = inject(pod(volumes=[audit]), D)
    assert plain is not None and "KGROUP_AUDIT_FILE" not in env(plain["spec"]["initContainers"][0])


def test_a_loopback_listen_needs_no_socket_volume() -> None:
    out = inject(pod(annotations={"sidecar.kgroup.dev/listen": "127.0.0.1:8470"}), D)
    assert out is not None
    assert [v["name"] for v in out["spec"]["volumes"]] == ["kgroup-sidecar-token"]
    assert env(out["spec"]["containers"][0])["KGROUP_SIDECAR_URL"] == "http://127.0.0.1:8470"
    assert "volumeMounts" not in out["spec"]["containers"][0]


@pytest.mark.parametrize(("annotations", "says"), [
    ({"sidecar.kgroup.dev/log-level": "LOUD"}, "log level"),
    ({"sidecar.kgroup.dev/probe-mode": "tcp"}, "probe mode"),
    ({"sidecar.kgroup.dev/listen": "0.0.0.0:80"}, "listen"),
    ({"sidecar.kgroup.dev/listen": "127.0.0.1:80",
      "sidecar.kgroup.dev/probe-mode": "exec"}, "socket"),
    ({"sidecar.kgroup.dev/resources": "{cpu: 1}"}, "not JSON"),
    ({"sidecar.kgroup.dev/resources": '{"cpu": "1"}'}, "requests and/or limits"),
    ({"sidecar.kgroup.dev/log-levle": "DEBUG"}, "unknown annotation"),
    ({"sidecar.kgroup.dev/audit-volume": "Audit_Dir"}, "expected a volume name"),
    ({"sidecar.kgroup.dev/audit-volume": "audit"}, "which the pod does not have"),
])
def test_bad_overrides_are_refused_with_the_reason(annotations: Obj, says: str) -> None:
    with pytest.raises(InjectionRefused, match=says):
        inject(pod(annotations=annotations), D)


def test_a_volume_of_the_sidecars_name_without_the_sidecar_is_refused() -> None:
    with pytest.raises(InjectionRefused, match="kgroup-sidecar"):
        inject(pod(volumes=[{"name": "kgroup-sidecar", "emptyDir": {}}]), D)


def test_defaults_from_values_refuse_what_is_missing_or_bad() -> None:
    with pytest.raises(InjectionRefused, match="sidecar"):
        defaults_from_values({})
    with pytest.raises(InjectionRefused, match="image"):
        defaults_from_values({"sidecar": {"metrics": {}, "probes": {}}})
