"""One source of truth: the pod the injector makes equals the pod the chart's named
templates render, for the same values (no cluster, only `helm template`).

Each case renders, in one `helm template` of the chart (plus a pod written from its named
templates, as a Helm user writes one), both the operator's Deployment and that pod. The
operator's KGROUP_INJECTOR_SIDECAR (the values it injects from) then goes through
kgroup.core.operator.injection.inject on the bare pod (the app and the label), and the
result must equal the chart's pod. An override by annotation must equal the chart
rendered with that value set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from chart_render import CHART, one, render

from kgroup.core.objects import Obj
from kgroup.core.operator.injection import ANNOTATION_INJECTED, defaults_from_values, inject

REFERENCE_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: w
  labels: {kgroup.dev/group: orders}
spec:
  serviceAccountName: {{ .Values.workerRbac.serviceAccountName }}
  automountServiceAccountToken: false
  {{- if .Values.sidecar.native }}
  initContainers:
    {{- include "kgroup.sidecarContainer" (dict "root" $ "group" "orders") | nindent 4 }}
  {{- end }}
  containers:
    - name: app
      image: app
      env:
        {{- include "kgroup.sidecarUrlEnv" (dict "root" $) | nindent 8 }}
      {{- with include "kgroup.sidecarVolumeMount" (dict "root" $) }}
      volumeMounts:
        {{- . | nindent 8 }}
      {{- end }}
    {{- if not .Values.sidecar.native }}
    {{- include "kgroup.sidecarContainer" (dict "root" $ "group" "orders") | nindent 4 }}
    {{- end }}
  volumes:
    - name: audit
      emptyDir: {}
    {{- include "kgroup.sidecarVolume" (dict "root" $) | nindent 4 }}
"""

BARE_POD: Obj = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "w", "labels": {"kgroup.dev/group": "orders"}},
                 "spec": {"containers": [{"name": "app", "image": "app"}],
                          "volumes": [{"name": "audit", "emptyDir": {}}]}}


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("chart") / "kgroup"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "reference-pod.yaml").write_text(REFERENCE_POD)
    return copy


def rendered(chart: Path, *sets: str) -> tuple[Obj, Any]:
    objs = render("injector.enabled=true", *sets, chart=chart)
    op = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in op["env"]}
    return one(objs, "Pod"), defaults_from_values(json.loads(env["KGROUP_INJECTOR_SIDECAR"]))


def injected(defaults: Any, annotations: dict[str, str] | None = None) -> Obj:
    bare = json.loads(json.dumps(BARE_POD))
    if annotations:
        bare["metadata"]["annotations"] = dict(annotations)
    out = inject(bare, defaults)
    assert out is not None
    assert out["metadata"]["annotations"].pop(ANNOTATION_INJECTED) == defaults.image
    if not annotations:
        del out["metadata"]["annotations"]
    return out


VALUE_SETS = [
    (),
    ("sidecar.probes.mode=exec",),
    ("sidecar.listen=127.0.0.1:8470",),
    ("sidecar.native=false",),
    ("sidecar.metrics.enabled=true",),
    ("sidecar.metrics.enabled=true", "sidecar.metrics.host=127.0.0.1",
     "sidecar.probes.mode=exec"),
    ("kubernetesApi.host=10.0.0.1", "kubernetesApi.port=6443"),
    ("sidecar.auditVolume=audit", "sidecar.probes.mode=exec"),
    ("sidecar.image.tag=9.9.9", "sidecar.image.pullPolicy=Always",
     "sidecar.readinessProbe.periodSeconds=5", "sidecar.appTimeoutSeconds=0",
     "sidecar.logFormat=json", "workerRbac.serviceAccountName=orders-worker"),
]


@pytest.mark.parametrize("sets", VALUE_SETS, ids=lambda s: ",".join(s) or "defaults")
def test_the_injected_pod_is_the_pod_the_chart_renders(chart: Path, sets: tuple[str, ...]) -> None:
    reference, defaults = rendered(chart, *sets)
    assert injected(defaults) == reference


OVERRIDES = [
    ({"sidecar.kgroup.dev/log-level": "DEBUG"}, ("sidecar.logLevel=DEBUG",)),
    ({"sidecar.kgroup.dev/probe-mode": "exec"}, ("sidecar.probes.mode=exec",)),
    ({"sidecar.kgroup.dev/listen": "unix:///run/kg/s.sock"},
     ("sidecar.listen=unix:///run/kg/s.sock",)),
    ({"sidecar.kgroup.dev/audit-volume": "audit"}, ("sidecar.auditVolume=audit",)),
    ({"sidecar.kgroup.dev/resources": '{"requests": {"cpu": "5m"}, "limits": {"memory": "64Mi"}}'},
     ("sidecar.resources.requests.cpu=5m", "sidecar.resources.requests.memory=null",
      "sidecar.resources.limits.memory=64Mi", "sidecar.resources.limits.cpu=null")),
]


@pytest.mark.parametrize(("annotations", "sets"), OVERRIDES,
                         ids=lambda x: ",".join(x) if isinstance(x, dict) else "")
def test_an_override_by_annotation_is_the_chart_with_that_value(
        chart: Path, annotations: dict[str, str], sets: tuple[str, ...]) -> None:
    _, defaults = rendered(chart)
    reference, _ = rendered(chart, *sets)
    reference["metadata"]["annotations"] = dict(annotations)
    assert injected(defaults, annotations) == reference
