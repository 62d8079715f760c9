"""Stand-ins for e2e/tests/test_operator.py: the operator as a real subprocess
(:class:`OperatorProcess`) and scripted members (:class:`Members`) that create and renew
member Leases and, when a test wants owned counts, take and release partition locks the
way a sidecar would. Imported by the test module (pytest puts this folder on sys.path)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from kgroup import constants as C
from kgroup.apiclient import ApiClient, kubeconfig_config
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster import Cluster

REPO = Path(__file__).resolve().parents[2]
OPERATOR = Path(os.environ.get("KGROUP_OPERATOR_BIN")  # another build, for comparisons
                or REPO / ".venv" / "bin" / "kgroup-operator")
GROUP = "orders"
T = TypeVar("T")


def operator_api(cluster: Cluster) -> ApiClient:
    """The operator's own client (kgroup.apiclient) as the cluster's admin; its session is
    made at its first request, in the loop that makes it (see :func:`run_closing`)."""
    return ApiClient(kubeconfig_config(cluster.kubeconfig))


def run_closing(api: ApiClient, coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, then ``api``'s session closed in that loop: the next run
    makes a new one in its own loop (an aiohttp session belongs to one loop)."""
    async def run() -> T:
        try:
            return await coro
        finally:
            await api.close()

    return asyncio.run(run())


# -- the operator process ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """One kgroup-operator subprocess scoped to the test's namespace."""

    def __init__(self, cluster: Cluster, namespace: str, log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.env = env or {}
        self.namespace = namespace
        self.log_dir = log_dir
        self.metrics_port = _free_port()
        self.liveness_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def logs(self) -> list[Path]:
        return [self.log_dir / f"operator-{i}.log" for i in range(self.runs)]

    def start(self) -> None:
        log = self.log_dir / f"operator-{self.runs}.log"
        self.runs += 1
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig),
               "KGROUP_IDENTITY": f"e2e-{secrets.token_hex(3)}-{self.runs}", **self.env}
        args = [str(OPERATOR), "--namespace", self.namespace,
                "--leader-namespace", self.namespace, "--leader-lease-seconds", "6",
                "--liveness-port", str(self.liveness_port),
                "--metrics-port", str(self.metrics_port)]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _get(self, port: int, path: str) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    def metrics(self) -> str:
        return self._get(self.metrics_port, "/metrics")

    def alive(self) -> bool:
        return self._get(self.liveness_port, "/healthz") != ""

    def health(self) -> str:
        return self._get(self.liveness_port, "/healthz")

    def metric(self, name: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") and f'group="{GROUP}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return None

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


# -- scripted members (sidecar stand-ins) -------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Members:
    """Member Leases renewed every second by a thread; optionally converging like sidecars.

    ``converge=True``: each live member releases partitions no longer targeted to it,
    takes targeted ones that are free (or held by a member this script no longer renews),
    and acknowledges the epoch when what it holds equals its target.
    """

    def __init__(self, kube: client.ApiClient, namespace: str, uid: str, *,
                 converge: bool = False) -> None:
        self.coord = client.CoordinationV1Api(kube)
        self.custom = client.CustomObjectsApi(kube)
        self.namespace = namespace
        self.uid = uid
        self.converge = converge
        self.sessions: dict[str, str] = {}
        self.renewing: set[str] = set()
        self.bad_epoch: dict[str, str] = {}
        self.loads: dict[str, str] = {}  # pod -> its kgroup.dev/load annotation, renewed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _meta(self, name: str, labels: dict[str, str], ann: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": labels, "annotations": ann,
                "ownerReferences": [{"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}",
                                     "kind": C.KIND, "name": GROUP, "uid": self.uid}]}

    def join(self, *pods: str) -> None:
        for pod in pods:
            session = secrets.token_hex(6)
            body = {"metadata": self._meta(
                        C.member_lease_name(GROUP, pod),
                        {C.LABEL_GROUP: GROUP, C.LABEL_ROLE: C.ROLE_MEMBER, C.LABEL_MEMBER: pod},
                        {C.ANNOTATION_SESSION: session, C.ANNOTATION_EPOCH: "0"}),
                    "spec": {"holderIdentity": pod, "leaseDurationSeconds": 3,
                             "acquireTime": _now(), "renewTime": _now()}}
            self.coord.create_namespaced_lease(self.namespace, body)  # type: ignore[arg-type]
            with self._lock:
                self.sessions[pod] = session
                self.renewing.add(pod)

    def crash(self, pod: str) -> None:
        """Stop renewing (the Lease stays, as after a SIGKILL)."""
        with self._lock:
            self.renewing.discard(pod)

    def leave(self, pod: str) -> None:
        self.crash(pod)
        self.coord.delete_namespaced_lease(C.member_lease_name(GROUP, pod), self.namespace)

    def set_epoch_annotation(self, pod: str, value: str) -> None:
        with self._lock:
            self.bad_epoch[pod] = value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                pods = sorted(self.renewing)
            try:
                acked = self._converge(pods) if self.converge else {}
                for pod in pods:
                    self._renew(pod, acked.get(pod))
            except client.ApiException as e:
                if e.status not in (404, 409):
                    raise

    def _renew(self, pod: str, epoch: int | None) -> None:
        name = C.member_lease_name(GROUP, pod)
        lease: Any = self.coord.read_namespaced_lease(name, self.namespace)
        lease.spec.renew_time = datetime.now(UTC)
        ann = lease.metadata.annotations
        if pod in self.bad_epoch:
            ann[C.ANNOTATION_EPOCH] = self.bad_epoch[pod]
        elif epoch is not None:
            ann[C.ANNOTATION_EPOCH] = str(epoch)
        if pod in self.loads:
            ann[C.ANNOTATION_LOAD] = self.loads[pod]
        self.coord.replace_namespaced_lease(name, self.namespace, lease)

    def _converge(self, pods: list[str]) -> dict[str, int]:
        cg: Any = self.custom.get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, self.namespace, C.PLURAL, GROUP)
        status = cg.get("status") or {}
        epoch = int(status.get("epoch", 0))
        target = {m: set(parse_ranges(r)) for m, r in (status.get("assignment") or {}).items()}
        locks: Any = self.coord.list_namespaced_lease(
            self.namespace, label_selector=f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}=partition")
        held: dict[str, set[int]] = {p: set() for p in pods}
        for lock in locks.items:
            part = int(lock.metadata.labels[C.LABEL_PARTITION])
            holder = lock.spec.holder_identity
            owner = next((m for m, ps in target.items() if part in ps), None)
            if holder in held and owner != holder:  # revoke: release
                lock.spec.holder_identity = None
                self.coord.replace_namespaced_lease(lock.metadata.name, self.namespace, lock)
            elif owner in held and holder != owner and (holder is None or holder not in pods):
                lock.spec.holder_identity = owner  # acquire: free, or holder not renewing
                lock.spec.lease_transitions = (lock.spec.lease_transitions or 0) + 1
                lock.metadata.annotations = {**(lock.metadata.annotations or {}),
                                             C.ANNOTATION_SESSION: self.sessions[owner]}
                self.coord.replace_namespaced_lease(lock.metadata.name, self.namespace, lock)
                held[owner].add(part)
            elif holder in held:
                held[holder].add(part)
        return {p: epoch for p in pods if held[p] == target.get(p, set())}
