"""The kgroup stack on the local control plane: chart, pod runner, a group and its workers.

Shared by the end-to-end tests, `make demo` and the chaos run, so that all three install
and drive kgroup the same way a user does: `helm install` the chart, `kubectl apply` a
ConsumerGroup and a worker Deployment (kgroup-sidecar as a native sidecar + the app), and
let the local runner play the container runtime for the pods kwok makes Running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from .cluster import REPO, Cluster
from .runner import free_port

CHART = REPO / "charts" / "kgroup"
REAL_NODE_VALUES = REPO / "e2e" / "values-real-node.yaml"

# The chart's operator listens on fixed ports (its metrics on the pod IP for the Service). On
# the local runner every pod shares the host's loopback, so those listeners are turned off.
RUNNER_ENV = ["KGROUP_METRICS_HOST=127.0.0.1", "KGROUP_METRICS_PORT=0", "KGROUP_LIVENESS_PORT=0"]


def helm_install(cluster: Cluster, *, release: str, namespace: str,
                 real_node: bool = False, chart: Path = CHART,
                 values: Path = REAL_NODE_VALUES, settings: Sequence[str] = (),
                 workers: str = "") -> None:
    """Install (or upgrade) the chart in `namespace` with its operator watching `workers`
    (default: `namespace`) and the worker RBAC there.

    `real_node`: the operator runs in a real container on the real node, from the image
    `make images` loaded, with e2e/values-real-node.yaml (hostNetwork, the API server on
    loopback) and free node ports for its metrics and health endpoints. Otherwise its pod
    lands on a kwok node and the local runner runs its command. `chart` and `values`:
    another release's (kgroup_devcluster.previous); `settings`: more helm arguments.
    """
    if real_node:
        where = ["-f", str(values),
                 "--set", f"kubernetesApi.port={cluster.ports['apiserver']}",
                 "--set", f"operator.metricsPort={free_port()}",
                 "--set", f"operator.healthPort={free_port()}"]
    else:
        # one operator pod: the local runner runs pods as processes on one loopback, where
        # two replicas would want the same health and metrics ports
        where = ["--set", "operator.image.repository=kgroup-operator",
                 "--set", "operator.image.tag=dev", "--set", "operator.replicas=1"]
    watched = workers or namespace
    out = cluster.helm(
        "upgrade", "--install", release, str(chart), "--namespace", namespace,
        "--take-ownership",
        "--set", f"operator.watchNamespaces={{{watched}}}",
        "--set", f"operator.leaderElection.leaseName={release}-leader",
        "--set", f"workerRbac.namespaces={{{watched}}}",
        "--set", f"admissionPolicy.namespaces={{{watched}}}",
        *where, *settings, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"helm install failed: {out.stderr.strip()}")


def runner_argv(*, namespace: str, state_dir: Path,
                extra_env: tuple[str, ...] = ()) -> list[str]:
    """The local pod runner's command line for `namespace` (state and logs in `state_dir`)."""
    args = [sys.executable, "-m", "kgroup_devcluster.runner", "--namespace", namespace,
            "--state-dir", str(state_dir), "--audit-dir", str(state_dir / "audit")]
    for item in [*RUNNER_ENV, *extra_env]:
        args += ["--env", item]
    return args


def start_runner(*, namespace: str, state_dir: Path,
                 extra_env: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """Start the local pod runner as a child of this process (tests stop it themselves)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "runner.log", "ab") as log:
        return subprocess.Popen(
            runner_argv(namespace=namespace, state_dir=state_dir, extra_env=extra_env),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@dataclass(frozen=True)
class GroupSpec:
    name: str
    app_label: str
    partitions: int
    replicas: int
    app_command: list[str]
    stream: str
    redis_url: str
    stabilization_window: int = 1
    lease_duration: int = 4
    renew_interval: int = 1
    drain_timeout: int = 8
    termination_grace: int = 15


def manifests(spec: GroupSpec, namespace: str) -> list[dict[str, Any]]:
    """The ConsumerGroup and the worker Deployment, as `kubectl apply` takes them."""
    group = {
        "apiVersion": "kgroup.dev/v1alpha1", "kind": "ConsumerGroup",
        "metadata": {"name": spec.name, "namespace": namespace},
        "spec": {
            "partitions": spec.partitions,
            "selector": {"matchLabels": {"app": spec.app_label}},
            "stabilizationWindowSeconds": spec.stabilization_window,
            "stabilizationMaxDelaySeconds": max(5, spec.stabilization_window * 5),
            "lease": {"durationSeconds": spec.lease_duration,
                      "renewIntervalSeconds": spec.renew_interval},
            "handoff": {"drainTimeoutSeconds": spec.drain_timeout},
            "source": {"stream": spec.stream, "redisUrl": spec.redis_url},
        },
    }
    sidecar = {
        "name": "kgroup-sidecar", "image": "kgroup-sidecar:dev", "restartPolicy": "Always",
        "command": ["kgroup-sidecar"],
        "env": [{"name": "KGROUP_GROUP", "value": spec.name},
                {"name": "KGROUP_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "KGROUP_POD_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                # its Events name the pod by uid (the Events policy refuses them without)
                # and it acquires only locks marked for this pod's uid
                {"name": "KGROUP_POD_UID",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "KGROUP_LISTEN", "value": "127.0.0.1:8470"},
                {"name": "KGROUP_TERMINATION_GRACE_SECONDS",
                 "value": str(spec.termination_grace)}],
        # the only container with an API token (the pod turns automount off)
        "volumeMounts": [{"name": "kgroup-sidecar-token", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
    }
    app = {
        "name": "worker", "image": "kgroup-worker:dev", "command": spec.app_command,
        "env": [{"name": "KGROUP_REDIS_URL", "value": spec.redis_url},
                {"name": "KGROUP_STREAM", "value": spec.stream},
                {"name": "KGROUP_SIDECAR_URL", "value": "http://127.0.0.1:8470"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": spec.app_label, "namespace": namespace},
        "spec": {
            "replicas": spec.replicas, "selector": {"matchLabels": {"app": spec.app_label}},
            "template": {
                "metadata": {"labels": {"app": spec.app_label}},
                "spec": {"serviceAccountName": "kgroup-worker",
                         "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": spec.termination_grace,
                         "initContainers": [sidecar], "containers": [app],
                         "volumes": [{"name": "kgroup-sidecar-token", "projected": {
                             "sources": [{"serviceAccountToken": {"path": "token"}}]}}]},
            },
        },
    }
    return [group, deployment]


def apply(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {out.stderr.strip()}")


class GroupWatcher:
    """Reads a ConsumerGroup's status and answers "is it settled with N members?"."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.crd = client.CustomObjectsApi(api)
        self.namespace, self.name = namespace, name

    def status(self) -> dict[str, Any]:
        obj: Any = self.crd.get_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", self.namespace, "consumergroups", self.name)
        return dict(obj.get("status") or {})

    def stable_with(self, members: int) -> dict[str, Any] | None:
        """The status once Stable with `members` members, each owning its whole target."""
        status = self.status()
        settled = (
            status.get("phase") == "Stable" and status.get("memberCount") == members
            and status.get("unowned") == 0
            and all(m.get("ownedCount") == m.get("assignedCount")
                    and m.get("acknowledgedEpoch") == status.get("epoch")
                    for m in status.get("members", []))
        )
        return status if settled else None


def wait(what: str, condition: Callable[[], Any], *, timeout: float,
         interval: float = 0.5) -> Any:
    """Poll until `condition()` is truthy (returned); TimeoutError with `what` after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except Exception as exc:  # the API server restarting, a process not up yet
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def runner_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "runner.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}
