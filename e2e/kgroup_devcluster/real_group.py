"""A kgroup release and a worker group on the real node, driven as a user drives them.

Shared by the real-node end-to-end test, its benchmark and `make demo`: `helm install`
the chart with e2e/values-real-node.yaml, `kubectl apply` the examples (adapted by
real_node.py), read the group's status and the Deployment's readiness, and do to the pods
what a failure would (SIGKILL of a container's process on the host, found through the
node's containerd). Nothing here starts a process of kgroup: the kubelet runs them all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from kgroup.constants import LABEL_GROUP, LABEL_PARTITION, LABEL_ROLE
from kgroup.core.objects import Obj

from . import node, stack
from .cluster import Cluster
from .real_node import EXAMPLE, STATEFULSET_EXAMPLE, example_group, example_workers

APP = "orders-worker"  # the example's names
GROUP = "orders"
OPERATOR = "app.kubernetes.io/component=operator"


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@dataclass
class RealGroup:
    """One namespace: the chart's release, a ConsumerGroup and its workers: the example's
    Deployment, or its StatefulSet (`kind="StatefulSet"`). With `release_namespace`, the
    release (operator, injector) lives there instead, as in a cluster where kgroup has
    its own namespace."""

    cluster: Cluster
    api: client.ApiClient
    namespace: str
    release: str
    redis_url: str
    audit: Path | None = None
    kind: str = "Deployment"
    release_namespace: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("Deployment", "StatefulSet"):
            raise ValueError(f"workers are a Deployment or a StatefulSet, not {self.kind}")
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.watcher = stack.GroupWatcher(self.api, self.namespace, GROUP)

    # -- installing ---------------------------------------------------------------------
    def install(self) -> None:
        """Create the namespaces if needed and `helm install` the chart for them."""
        for ns in {self.namespace, self.operator_namespace}:
            if not self.core.list_namespace(field_selector=f"metadata.name={ns}").items:
                self.core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        stack.helm_install(self.cluster, release=self.release,
                           namespace=self.operator_namespace, workers=self.namespace,
                           real_node=True)

    @property
    def operator_namespace(self) -> str:
        """Where the release (operator, injector) is: its own namespace, or the workers'."""
        return self.release_namespace or self.namespace

    @property
    def workload(self) -> str:
        """The workers as kubectl names them: deployment/orders-worker, statefulset/..."""
        return f"{self.kind.lower()}/{APP}"

    def apply(self, *, partitions: int, replicas: int, command: list[str],
              stream: str, sidecar_env: dict[str, str] | None = None,
              http_probes_on: int | None = None, **group_spec: Any) -> None:
        """`kubectl apply` the example ConsumerGroup and worker Deployment (StatefulSet)."""
        docs = [example_group(redis_url=self.redis_url, stream=stream, partitions=partitions,
                              **group_spec)]
        docs += example_workers(api_port=self.cluster.ports["apiserver"],
                                redis_url=self.redis_url, stream=stream, replicas=replicas,
                                command=command, small_requests=True, audit_dir=self.audit,
                                sidecar_env=sidecar_env, http_probes_on=http_probes_on,
                                path=EXAMPLE if self.kind == "Deployment"
                                else STATEFULSET_EXAMPLE)
        for d in docs:
            d["metadata"]["namespace"] = self.namespace
        if self.audit is not None:  # the sidecars' hostPath audit dir; they run as 10001
            self.audit.mkdir(parents=True, exist_ok=True)
            self.audit.chmod(0o1777)
        stack.apply(self.cluster, docs)

    def uninstall(self) -> None:
        self.cluster.helm("uninstall", self.release, "--namespace", self.operator_namespace,
                          check=False)

    # -- reading --------------------------------------------------------------------------
    def pods(self, selector: str = f"app={APP}", *, namespace: str = "") -> list[Any]:
        """The live (not deleting) pods of `selector` (in the workers' namespace unless
        told), by name."""
        listing: Any = self.core.list_namespaced_pod(namespace or self.namespace,
                                                     label_selector=selector)
        return sorted((p for p in listing.items if p.metadata.deletion_timestamp is None),
                      key=lambda p: p.metadata.name)

    def operator_ready(self, *, other_than: tuple[str, ...] = ()) -> list[Any]:
        return [p for p in self.pods(OPERATOR, namespace=self.operator_namespace)
                if p.metadata.name not in other_than
                and p.spec.node_name == node.NODE_NAME and _ready(p)]

    def settled(self, members: int) -> Obj | None:
        """The group's status once Stable with `members` members owning their targets, the
        Deployment (StatefulSet) rolled out with every pod Ready (readiness = ownership),
        all on the real node; else None."""
        status = self.watcher.stable_with(members)
        if status is None or not self.rolled_out(members):
            return None
        pods = self.pods()
        if sorted(p.metadata.name for p in pods) != sorted(status["assignment"]):
            return None
        misplaced = [p.metadata.name for p in pods if p.spec.node_name != node.NODE_NAME]
        if misplaced:
            raise AssertionError(f"worker pods off the real node: {misplaced}")
        return status

    def rolled_out(self, replicas: int) -> bool:
        """The workers' controller saw its latest spec and every replica is updated and
        Ready (a StatefulSet: its current revision is the update revision)."""
        if self.kind == "Deployment":
            w: Any = self.apps.read_namespaced_deployment(APP, self.namespace)
            revised = True
        else:
            w = self.apps.read_namespaced_stateful_set(APP, self.namespace)
            revised = w.status.current_revision == w.status.update_revision
        s = w.status
        return bool(revised and s.ready_replicas == s.replicas == s.updated_replicas == replicas
                    and (s.observed_generation or 0) >= w.metadata.generation)

    def holders(self) -> dict[int, str | None]:
        """Every partition lock's holder (one list of the group's partition Leases)."""
        raw: Any = self.coord.list_namespaced_lease(
            self.namespace, label_selector=f"{LABEL_GROUP}={GROUP},{LABEL_ROLE}=partition",
            _preload_content=False)
        return {int(o["metadata"]["labels"][LABEL_PARTITION]):
                (o.get("spec") or {}).get("holderIdentity")
                for o in json.loads(raw.data)["items"]}

    def container(self, pod: str, name: str) -> Any:
        p: Any = self.core.read_namespaced_pod(pod, self.namespace)
        statuses = ((p.status.container_statuses or [])
                    + (p.status.init_container_statuses or []))
        return next(c for c in statuses if c.name == name)

    # -- doing -----------------------------------------------------------------------------
    def kill_container(self, pod: str, name: str) -> int:
        """SIGKILL the container's first process on the host, as a crash or the OOM killer
        would; returns the container's restart count before."""
        status = self.container(pod, name)
        pid = node.task_pid(status.container_id, self.cluster.state_dir)
        if pid is None:
            raise AssertionError(f"{pod}/{name} has no running task")
        os.kill(pid, signal.SIGKILL)
        return int(status.restart_count)

    def kubectl(self, *args: str, timeout: float = 120.0) -> str:
        out = self.cluster.kubectl("-n", self.namespace, *args, check=False, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return str(out.stdout)

    def wait_settled(self, members: int, *, timeout: float = 180.0) -> Obj:
        result: Obj = stack.wait(f"Stable with {members} Ready members on the real node",
                                 lambda: self.settled(members), timeout=timeout)
        return result

    def delete_namespace(self, *, timeout: float = 180.0) -> None:
        """Delete the workers' namespace (and the release's, when it has its own) and wait
        until their pods are gone."""
        spaces = sorted({self.namespace, self.operator_namespace})
        for ns in spaces:
            self.core.delete_namespace(ns)
        deadline = time.monotonic() + timeout
        while any(self.core.list_namespaced_pod(ns).items for ns in spaces) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
