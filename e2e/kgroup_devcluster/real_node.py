"""examples/ as they run on the local real node: the user's manifests plus what a node
without a pod network needs, nothing else.

The chart's own objects take `e2e/values-real-node.yaml`; the worker Deployment of
`examples/worker-deployment.yaml` (or the StatefulSet of `examples/worker-statefulset.yaml`,
the same pod) is the user's, so the same settings are added here, each
one a field a user of such a node would add by hand (the example's header lists them):
hostNetwork with the node's resolver, the API server on loopback for the sidecar, the
sidecar's exec probes instead of httpGet (a hostNetwork pod has no port of its own: the
chart's `sidecar.probes.mode: exec`, `exec_probes`), the real node's label and taint,
images that are never pulled, and where Redis is.
Pure: manifests in, manifests out (``kubectl apply`` is the caller's).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kgroup.core.objects import Obj
from kgroup_sidecar.probe_files import (
    ALIVE,
    READINESS_PERIOD_SECONDS,
    READY,
    probe_command,
)

from .cluster import REPO

EXAMPLE = REPO / "examples" / "worker-deployment.yaml"
STATEFULSET_EXAMPLE = REPO / "examples" / "worker-statefulset.yaml"
PDB_EXAMPLE = REPO / "examples" / "worker-pdb.yaml"
WORKLOADS = ("Deployment", "StatefulSet")
GROUP_EXAMPLE = REPO / "examples" / "consumergroup.yaml"
NODE_LABEL = "kgroup.dev/node"
NODE_VALUE = "real"


# The local node has 2 cores for every pod of a test: the example's CPU requests (a worker
# asks for half a core, as a production worker would) would leave a 4-worker group plus a
# surge pod Pending. Tests and the demo ask for little CPU; memory requests and every limit
# stay the example's (24 GiB hold them).
SMALL_CPU_REQUEST = "50m"
PROBE_DIR = "/var/run/kgroup/probe"  # in the socket's emptyDir, as the chart renders it


def exec_probes(sidecar: Obj, probe_dir: str = PROBE_DIR) -> None:
    """The sidecar container switched from httpGet probes to the exec probes of the chart's
    `sidecar.probes.mode: exec` (tests/test_real_node_manifests.py compares the two)."""
    sidecar["env"] = [e for e in sidecar["env"]
                      if e["name"] not in ("KGROUP_POD_IP", "KGROUP_PROBE_LISTEN")]
    sidecar["env"].append({"name": "KGROUP_PROBE_DIR", "value": probe_dir})
    ports = [p for p in sidecar.get("ports", []) if p.get("name") != "kgroup-probe"]
    if ports:
        sidecar["ports"] = ports
    else:
        sidecar.pop("ports", None)
    for key, name in (("startupProbe", ALIVE), ("readinessProbe", READY)):
        probe = sidecar[key]
        probe.pop("httpGet", None)
        probe["exec"] = {"command": probe_command(probe_dir, name)}
    # each exec costs the container 17-30 ms of CPU (runc): fewer of them than http probes,
    # and no liveness probe (the sidecar's watchdog exits it when its loop is stuck)
    sidecar.pop("livenessProbe", None)
    sidecar["readinessProbe"]["periodSeconds"] = READINESS_PERIOD_SECONDS


def http_probe_port(sidecar: Obj, port: int) -> None:
    """The example's httpGet probes kept, on ``port`` (a hostNetwork pod's container port
    is a port of the node: the scheduler places one such pod per node and port, so this
    serves one worker per node, e.g. to measure what httpGet probes cost there)."""
    for p in sidecar["ports"]:
        if p["name"] == "kgroup-probe":
            p["containerPort"] = port
    for e in sidecar["env"]:
        if e["name"] == "KGROUP_PROBE_LISTEN":
            e["value"] = f"$(KGROUP_POD_IP):{port}"


def example_workers(*, api_port: int, redis_url: str, stream: str | None = None,
                    replicas: int | None = None, path: Path = EXAMPLE,
                    command: list[str] | None = None, small_requests: bool = False,
                    audit_dir: Path | None = None,
                    sidecar_env: dict[str, str] | None = None,
                    http_probes_on: int | None = None) -> list[Obj]:
    """The example's ConfigMap and Deployment (or, with `path=STATEFULSET_EXAMPLE`, its
    ConfigMap, headless Service and StatefulSet), placed on the real node.

    The keyword arguments are what a test or the demo changes beyond placement: the app's
    command (the PySpark job instead of the light worker), small resource requests, an
    ownership audit file per sidecar in a hostPath directory (`audit_dir`, a test's
    instrument, not a deployment's) and extra sidecar settings. ``http_probes_on``: keep
    the example's httpGet probes on that port instead of the exec probes (one worker per
    node: :func:`http_probe_port`).
    """
    docs: list[Obj] = [copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["KGROUP_REDIS_URL"] = redis_url
            if stream is not None:
                doc["data"]["KGROUP_STREAM"] = stream
        elif doc["kind"] in WORKLOADS:
            if replicas is not None:
                doc["spec"]["replicas"] = replicas
            pod = doc["spec"]["template"]["spec"]
            pod["hostNetwork"] = True
            pod["dnsPolicy"] = "Default"
            pod["nodeSelector"] = {NODE_LABEL: NODE_VALUE}
            pod["tolerations"] = [{"key": NODE_LABEL, "operator": "Equal",
                                   "value": NODE_VALUE, "effect": "NoSchedule"}]
            for c in pod.get("initContainers", []) + pod["containers"]:
                c["imagePullPolicy"] = "Never"
                if small_requests:
                    c.setdefault("resources", {}).setdefault("requests", {})["cpu"] = (
                        SMALL_CPU_REQUEST)
                if c["name"] == "kgroup-sidecar":
                    if http_probes_on is None:
                        exec_probes(c)
                    else:
                        http_probe_port(c, http_probes_on)
                    c["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                 {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]
                    c["env"] += [{"name": k, "value": v}
                                 for k, v in (sidecar_env or {}).items()]
                    if audit_dir is not None:
                        _add_audit(pod, c, audit_dir)
                elif command is not None:
                    c["command"] = list(command)
    return docs


def _add_audit(pod: Obj, sidecar: Obj, audit_dir: Path) -> None:
    """Each sidecar appends its ownership audit to <audit_dir>/<pod>.jsonl on the node
    (the directory must exist, writable by uid 10001: RealGroup.apply makes it)."""
    pod["volumes"].append({"name": "kgroup-audit",
                           "hostPath": {"path": str(audit_dir), "type": "Directory"}})
    sidecar.setdefault("volumeMounts", []).append(
        {"name": "kgroup-audit", "mountPath": "/var/run/kgroup-audit"})
    sidecar["env"].append({"name": "KGROUP_AUDIT_FILE",
                           "value": "/var/run/kgroup-audit/$(KGROUP_POD_NAME).jsonl"})


def example_pdb(path: Path = PDB_EXAMPLE) -> Obj:
    """examples/worker-pdb.yaml as it is (a PodDisruptionBudget needs no placement)."""
    pdb: Obj = yaml.safe_load(path.read_text())
    return pdb


def example_group(*, redis_url: str, stream: str, partitions: int | None = None,
                  path: Path = GROUP_EXAMPLE, **spec: Any) -> Obj:
    """examples/consumergroup.yaml with where its stream is and any spec field changed."""
    group: Obj = copy.deepcopy(yaml.safe_load(path.read_text()))
    group["spec"]["source"] = {"stream": stream, "redisUrl": redis_url}
    if partitions is not None:
        group["spec"]["partitions"] = partitions
    group["spec"].update(spec)
    return group
