"""Operator benchmark on the local control plane (real operator process, scripted members).

Prints counts and ratios; asserts nothing. Two figures, for 64 partitions:

1. join latency: 3 members stable, a 4th member's session appears; time from creating its
   member Lease to the watch delivering the status with the new epoch, minus the
   stabilisation window (1 s). Repeated (join, then leave) ``--rounds`` times.
2. quiet steady state: status writes per minute while 4 members are stable (the
   operator's own ``kgroup_status_writes_total`` and the group's resourceVersion changes).

Run: ``.venv/bin/python bench/bench_operator.py [--rounds 5] [--window 60]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from kgroup import constants as C
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster.cluster import REPO, Cluster
from kgroup_devcluster.sessions import join, leave
from kgroup_devcluster.tokens import admin_api_client

GROUP = "bench"
WINDOW = 1.0
PARTITIONS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apply_crd(cluster: Cluster) -> None:
    path = REPO / "crds" / "kgroup.dev_consumergroups.yaml"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{C.CRD_NAME}")


class Renewer:
    """Member Leases renewed every second (renew 1 s, duration 3 s)."""

    def __init__(self, api: client.ApiClient, ns: str, uid: str) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.ns, self.uid = ns, uid
        self.pods: set[str] = set()
        self.last_renewed: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def join(self, pod: str) -> None:
        now = datetime.now(UTC)
        body: Any = {
            "metadata": {
                "name": C.member_lease_name(GROUP, pod),
                "labels": {C.LABEL_GROUP: GROUP, C.LABEL_ROLE: C.ROLE_MEMBER, C.LABEL_MEMBER: pod},
                "annotations": {C.ANNOTATION_SESSION: secrets.token_hex(6)},
                "ownerReferences": [
                    {
                        "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}",
                        "kind": C.KIND,
                        "name": GROUP,
                        "uid": self.uid,
                    }
                ],
            },
            "spec": {
                "holderIdentity": pod,
                "leaseDurationSeconds": 3,
                "acquireTime": now.isoformat(),
                "renewTime": now.isoformat(),
            },
        }
        self.coord.create_namespaced_lease(self.ns, body)
        with self.lock:
            self.pods.add(pod)

    def leave(self, pod: str) -> None:
        with self.lock:
            self.pods.discard(pod)
        self.coord.delete_namespaced_lease(C.member_lease_name(GROUP, pod), self.ns)

    def loop(self) -> None:
        while not self.stop.wait(1.0):
            with self.lock:
                pods = sorted(self.pods)
            try:
                acked = self.converge(pods)
            except client.ApiException:
                acked = {}
            for pod in pods:
                try:
                    lease: Any = self.coord.read_namespaced_lease(
                        C.member_lease_name(GROUP, pod), self.ns
                    )
                    lease.spec.renew_time = datetime.now(UTC)
                    if pod in acked:
                        lease.metadata.annotations[C.ANNOTATION_EPOCH] = str(acked[pod])
                    self.coord.replace_namespaced_lease(lease.metadata.name, self.ns, lease)
                    with self.lock:
                        self.last_renewed[pod] = time.monotonic()
                except client.ApiException:
                    pass

    def crash(self, pod: str) -> float:
        """Stop renewing `pod`; returns when its last renewal was confirmed."""
        with self.lock:
            self.pods.discard(pod)
            return self.last_renewed.get(pod, time.monotonic())

    def converge(self, pods: list[str]) -> dict[str, int]:
        """Like a sidecar: release what is not targeted, take free targeted locks, ack."""
        cg: Any = client.CustomObjectsApi(self.coord.api_client).get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, self.ns, C.PLURAL, GROUP
        )
        st = cg.get("status") or {}
        epoch = int(st.get("epoch", 0))
        target = {m: set(parse_ranges(r)) for m, r in (st.get("assignment") or {}).items()}
        locks: Any = self.coord.list_namespaced_lease(
            self.ns, label_selector=f"{C.LABEL_GROUP}={GROUP},{C.LABEL_ROLE}=partition"
        )
        held: dict[str, set[int]] = {p: set() for p in pods}
        sessions = {p: self.session(p) for p in pods}
        for lock in locks.items:
            part = int(lock.metadata.labels[C.LABEL_PARTITION])
            holder = lock.spec.holder_identity
            owner = next((m for m, ps in target.items() if part in ps), None)
            if holder in held and owner != holder:
                lock.spec.holder_identity = None
                self.coord.replace_namespaced_lease(lock.metadata.name, self.ns, lock)
            elif owner in held and holder != owner and (holder is None or holder not in pods):
                lock.spec.holder_identity = owner
                lock.spec.lease_transitions = (lock.spec.lease_transitions or 0) + 1
                lock.metadata.annotations = {
                    **(lock.metadata.annotations or {}),
                    C.ANNOTATION_SESSION: sessions[owner],
                }
                self.coord.replace_namespaced_lease(lock.metadata.name, self.ns, lock)
                held[owner].add(part)
            elif holder in held:
                held[holder].add(part)
        return {p: epoch for p in pods if held[p] == target.get(p, set())}

    def session(self, pod: str) -> str:
        lease: Any = self.coord.read_namespaced_lease(C.member_lease_name(GROUP, pod), self.ns)
        return str(lease.metadata.annotations[C.ANNOTATION_SESSION])


def wait_until(what: str, cond: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(what)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=60.0, help="steady-state seconds")
    args = ap.parse_args()
    cluster = join()
    api = admin_api_client(cluster)
    ns = f"bench-operator-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    proc: subprocess.Popen[bytes] | None = None
    renewer: Renewer | None = None
    try:
        apply_crd(cluster)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        pods = [f"w-{i}" for i in range(4)]
        for pod in pods:
            core.create_namespaced_pod(
                ns,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name=pod, labels={"app": GROUP}),
                    spec=client.V1PodSpec(
                        node_selector={"type": "kwok"},
                        containers=[client.V1Container(name="main", image="example.invalid/w:1")],
                    ),
                ),
            )
        wait_until(
            "pods running",
            lambda: (
                sum(
                    p.status is not None and p.status.phase == "Running"
                    for p in core.list_namespaced_pod(ns).items
                )
                == 4
            ),
        )
        group: Any = custom.create_namespaced_custom_object(
            C.API_GROUP,
            C.API_VERSION,
            ns,
            C.PLURAL,
            {
                "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}",
                "kind": C.KIND,
                "metadata": {"name": GROUP},
                "spec": {
                    "partitions": PARTITIONS,
                    "selector": {"matchLabels": {"app": GROUP}},
                    "stabilizationWindowSeconds": int(WINDOW),
                    "lease": {"durationSeconds": 3, "renewIntervalSeconds": 1},
                },
            },
        )
        metrics_port = free_port()
        print(f"operator log: {Path(tempfile.gettempdir())}/bench-operator-*/operator.log")
        log = Path(tempfile.mkdtemp(prefix="bench-operator-")) / "operator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(REPO / ".venv/bin/kgroup-operator"),
                    "-n",
                    ns,
                    "--leader-namespace",
                    ns,
                    "--liveness-port",
                    str(free_port()),
                    "--metrics-port",
                    str(metrics_port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            )
        renewer = Renewer(api, ns, group["metadata"]["uid"])
        for pod in pods[:3]:
            renewer.join(pod)

        def status() -> dict[str, Any]:
            obj: Any = custom.get_namespaced_custom_object(
                C.API_GROUP, C.API_VERSION, ns, C.PLURAL, GROUP
            )
            return dict(obj.get("status") or {})

        wait_until("3 members targeted", lambda: len(status().get("assignment") or {}) == 3)

        latencies: list[float] = []
        for _ in range(args.rounds):
            epoch = int(status()["epoch"])
            w = watch.Watch()  # type: ignore[no-untyped-call]
            t0 = time.monotonic()
            renewer.join(pods[3])
            for ev in w.stream(  # type: ignore[no-untyped-call]
                custom.list_namespaced_custom_object,
                C.API_GROUP,
                C.API_VERSION,
                ns,
                C.PLURAL,
                timeout_seconds=60,
            ):
                st = ev["object"].get("status") or {}
                if int(st.get("epoch", 0)) > epoch:
                    latencies.append(time.monotonic() - t0 - WINDOW)
                    w.stop()  # type: ignore[no-untyped-call]
            renewer.leave(pods[3])
            wait_until("back to 3", lambda: len(status().get("assignment") or {}) == 3)
        print(f"join → new epoch written, minus the {WINDOW:g} s window, {args.rounds} rounds:")
        print(
            f"  median {statistics.median(latencies):.3f} s, max {max(latencies):.3f} s,"
            f" all {[round(x, 3) for x in latencies]}"
        )

        renewer.join(pods[3])
        wait_until(
            "4 members, Stable",
            lambda: (
                len(status().get("assignment") or {}) == 4 and status().get("phase") == "Stable"
            ),
        )

        def writes() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("kgroup_status_writes_total{"):
                        return float(line.rsplit(" ", 1)[1])
            return 0.0

        def rv() -> str:
            obj: Any = custom.get_namespaced_custom_object(
                C.API_GROUP, C.API_VERSION, ns, C.PLURAL, GROUP
            )
            return str(obj["metadata"]["resourceVersion"])

        w0, rv0, rv_changes = writes(), rv(), 0
        t_end = time.monotonic() + args.window
        last = rv0
        while time.monotonic() < t_end:
            time.sleep(1.0)
            now_rv = rv()
            rv_changes += now_rv != last
            last = now_rv
        per_min = 60.0 / args.window
        print(f"stable, 4 members x {PARTITIONS} partitions, {args.window:g} s:")
        print(f"  status writes/min (operator counter): {(writes() - w0) * per_min:.2f}")
        print(f"  group resourceVersion changes/min: {rv_changes * per_min:.2f}")

        epoch = int(status()["epoch"])
        w = watch.Watch()  # type: ignore[no-untyped-call]
        t_last = renewer.crash(pods[3])
        for ev in w.stream(  # type: ignore[no-untyped-call]
            custom.list_namespaced_custom_object,
            C.API_GROUP,
            C.API_VERSION,
            ns,
            C.PLURAL,
            timeout_seconds=60,
        ):
            if int((ev["object"].get("status") or {}).get("epoch", 0)) > epoch:
                crash = time.monotonic() - t_last
                w.stop()  # type: ignore[no-untyped-call]
        print("crash (renewals stop) → new epoch written, from the last confirmed renewal:")
        print(f"  {crash:.3f} s (lease duration 3 s + window {WINDOW:g} s = {3 + WINDOW:g} s)")
    finally:
        if renewer is not None:
            renewer.stop.set()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
        api.close()  # type: ignore[no-untyped-call]
        leave()


if __name__ == "__main__":
    main()
