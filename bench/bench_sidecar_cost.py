"""What one stable sidecar process costs: CPU and memory from /proc, real processes.

N real ``kgroup-sidecar`` processes (each with its own watches, as N pods have) against the
local control plane, a scripted target (the test plays the operator) at the CRD's default
lease (8 s / 2 s), each app reporting health every second (``POST /v1/health``); once every
member holds its target, ``--window`` seconds of steady state: per process the CPU it used
(utime + stime from /proc/<pid>/stat) and its RSS (/proc/<pid>/status, VmRSS) at the end.

``--code DIR`` runs the sidecar from another source tree (``git archive <commit> | tar -x
-C DIR``), e.g. the code before a change, with this environment's packages.

``--real-node``: the same on the local real node instead, as a user runs it: the chart
(e2e/values-real-node.yaml: exec probes), the example ConsumerGroup and 4 light workers
of examples/worker-deployment.yaml with events flowing (bench_real_node's set-up);
``--probes http`` keeps the example's httpGet probes instead, on a free port, with one
worker (a hostNetwork pod's port is the node's). Per sidecar *container* what the kubelet
accounts in its cgroup (/stats/summary: CPU, RSS, working set; probes included), per
sidecar *process* the same /proc figures, and the probes the kubelet ran on it in the
window (its /metrics/probes): what the container used beyond its process, per probe, is
what one ``runc exec`` probe costs it.

    .venv/bin/python bench/bench_sidecar_cost.py [--members 4] [--partitions 16]
        [--window 60] [--code /tmp/old] [--real-node [--app light|pyspark]] [--out file.json]
        [--health-every 1] [--poll-rate 0] [--follow]

The app's requests are chosen to split the sidecar's CPU by cause: ``--health-every 0``
alone is the sidecar's own (renewals, watches, timers); ``--poll-rate 13`` adds what the
light worker's request per batch cost; ``--follow --health-every 2`` is the light worker
now (one long-poll kept open, a health report every 2 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from kgroup.client import Report, SidecarClient
from kgroup.follower import AssignmentFollower
from kgroup_devcluster.sessions import join, leave
from kgroup_devcluster.tokens import admin_api_client
from kgroup_testing import sidecar_harness as testing
from kgroup_testing.sidecar_harness import ScriptedTarget, SidecarProcess, free_port, wait_until

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def report_health(sc: SidecarProcess, stop: threading.Event, every: float,
                  follower: AssignmentFollower | None) -> None:
    """The app's health report every ``every`` seconds (the light worker: 2 s), of what
    it holds (from the follower's memory when there is one, else one GET first)."""
    app = SidecarClient(sc.url)
    while not stop.wait(every):
        with contextlib.suppress(Exception):
            latest = follower.latest() if follower is not None else None
            held = (latest or app.assignment()).active
            app.report_health([Report(p.partition, p.token, position=f"{int(time.time())}-0",
                                      lag=0) for p in held])


def poll_assignment(sc: SidecarProcess, stop: threading.Event, rate: float) -> None:
    """What the light worker did before the follower: ``GET /v1/assignment`` ``rate``
    times a second, each on a new connection."""
    while not stop.wait(1.0 / rate):
        with contextlib.suppress(Exception):
            SidecarClient(sc.url).assignment()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def sidecar_pids(pod_uids: set[str]) -> dict[str, int]:
    """pod uid -> pid of its kgroup-sidecar process (found in /proc by cgroup and command)."""
    found: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            groups = (proc / "cgroup").read_text()
        except OSError:
            continue
        if b"kgroup-sidecar" not in cmd:
            continue
        for uid in pod_uids:
            if uid.replace("-", "_") in groups or uid in groups:
                found[uid] = int(proc.name)
    return found


def probe_runs(cluster: Any, namespace: str) -> dict[str, float]:
    """pod name -> the probes the kubelet has run on its kgroup-sidecar container so far
    (``prober_probe_total`` of the kubelet's /metrics/probes, every type and result)."""
    from bench_real_node import kubelet_get
    text = kubelet_get(cluster, "/metrics/probes").decode()
    runs: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("prober_probe_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:
                                                       line.index("}")].split(","))
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("namespace") == namespace and labels.get("container") == "kgroup-sidecar":
            pod = labels["pod"]
            runs[pod] = runs.get(pod, 0.0) + float(line.rsplit(" ", 1)[1])
    return runs


def real_node(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_real_node import APPS, group_on_node, kubelet_stats

    from kgroup_devcluster.cluster import ensure_up
    from kgroup_devcluster.images import ensure_on_node

    cluster = ensure_up(who="bench")
    ensure_on_node(cluster.state_dir)
    http = args.probes == "http"
    port = free_port() if http else None
    members = 1 if http else args.members
    if args.app == "pyspark" and not http:
        members = min(members, 3)  # three PySpark drivers on 2 cores, as make demo runs
    with group_on_node(cluster, args.partitions, workers=members, http_probes_on=port,
                       command=APPS[args.app]) as (g, _producer):
        time.sleep(15 if args.app == "light" else 60)  # settle (PySpark: its first batches)

        def containers() -> dict[str, Any]:
            return {p["podRef"]["uid"]: c for p in kubelet_stats(cluster)
                    if p["podRef"]["namespace"] == g.namespace
                    for c in p.get("containers", []) if c["name"] == "kgroup-sidecar"}

        load0 = os.getloadavg()
        a, probes0 = containers(), probe_runs(cluster, g.namespace)
        pids = sidecar_pids(set(a))
        t0, c0 = time.monotonic(), {u: cpu_seconds(p) for u, p in pids.items()}
        time.sleep(args.window)
        t1, b = time.monotonic(), containers()
        c1, probes1 = {u: cpu_seconds(p) for u, p in pids.items()}, probe_runs(cluster,
                                                                               g.namespace)
        names = {p["podRef"]["uid"]: p["podRef"]["name"] for p in kubelet_stats(cluster)}
        rows = []
        for uid, c in b.items():
            if uid not in a:
                continue
            used = c["cpu"]["usageCoreNanoSeconds"] - a[uid]["cpu"]["usageCoreNanoSeconds"]
            pod = names.get(uid, "")
            # the probes the kubelet ran in the window (exec probes: a runc exec each)
            row = {"probe_runs": probes1.get(pod, 0.0) - probes0.get(pod, 0.0),
                   "container_mcpu": used / 1e6 / (t1 - t0),
                   "container_rss_mb": (c.get("memory", {}).get("rssBytes") or 0) / 1e6,
                   "container_working_set_mb":
                       (c.get("memory", {}).get("workingSetBytes") or 0) / 1e6}
            if uid in pids:
                row["process_mcpu"] = 1000 * (c1[uid] - c0[uid]) / (t1 - t0)
                row["process_rss_mb"] = rss_mb(pids[uid])
                if row["probe_runs"]:  # what the container used beyond its process, per probe
                    row["beyond_process_ms_per_probe"] = (
                        (row["container_mcpu"] - row["process_mcpu"]) * (t1 - t0)
                        / row["probe_runs"])
            rows.append(row)
        return {"where": "real node", "app": args.app, "probes": args.probes,
                "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "members": len(rows),
                "partitions": args.partitions, "uptime": uptime(),
                "window_s": args.window, "load_avg_start": load0,
                "load_avg_end": os.getloadavg(), "containers": rows,
                **{f"{k}_max": max(r.get(k, 0.0) for r in rows) for k in rows[0]},
                **{f"{k}_mean": sum(r.get(k, 0.0) for r in rows) / len(rows)
                   for k in rows[0]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--code", type=Path, help="run the sidecar from this source tree")
    ap.add_argument("--health-every", type=float, default=1.0,
                    help="each app's POST /v1/health period in seconds (0: none)")
    ap.add_argument("--poll-rate", type=float, default=0.0,
                    help="each app's GET /v1/assignment per second on new connections "
                         "(the light worker before the follower: 9-17)")
    ap.add_argument("--follow", action="store_true",
                    help="each app keeps a long-poll open (kgroup.follower)")
    ap.add_argument("--real-node", action="store_true")
    ap.add_argument("--probes", choices=("exec", "http"), default="exec",
                    help="--real-node: the exec probes (4 workers), or the example's httpGet "
                         "probes on a free port (a hostNetwork pod's port is the node's: "
                         "1 worker)")
    ap.add_argument("--app", choices=("light", "pyspark"), default="light",
                    help="--real-node: the workers' app: the light worker, or the reference "
                         "PySpark job as make demo runs it (at most 3 workers)")
    ap.add_argument("--profile", type=Path,
                    help="run the first sidecar under cProfile, its stats written here")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.real_node:
        on_node = real_node(args)
        print(json.dumps(on_node, indent=2))
        if args.out:
            args.out.write_text(json.dumps(on_node, indent=2) + "\n")
        return
    cluster = join()
    api = admin_api_client(cluster)
    ns = f"bench-cost-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=ns)))
    workdir = Path(f"/tmp/{ns}")
    workdir.mkdir()
    # as in a pod: the cluster's CA is the process's trust store (kgroup_sidecar.main sets
    # it from the service account's ca.crt; these processes use a kubeconfig instead)
    env: dict[str, str] = {"KGROUP_LOG_LEVEL": "INFO",
                           "SSL_CERT_FILE": str(cluster.pki.ca_cert)}
    if args.code:
        env["PYTHONPATH"] = f"{args.code}:{args.code / 'worker_sidecar'}"
    sidecars: list[SidecarProcess] = []
    stop = threading.Event()
    try:
        target = ScriptedTarget(api, ns, "cost")
        target.create(partitions=args.partitions, duration=8, renew=2, drain=30)
        pods = [f"pod-{i}" for i in range(args.members)]
        for pod in pods:
            sc = SidecarProcess(pod=pod, group="cost", namespace=ns,
                                kubeconfig=str(cluster.kubeconfig), workdir=workdir,
                                env=dict(env))
            if args.profile and not sidecars:
                plain = testing.sidecar_command
                testing.sidecar_command = lambda: [
                    sys.executable, "-m", "cProfile", "-o", str(args.profile), "-m",
                    "kgroup_sidecar.main"]
                try:
                    sc.start()
                finally:
                    testing.sidecar_command = plain
            else:
                sc.start()
            sidecars.append(sc)
        assignment = {pod: list(range(i, args.partitions, args.members))
                      for i, pod in enumerate(pods)}
        epoch = target.assign(assignment)

        def stable() -> bool:
            for sc in sidecars:
                a = SidecarClient(sc.url).assignment()
                if a.acked_epoch != epoch or len(a.active) != len(assignment[sc.pod]):
                    return False
            return True

        wait_until("every member holds its target", stable, timeout=120)
        followers: list[AssignmentFollower] = []
        for sc in sidecars:
            follower = AssignmentFollower(sc.url).start() if args.follow else None
            if follower is not None:
                followers.append(follower)
            if args.health_every > 0:
                threading.Thread(target=report_health,
                                 args=(sc, stop, args.health_every, follower),
                                 daemon=True).start()
            if args.poll_rate > 0:
                threading.Thread(target=poll_assignment, args=(sc, stop, args.poll_rate),
                                 daemon=True).start()
        time.sleep(10)  # settle: the first health reports, the first scope
        load0 = os.getloadavg()
        pids = [sc.proc.pid for sc in sidecars if sc.proc is not None]
        t0, c0 = time.monotonic(), {p: cpu_seconds(p) for p in pids}
        time.sleep(args.window)
        t1, c1 = time.monotonic(), {p: cpu_seconds(p) for p in pids}
        rows = [{"pid": p, "mcpu": 1000 * (c1[p] - c0[p]) / (t1 - t0), "rss_mb": rss_mb(p)}
                for p in pids]
        result: dict[str, Any] = {
            "members": args.members, "partitions": args.partitions, "window_s": args.window,
            "app": {"health_every_s": args.health_every, "poll_rate": args.poll_rate,
                    "follow": args.follow,
                    "follower_polls": sum(f.polls for f in followers)},
            "code": str(args.code or "this tree"), "load_avg_start": load0,
            "load_avg_end": os.getloadavg(), "processes": rows,
            "mcpu_mean": sum(r["mcpu"] for r in rows) / len(rows),
            "mcpu_max": max(r["mcpu"] for r in rows),
            "rss_mb_max": max(r["rss_mb"] for r in rows),
            "still_stable": stable(),
        }
        print(json.dumps(result, indent=2))
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stop.set()
        if args.profile and sidecars:
            sidecars[0].terminate()  # a graceful exit writes the profile
        for sc in sidecars:
            sc.stop()
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(api).delete_namespace(ns)
        api.close()  # type: ignore[no-untyped-call]
        leave()


if __name__ == "__main__":
    main()
