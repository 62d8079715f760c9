"""The stage the cluster benchmarks share: a namespace, kwok pods, a group, the operator.

Rule: everything a benchmark creates lives in its own namespace (other engineers share
the cluster), the operator is scoped to it, and ``Stage.close`` removes both. Also the
machine facts every figure states (``machine()``), the operator's CPU seconds from
``/proc/<pid>/stat``, and the API server's request counters from its ``/metrics``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client

from kgroup import constants as C
from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import REPO, Cluster, ensure_up, running
from kgroup_devcluster.tokens import admin_api_client

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cluster() -> Cluster:
    return running() or ensure_up(who="bench")


def machine(cl: Cluster | None = None) -> dict[str, Any]:
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(), "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(Exception):
        import pyspark
        facts["pyspark"] = pyspark.__version__
    if cl is not None:
        with contextlib.suppress(Exception):
            _, body = cl.request("GET", "/version")
            facts["kubernetes"] = json.loads(body).get("gitVersion")
    return facts


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


_METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def apiserver_requests(cl: Cluster, *, resource: str = "leases") -> dict[str, float]:
    """apiserver_request_total summed by verb for one resource (cluster-wide)."""
    out: dict[str, float] = {}
    for line in cl.apiserver_metrics().splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(kv.split("=", 1) for kv in m["labels"].split(","))
        if labels.get("resource", "").strip('"') != resource:
            continue
        verb = labels.get("verb", "").strip('"')
        out[verb] = out.get(verb, 0.0) + float(m["value"])
    return out


_WATCH_EVENTS = re.compile(r'^apiserver_watch_events_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def apiserver_watch_events(cl: Cluster, *, resource: str = "leases") -> float:
    """apiserver_watch_events_total for one resource (cluster-wide): events the API server
    sent to every watcher of it."""
    total = 0.0
    for line in cl.apiserver_metrics().splitlines():
        m = _WATCH_EVENTS.match(line)
        if m and f'resource="{resource}"' in m["labels"]:
            total += float(m["value"])
    return total


def wait_until(what: str, cond: Callable[[], Any], *, timeout: float = 120.0,
               interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except Exception as exc:  # a transient API error while the server restarts
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"{what} (last: {str(last)[:300]})")


def pct(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: operator stopped, namespace gone


class Stage:
    def __init__(self, prefix: str) -> None:
        with contextlib.suppress(ValueError):  # only the main thread may set handlers
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        self.cluster = cluster()
        self.api = admin_api_client(self.cluster)
        self.core = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.coord: Any = client.CoordinationV1Api(self.api)
        self.ns = f"{prefix}-{secrets.token_hex(3)}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        self.operator: subprocess.Popen[bytes] | None = None
        self.group = "bench"
        crd = REPO / "crds" / "kgroup.dev_consumergroups.yaml"
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                             f"crd/{C.CRD_NAME}")
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=self.ns)))

    def pods(self, names: Iterable[str], *, app: str | None = None) -> None:
        """Pods labelled ``app`` (default: the stage's group), Running on kwok's nodes."""
        names = list(names)
        self.cluster.ensure_pod_capacity(len(names))  # 1,000 kwok pods need more nodes
        for pod in names:
            self.core.create_namespaced_pod(self.ns, client.V1Pod(
                metadata=client.V1ObjectMeta(name=pod, labels={"app": app or self.group}),
                spec=client.V1PodSpec(
                    node_selector={"type": "kwok"},
                    tolerations=[client.V1Toleration(key="kwok.x-k8s.io/node",
                                                     operator="Exists", effect="NoSchedule")],
                    containers=[client.V1Container(name="main", image="example.invalid/w:1")])))
        want = set(names)

        def ready() -> bool:
            listing: Any = self.core.list_namespaced_pod(self.ns)
            up = {p.metadata.name for p in listing.items
                  if p.status is not None and p.status.phase == "Running"}
            return want <= up

        wait_until(f"{len(want)} pods Running", ready, timeout=300, interval=0.5)

    def room_for(self, pods: int, per_node: int = 250) -> None:
        """Enough kwok nodes for ``pods`` pods (the cluster starts with three of
        ``per_node``): more fake nodes, kept for later runs (kwok's lease renewals of a
        node cost a write every 40 s, counted in each benchmark's baseline)."""
        nodes: Any = self.core.list_node(label_selector="type=kwok")
        have = {n.metadata.name for n in nodes.items}
        want = -(-(pods + 10) // per_node)
        res = {"cpu": "64", "memory": "256Gi", "pods": str(per_node),
               "ephemeral-storage": "1Ti"}
        for i in range(want):
            name = f"kwok-node-{i}"
            if name in have:
                continue
            self.core.create_node(client.V1Node(
                metadata=client.V1ObjectMeta(
                    name=name, annotations={"kwok.x-k8s.io/node": "fake",
                                            "node.alpha.kubernetes.io/ttl": "0"},
                    labels={"type": "kwok", "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}),
                status=client.V1NodeStatus(allocatable=res, capacity=res)))

    def create_group(self, *, partitions: int, window: int | None = 0,
                     duration: int | None = 15, renew: int | None = 5,
                     drain: int | None = 30, name: str | None = None) -> Obj:
        """The group (``name``: another than the stage's, selecting pods ``app=name``); a
        setting given as None is left out (the CRD's default applies)."""
        name = name or self.group
        spec: Obj = {"partitions": partitions, "selector": {"matchLabels": {"app": name}}}
        if window is not None:
            spec["stabilizationWindowSeconds"] = window
        lease = {k: v for k, v in (("durationSeconds", duration),
                                   ("renewIntervalSeconds", renew)) if v is not None}
        if lease:
            spec["lease"] = lease
        if drain is not None:
            spec["handoff"] = {"drainTimeoutSeconds": drain}
        obj: Obj = self.custom.create_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, self.ns, C.PLURAL, {
                "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
                "metadata": {"name": name}, "spec": spec})
        return obj

    def start_operator(self, *, metrics_port: int = 0,
                       env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The operator scoped to this namespace; ``metrics_port`` 0: no /metrics; ``env``
        added to its environment (e.g. PYTHONPATH of another checkout's code);
        ``KGROUP_OPERATOR_BIN`` names another install's ``kgroup-operator`` (e.g. a venv
        with the ``operator`` extra only, as the image holds)."""
        exe = Path(os.environ.get("KGROUP_OPERATOR_BIN")
                   or Path(sys.executable).with_name("kgroup-operator"))
        with (self.workdir / "operator.log").open("ab") as out:
            self.operator = subprocess.Popen(
                [str(exe), "--namespace", self.ns, "--leader-namespace", self.ns,
                 "--liveness-port", "0", "--metrics-port", str(metrics_port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig),
                     "NO_PROXY": "127.0.0.1,localhost", **(env or {})})
        return self.operator

    def status(self) -> Obj:
        obj: Obj = self.custom.get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, self.ns, C.PLURAL, self.group)
        return dict(obj.get("status") or {})

    def stable_with(self, members: int, st: Obj | None = None) -> Obj | None:
        """The group's status if it is Stable with ``members`` members, every member
        holding its target and acknowledging the epoch (``st``: a status already read)."""
        st = self.status() if st is None else st
        if (st.get("phase") == "Stable" and st.get("memberCount") == members
                and st.get("unowned") == 0
                and all(m.get("ownedCount") == m.get("assignedCount")
                        and m.get("acknowledgedEpoch") == st.get("epoch")
                        for m in st.get("members", []))):
            return st
        return None

    def holders(self) -> dict[int, str | None]:
        """Every partition lock's holder, read from the API server (one list)."""
        raw = self.coord.list_namespaced_lease(
            self.ns, label_selector=f"{C.LABEL_GROUP}={self.group},{C.LABEL_ROLE}=partition",
            _preload_content=False)
        out: dict[int, str | None] = {}
        for obj in json.loads(raw.data)["items"]:
            out[int(obj["metadata"]["labels"][C.LABEL_PARTITION])] = (
                obj.get("spec") or {}).get("holderIdentity")
        return out

    def close(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.send_signal(signal.SIGTERM)
            try:
                self.operator.wait(20)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait(5)
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespace(self.ns)
        self.api.close()  # type: ignore[no-untyped-call]
