"""What one stable sidecar process costs: CPU and memory from /proc, real processes.

N real ``kgroup-sidecar`` processes (each with its own watches, as N pods have) against the
local control plane, a scripted target (the test plays the operator) at the CRD's default
lease (8 s / 2 s), each app reporting health every second (``POST /v1/health``); once every
member holds its target, ``--window`` seconds of steady state: per process the CPU it used
(utime + stime from /proc/<pid>/stat) and its RSS (/proc/<pid>/status, VmRSS) at the end.

``--code DIR`` runs the sidecar from another source tree (``git archive <commit> | tar -x
-C DIR``), e.g. the code before a change, with this environment's packages.

    .venv/bin/python bench/bench_sidecar_cost.py [--members 4] [--partitions 16]
        [--window 60] [--code /tmp/old] [--out file.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from kgroup.client import Report, SidecarClient
from kgroup_devcluster.sessions import join, leave
from kgroup_devcluster.tokens import admin_api_client
from kgroup_sidecar.testing import ScriptedTarget, SidecarProcess, wait_until

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def report_health(sc: SidecarProcess, stop: threading.Event) -> None:
    app = SidecarClient(sc.url)
    while not stop.wait(1.0):
        with contextlib.suppress(Exception):
            held = app.assignment().active
            app.report_health([Report(p.partition, p.token, position=f"{int(time.time())}-0",
                                      lag=0) for p in held])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--code", type=Path, help="run the sidecar from this source tree")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cluster = join()
    api = admin_api_client(cluster)
    ns = f"bench-cost-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=ns)))
    workdir = Path(f"/tmp/{ns}")
    workdir.mkdir()
    env: dict[str, str] = {"KGROUP_LOG_LEVEL": "INFO"}
    if args.code:
        env["PYTHONPATH"] = f"{args.code}:{args.code / 'worker_sidecar'}"
    sidecars: list[SidecarProcess] = []
    stop = threading.Event()
    try:
        target = ScriptedTarget(api, ns, "cost")
        target.create(partitions=args.partitions, duration=8, renew=2, drain=30)
        pods = [f"pod-{i}" for i in range(args.members)]
        for pod in pods:
            sidecars.append(SidecarProcess(pod=pod, group="cost", namespace=ns,
                                           kubeconfig=str(cluster.kubeconfig),
                                           workdir=workdir, env=dict(env)).start())
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
        for sc in sidecars:
            threading.Thread(target=report_health, args=(sc, stop), daemon=True).start()
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
        for sc in sidecars:
            sc.stop()
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(api).delete_namespace(ns)
        api.close()  # type: ignore[no-untyped-call]
        leave()


if __name__ == "__main__":
    main()
