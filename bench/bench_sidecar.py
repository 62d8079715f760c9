"""Sidecar benchmarks on the local control plane (real sidecar processes, scripted target).

Prints counts and ratios; asserts nothing. Three figures:

1. handoff: time from a new target moving one partition to the new owner reporting it
   active, with the old owner's app acknowledging at once (lease 3 s / renew 1 s);
2. failover: time from SIGKILL of an owner (and a target giving its partitions to the
   survivor) to the survivor owning them (lease 3 s / renew 1 s);
3. quiet steady state: Lease writes per minute with 4 members x 64 partitions and the
   default lease (15 s / 5 s), from the sidecars' own counters and from the API server's
   ``apiserver_request_total{verb="PUT",resource="leases"}`` (the latter also counts
   the control plane's own leader-election Leases and anything else running).

Run: ``.venv/bin/python bench/bench_sidecar.py [--window 60]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from kubernetes import client

from kgroup.client import Partition, SidecarClient
from kgroup_devcluster.cluster import REPO, Cluster
from kgroup_devcluster.sessions import join, leave
from kgroup_devcluster.tokens import admin_api_client
from kgroup_testing.sidecar_harness import (
    ScriptedTarget,
    SidecarProcess,
    read_audit,
    safety_violations,
    wait_until,
)


class Bench:
    def __init__(self, cluster: Cluster, api: client.ApiClient, workdir: Path) -> None:
        self.cluster, self.api, self.workdir = cluster, api, workdir
        self.sidecars: list[SidecarProcess] = []
        self.namespaces: list[str] = []

    def namespace(self) -> str:
        name = f"bench-sidecar-{secrets.token_hex(3)}"
        client.CoreV1Api(self.api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        self.namespaces.append(name)
        return name

    def start(self, ns: str, group: str, pod: str) -> SidecarProcess:
        sc = SidecarProcess(pod=pod, group=group, namespace=ns,
                            kubeconfig=str(self.cluster.kubeconfig), workdir=self.workdir)
        sc.start()
        self.sidecars.append(sc)
        return sc

    def close(self) -> None:
        for sc in self.sidecars:
            sc.stop()
        for ns in self.namespaces:
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(self.api).delete_namespace(ns)


def owns(sc: SidecarProcess, partitions: set[int]) -> bool:
    a = SidecarClient(sc.url).assignment()
    return partitions <= {p.partition for p in a.active}


def auto_ack(sc: SidecarProcess, stop: threading.Event) -> threading.Thread:
    app = SidecarClient(sc.url)

    def revoked(p: Partition) -> None:
        with contextlib.suppress(Exception):  # lost meanwhile: nothing to hand over
            app.release(p.partition, p.token, f"pos-{p.partition}")

    t = threading.Thread(target=app.watch, daemon=True, kwargs=dict(
        on_assigned=lambda p: None, on_revoked=revoked, on_lost=lambda p: None,
        stop=stop, wait=2.0))
    t.start()
    return t


def bench_handoff(b: Bench, rounds: int) -> list[float]:
    ns = b.namespace()
    target = ScriptedTarget(b.api, ns, "move")
    target.create(partitions=8, duration=3, renew=1, drain=10)
    a, c = b.start(ns, "move", "pod-a"), b.start(ns, "move", "pod-b")
    stop = threading.Event()
    auto_ack(a, stop), auto_ack(c, stop)
    target.assign({"pod-a": [0, 1, 2, 3], "pod-b": [4, 5, 6, 7]})
    wait_until("initial", lambda: owns(a, {0, 1, 2, 3}) and owns(c, {4, 5, 6, 7}), timeout=30)
    times = []
    for i in range(rounds):
        to_b = i % 2 == 0
        assignment = ({"pod-a": [1, 2, 3], "pod-b": [0, 4, 5, 6, 7]} if to_b
                      else {"pod-a": [0, 1, 2, 3], "pod-b": [4, 5, 6, 7]})
        t0 = time.monotonic()
        target.assign(assignment)
        new_owner = c if to_b else a

        def moved(o: SidecarProcess = new_owner) -> bool:
            return owns(o, {0})

        wait_until("moved", moved, timeout=30, interval=0.01)
        times.append(time.monotonic() - t0)
    stop.set()
    check([a, c])
    return times


def bench_failover(b: Bench, rounds: int) -> list[float]:
    times = []
    for i in range(rounds):
        ns = b.namespace()
        target = ScriptedTarget(b.api, ns, "fail")
        target.create(partitions=8, duration=3, renew=1, drain=10)
        a, c = b.start(ns, "fail", f"pod-a{i}"), b.start(ns, "fail", f"pod-b{i}")
        target.assign({a.pod: [0, 1, 2, 3], c.pod: [4, 5, 6, 7]})
        wait_until("initial", lambda: owns(a, {0, 1, 2, 3}) and owns(c, {4, 5, 6, 7}),  # noqa: B023
                   timeout=30)
        a.signal(signal.SIGKILL)
        t0 = time.monotonic()
        target.assign({c.pod: list(range(8))})
        wait_until("failover", lambda: owns(c, set(range(8))), timeout=30,  # noqa: B023
                   interval=0.01)
        times.append(time.monotonic() - t0)
        check([a, c])
    return times


def lease_updates(cluster: Cluster) -> float:
    total = 0.0
    for line in cluster.apiserver_metrics().splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="leases"' in line \
                and 'verb="PUT"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def sidecar_writes(scs: list[SidecarProcess]) -> float:
    total = 0.0
    for sc in scs:
        with urllib.request.urlopen(sc.url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                m = re.match(r"kgroup_sidecar_api_writes_total\{[^}]*\} (\S+)", line)
                if m:
                    total += float(m.group(1))
    return total


def bench_steady(b: Bench, window: float) -> tuple[float, float, int]:
    ns = b.namespace()
    target = ScriptedTarget(b.api, ns, "quiet")
    target.create(partitions=64, duration=15, renew=5, drain=10)
    pods = [f"pod-{i}" for i in range(4)]
    scs = [b.start(ns, "quiet", pod) for pod in pods]
    epoch = target.assign({pod: list(range(i * 16, (i + 1) * 16)) for i, pod in enumerate(pods)})
    wait_until("4 x 16 acked", lambda: all(
        SidecarClient(sc.url).assignment().acked_epoch == epoch for sc in scs), timeout=60)
    before_own, before_api = sidecar_writes(scs), lease_updates(b.cluster)
    before_cpu = sum(cpu_seconds(sc) for sc in scs)
    t0 = time.monotonic()
    time.sleep(window)  # a measurement window, not a wait for a condition
    elapsed = time.monotonic() - t0
    own = (sidecar_writes(scs) - before_own) * 60 / elapsed
    api = (lease_updates(b.cluster) - before_api) * 60 / elapsed
    cpu = (sum(cpu_seconds(sc) for sc in scs) - before_cpu) / len(scs) / elapsed
    print(f"steady state CPU per sidecar: {cpu * 100:.2f}% of one core")
    check(scs)
    return own, api, len(scs)


def cpu_seconds(sc: SidecarProcess) -> float:
    """user + system CPU time of a sidecar process (Linux /proc)."""
    assert sc.proc is not None
    fields = Path(f"/proc/{sc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check(scs: list[SidecarProcess]) -> None:
    """The safety audit over the sidecars of one group."""
    ended = {sc.pod: sc.killed_at for sc in scs if sc.killed_at is not None}
    problems = safety_violations(read_audit([sc.audit_file for sc in scs]), ended_at=ended)
    if problems:
        print("SAFETY VIOLATIONS:\n" + "\n".join(problems))


def fmt(xs: list[float]) -> str:
    return (f"n={len(xs)} median={statistics.median(xs):.3f}s min={min(xs):.3f}s "
            f"max={max(xs):.3f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    cluster = join()
    api = admin_api_client(cluster)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                    str(REPO / "crds"))
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
        b = Bench(cluster, api, Path(tmp))
        try:
            handoff = bench_handoff(b, args.rounds)
            print(f"handoff (target change -> new owner active, app acks at once): "
                  f"{fmt(handoff)}")
            failover = bench_failover(b, max(2, args.rounds // 2))
            print(f"failover (SIGKILL -> survivor owns, lease 3 s): {fmt(failover)}; "
                  f"ratio to lease duration: {statistics.median(failover) / 3:.2f}")
            own, api_rate, members = bench_steady(b, args.window)
            print(f"steady state, {members} members x 64 partitions, lease 15 s / renew 5 s: "
                  f"sidecar Lease writes {own:.1f}/min ({own / members:.1f} per member; "
                  f"expected {members * 12}/min); API server lease updates {api_rate:.1f}/min "
                  f"(includes control-plane leader election and other users)")
        finally:
            b.close()
            api.close()  # type: ignore[no-untyped-call]
            leave()


if __name__ == "__main__":
    main()
