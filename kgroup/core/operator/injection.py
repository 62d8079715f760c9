"""The sidecar injector's decision: a pod (as the API server is about to create it) in, the
pod with the kgroup sidecar out. Pure: no I/O, no clock.

One source of truth with the chart. The chart's named templates (``kgroup.sidecarContainer``,
``kgroup.sidecarVolume``, ``kgroup.sidecarVolumeMount``, ``kgroup.sidecarUrlEnv``) are what
Helm users ``include``; this module renders the same objects from the same values (the
chart hands its ``sidecar`` values to the operator as JSON, :func:`defaults_from_values`),
and ``tests/test_injection_chart.py`` proves, for each probe mode, listen address and
option, that a pod injected here equals the pod the chart's templates render. A Go
template cannot run in the operator, and a rendered copy of the sidecar could not take
per-pod overrides that change its shape (probe mode, listen), hence a Python rendering
held equal by a test.

A pod is injected when it carries the label ``kgroup.dev/group`` (the webhook's
objectSelector sends no other pod here). Left alone (``None``): a pod that has a
container named ``kgroup-sidecar`` already (reinvocation, or a pod written from the
chart's templates by hand). Refused (:class:`InjectionRefused`, the webhook denies the
pod with its message): a bad override annotation, or a pod that has a volume of the
sidecar's name without the sidecar.

Per-pod overrides (annotations; everything else is the chart's values):
``sidecar.kgroup.dev/resources`` (JSON: ``{"requests": {...}, "limits": {...}}``),
``sidecar.kgroup.dev/log-level`` (DEBUG, INFO, WARNING, ERROR),
``sidecar.kgroup.dev/probe-mode`` (http, exec), ``sidecar.kgroup.dev/listen``
(``unix:///dir/file.sock`` or ``127.0.0.1:<port>``), ``sidecar.kgroup.dev/audit-volume``
(a volume of the pod where the sidecar appends its ownership audit; refused when the pod
has no volume of that name).
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kgroup import constants as C
from kgroup.core.objects import Obj

__all__ = [
    "ANNOTATION_INJECTED",
    "OVERRIDES",
    "InjectionRefused",
    "SidecarDefaults",
    "defaults_from_values",
    "has_sidecar",
    "inject",
    "needs_sidecar",
]


ANNOTATION_INJECTED = "sidecar.kgroup.dev/injected"
"""Set on an injected pod: the sidecar image the injector put in."""
ANNOTATION_RESOURCES = "sidecar.kgroup.dev/resources"
ANNOTATION_LOG_LEVEL = "sidecar.kgroup.dev/log-level"
ANNOTATION_PROBE_MODE = "sidecar.kgroup.dev/probe-mode"
ANNOTATION_LISTEN = "sidecar.kgroup.dev/listen"
ANNOTATION_AUDIT_VOLUME = "sidecar.kgroup.dev/audit-volume"
OVERRIDES = (ANNOTATION_RESOURCES, ANNOTATION_LOG_LEVEL, ANNOTATION_PROBE_MODE,
             ANNOTATION_LISTEN, ANNOTATION_AUDIT_VOLUME)

SOCKET_VOLUME = "kgroup-sidecar"
TOKEN_VOLUME = "kgroup-sidecar-token"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
PROBE_MODES = ("http", "exec")
_LISTEN = re.compile(r"^(unix:///[^\s]+/[^/\s]+|127\.0\.0\.1:[0-9]{1,5})$")
_VOLUME_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label
AUDIT_DIR = "/var/run/kgroup-audit"
"""Where the audit volume is mounted in the sidecar; its file is <pod name>.jsonl."""


class InjectionRefused(ValueError):
    """The pod cannot be injected as written; the message says what to change."""


@dataclass(frozen=True)
class SidecarDefaults:
    """The chart's sidecar values, resolved (image tag filled in)."""

    image: str
    pull_policy: str = "IfNotPresent"
    native: bool = True
    listen: str = "unix:///var/run/kgroup/sidecar.sock"
    app_timeout_seconds: int = 60
    log_level: str = "INFO"
    log_format: str = "text"
    probe_mode: str = "http"
    probe_port: int = 8471
    metrics_enabled: bool = False
    metrics_host: str = ""
    metrics_port: int = 9471
    readiness: Mapping[str, Any] | None = None
    resources: Mapping[str, Any] | None = None
    api_host: str = ""
    api_port: int = 443
    service_account: str = "kgroup-worker"
    audit_volume: str = ""


def _need(values: Mapping[str, Any], key: str) -> Any:
    if key not in values:
        raise InjectionRefused(f"the injector's sidecar values lack {key!r}")
    return values[key]


def defaults_from_values(values: Mapping[str, Any]) -> SidecarDefaults:
    """The chart's JSON (``sidecar`` values plus ``image``, ``kubernetesApi`` and
    ``serviceAccountName``) as :class:`SidecarDefaults`; a missing or bad key refuses."""
    side = _need(values, "sidecar")
    metrics, probes = _need(side, "metrics"), _need(side, "probes")
    api = values.get("kubernetesApi") or {}
    d = SidecarDefaults(
        image=str(_need(values, "image")),
        pull_policy=str(side["image"]["pullPolicy"]),
        native=bool(_need(side, "native")),
        listen=str(_need(side, "listen")),
        app_timeout_seconds=int(_need(side, "appTimeoutSeconds")),
        log_level=str(_need(side, "logLevel")),
        log_format=str(_need(side, "logFormat")),
        probe_mode=str(_need(probes, "mode")),
        probe_port=int(_need(probes, "port")),
        metrics_enabled=bool(_need(metrics, "enabled")),
        metrics_host=str(metrics.get("host") or ""),
        metrics_port=int(_need(metrics, "port")),
        readiness=dict(_need(side, "readinessProbe")),
        resources=dict(_need(side, "resources")),
        api_host=str(api.get("host") or ""),
        api_port=int(api.get("port") or 443),
        service_account=str(_need(values, "serviceAccountName")),
        audit_volume=str(side.get("auditVolume") or ""),
    )
    _check(d)
    return d


def _check(d: SidecarDefaults) -> None:
    if d.log_level not in LOG_LEVELS:
        raise InjectionRefused(f"log level {d.log_level!r}: expected one of {LOG_LEVELS}")
    if d.probe_mode not in PROBE_MODES:
        raise InjectionRefused(f"probe mode {d.probe_mode!r}: expected one of {PROBE_MODES}")
    if not _LISTEN.match(d.listen):
        raise InjectionRefused(
            f"listen {d.listen!r}: expected unix:///dir/file.sock or 127.0.0.1:<port>")
    if d.probe_mode == "exec" and not d.listen.startswith("unix://"):
        raise InjectionRefused("probe mode exec keeps its files in the socket's volume: "
                               "listen must be unix:///dir/file.sock")
    if d.audit_volume and not _VOLUME_NAME.match(d.audit_volume):
        raise InjectionRefused(f"audit volume {d.audit_volume!r}: expected a volume name "
                               "(lower-case letters, digits and '-', at most 63)")


def _resources(text: str) -> Obj:
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise InjectionRefused(f"{ANNOTATION_RESOURCES}: not JSON ({exc})") from None
    if not isinstance(parsed, dict) or not set(parsed) <= {"requests", "limits"} or not all(
            isinstance(v, dict) for v in parsed.values()):
        raise InjectionRefused(f"{ANNOTATION_RESOURCES}: expected a JSON object with "
                               "requests and/or limits, e.g. "
                               '{"requests": {"cpu": "20m"}, "limits": {"memory": "128Mi"}}')
    return parsed


def with_overrides(d: SidecarDefaults, annotations: Mapping[str, str]) -> SidecarDefaults:
    """``d`` with the pod's override annotations applied; a bad one refuses."""
    unknown = sorted(k for k in annotations
                     if k.startswith("sidecar.kgroup.dev/") and k not in OVERRIDES
                     and k != ANNOTATION_INJECTED)
    if unknown:
        raise InjectionRefused(f"unknown annotation {unknown[0]!r}: the overrides are "
                               f"{', '.join(OVERRIDES)}")
    out = d
    if ANNOTATION_RESOURCES in annotations:
        out = replace(out, resources=_resources(annotations[ANNOTATION_RESOURCES]))
    if ANNOTATION_LOG_LEVEL in annotations:
        out = replace(out, log_level=annotations[ANNOTATION_LOG_LEVEL].upper())
    if ANNOTATION_PROBE_MODE in annotations:
        out = replace(out, probe_mode=annotations[ANNOTATION_PROBE_MODE].lower())
    if ANNOTATION_LISTEN in annotations:
        out = replace(out, listen=annotations[ANNOTATION_LISTEN])
    if ANNOTATION_AUDIT_VOLUME in annotations:
        out = replace(out, audit_volume=annotations[ANNOTATION_AUDIT_VOLUME])
    try:
        _check(out)
    except InjectionRefused as exc:
        raise InjectionRefused(f"the pod's sidecar.kgroup.dev annotations: {exc}") from None
    return out


def socket_dir(listen: str) -> str:
    """The directory of a ``unix://`` address, "" for loopback TCP."""
    return posixpath.dirname(listen[len("unix://"):]) if listen.startswith("unix://") else ""


def _probe(d: SidecarDefaults, path: str, file: str, minutes: str) -> Obj:
    if d.probe_mode == "exec":
        target = f"{socket_dir(d.listen)}/probe/{file}"
        return {"exec": {"command": ["find", target, "-mmin", minutes, "-exec", "false", "{}",
                                     "+"]}}
    return {"httpGet": {"path": path, "port": "kgroup-probe"}}


def _env(d: SidecarDefaults, group: str) -> list[Obj]:
    def field(path: str) -> Obj:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    env: list[Obj] = [
        {"name": "KGROUP_GROUP", "value": group},
        {"name": "KGROUP_NAMESPACE", **field("metadata.namespace")},
        {"name": "KGROUP_POD_NAME", **field("metadata.name")},
        {"name": "KGROUP_POD_UID", **field("metadata.uid")},
        {"name": "KGROUP_LISTEN", "value": d.listen},
        {"name": "KGROUP_APP_TIMEOUT_SECONDS", "value": str(d.app_timeout_seconds)},
        {"name": "KGROUP_LOG_LEVEL", "value": d.log_level},
        {"name": "KGROUP_LOG_FORMAT", "value": d.log_format},
    ]
    if d.probe_mode == "http" or (d.metrics_enabled and not d.metrics_host):
        env.append({"name": "KGROUP_POD_IP", **field("status.podIP")})
    if d.probe_mode == "http":
        env.append({"name": "KGROUP_PROBE_LISTEN", "value": f"$(KGROUP_POD_IP):{d.probe_port}"})
    else:
        env.append({"name": "KGROUP_PROBE_DIR", "value": f"{socket_dir(d.listen)}/probe"})
    if d.metrics_enabled:
        host = d.metrics_host or "$(KGROUP_POD_IP)"
        env.append({"name": "KGROUP_METRICS_LISTEN", "value": f"{host}:{d.metrics_port}"})
    if d.api_host:
        env += [{"name": "KUBERNETES_SERVICE_HOST", "value": d.api_host},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(d.api_port)}]
    if d.audit_volume:
        env.append({"name": "KGROUP_AUDIT_FILE",
                    "value": f"{AUDIT_DIR}/$(KGROUP_POD_NAME).jsonl"})
    return env


def sidecar_container(d: SidecarDefaults, group: str) -> Obj:
    """The container ``kgroup.sidecarContainer`` renders for these values."""
    c: Obj = {"name": C.SIDECAR_CONTAINER, "image": d.image, "imagePullPolicy": d.pull_policy}
    if d.native:
        c["restartPolicy"] = "Always"
    c["command"] = ["kgroup-sidecar"]
    c["env"] = _env(d, group)
    ports = []
    if d.probe_mode == "http":
        ports.append({"name": "kgroup-probe", "containerPort": d.probe_port, "protocol": "TCP"})
    if d.metrics_enabled:
        ports.append({"name": "kgroup-metrics", "containerPort": d.metrics_port,
                      "protocol": "TCP"})
    if ports:
        c["ports"] = ports
    exec_ = d.probe_mode == "exec"
    alive = _probe(d, "/livez", "alive", "+0.5")
    c["startupProbe"] = {**alive, "periodSeconds": 1, "timeoutSeconds": 3,
                         "failureThreshold": 60}
    if not exec_:  # exec: the sidecar's own watchdog (kgroup_sidecar.watchdog), no runc exec
        c["livenessProbe"] = {**alive, "periodSeconds": 10, "timeoutSeconds": 5,
                              "failureThreshold": 3}
    timing = dict(d.readiness or {})
    if not timing.get("periodSeconds"):
        timing["periodSeconds"] = 15 if exec_ else 2
    c["readinessProbe"] = {**_probe(d, "/readyz", "ready", "+0.25"), **timing}
    c["securityContext"] = {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "privileged": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    c["resources"] = copy.deepcopy(dict(d.resources or {}))
    c["volumeMounts"] = [{"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True},
                         *_socket_mount(d)]
    if d.audit_volume:
        c["volumeMounts"].append({"name": d.audit_volume, "mountPath": AUDIT_DIR})
    return c


def _socket_mount(d: SidecarDefaults) -> list[Obj]:
    sdir = socket_dir(d.listen)
    return [{"name": SOCKET_VOLUME, "mountPath": sdir}] if sdir else []


def sidecar_volumes(d: SidecarDefaults) -> list[Obj]:
    """The volumes ``kgroup.sidecarVolume`` renders: the socket's emptyDir (unix://) and
    the sidecar's projected token."""
    vols: list[Obj] = []
    if socket_dir(d.listen):
        vols.append({"name": SOCKET_VOLUME,
                     "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    vols.append({"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt",
                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
    return vols


def sidecar_url(listen: str) -> str:
    """KGROUP_SIDECAR_URL of the app (``kgroup.sidecarUrlEnv``)."""
    return listen if listen.startswith("unix://") else f"http://{listen}"


def has_sidecar(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return any(c.get("name") == C.SIDECAR_CONTAINER
               for key in ("initContainers", "containers") for c in spec.get(key) or [])


def needs_sidecar(pod: Mapping[str, Any]) -> bool:
    """A pod labelled with a group that runs without the sidecar: it takes no part in its
    group (reported on the group, never silently idle)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(C.LABEL_GROUP)) and not has_sidecar(pod)


def _app_container(c: Obj, d: SidecarDefaults) -> Obj:
    out = copy.deepcopy(c)
    env = out.get("env") or []
    if not any(e.get("name") == "KGROUP_SIDECAR_URL" for e in env):
        # first: the app's own variables may refer to it as $(KGROUP_SIDECAR_URL)
        out["env"] = [{"name": "KGROUP_SIDECAR_URL", "value": sidecar_url(d.listen)}, *env]
    mounts = _socket_mount(d)
    if mounts and not any(m.get("name") == SOCKET_VOLUME for m in out.get("volumeMounts") or []):
        out.setdefault("volumeMounts", []).extend(mounts)
    return out


def _automounted(vol: Mapping[str, Any]) -> bool:
    """The token volume the API server's ServiceAccount admission plugin added (it runs
    before the webhooks, while the pod still allowed automount): ``kube-api-access-*``."""
    sources = (vol.get("projected") or {}).get("sources") or []
    return str(vol.get("name", "")).startswith("kube-api-access-") and any(
        "serviceAccountToken" in s for s in sources)


def _drop_automount(spec: Obj) -> None:
    """Take the automounted API token back out of the pod: only the sidecar holds one."""
    gone = {v["name"] for v in spec.get("volumes") or [] if _automounted(v)}
    if not gone:
        return
    spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in gone]
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if "volumeMounts" in c:
                c["volumeMounts"] = [m for m in c["volumeMounts"] if m.get("name") not in gone]
                if not c["volumeMounts"]:
                    del c["volumeMounts"]


def inject(pod: Mapping[str, Any], defaults: SidecarDefaults) -> Obj | None:
    """The pod with the sidecar, as the chart's templates render it for its group (the
    label ``kgroup.dev/group``); None when it needs nothing (no label, or a sidecar
    already). Every app container gets ``KGROUP_SIDECAR_URL`` (its first variable) and
    the socket's mount (its last);
    the pod gets the worker service account (unless it names one of its own),
    ``automountServiceAccountToken: false`` and the sidecar's volumes; the token volume
    the API server automounted (before the webhook ran) is taken out again."""
    meta = pod.get("metadata") or {}
    group = (meta.get("labels") or {}).get(C.LABEL_GROUP)
    if not group or has_sidecar(pod):
        return None
    d = with_overrides(defaults, meta.get("annotations") or {})
    out: Obj = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    _drop_automount(spec)
    taken = {v.get("name") for v in spec.get("volumes") or []}
    clash = sorted(taken & {SOCKET_VOLUME, TOKEN_VOLUME})
    if clash:
        raise InjectionRefused(f"the pod has a volume named {clash[0]!r} but no "
                               f"{C.SIDECAR_CONTAINER} container: remove it, or write the "
                               "whole sidecar by hand (then nothing is injected)")
    if d.audit_volume and d.audit_volume not in taken:
        raise InjectionRefused(f"{ANNOTATION_AUDIT_VOLUME} (or sidecar.auditVolume) names "
                               f"the volume {d.audit_volume!r}, which the pod does not have: "
                               "add it to the pod's volumes")
    spec["containers"] = [_app_container(c, d) for c in spec.get("containers") or []]
    side = sidecar_container(d, group)
    if d.native:
        spec["initContainers"] = [*(spec.get("initContainers") or []), side]
    else:
        spec["containers"].append(side)
    spec["volumes"] = [*(spec.get("volumes") or []), *sidecar_volumes(d)]
    if spec.get("serviceAccountName") in (None, "", "default"):
        spec["serviceAccountName"] = d.service_account
    spec.pop("serviceAccount", None)
    spec["automountServiceAccountToken"] = False
    out.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_INJECTED] = d.image
    return out
