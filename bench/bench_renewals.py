"""What member renewals alone cost the operator: N member Leases renewed every 2 s.

Rule: timings live here, never in tests; prints and returns figures, asserts nothing.
No sidecars: this process writes N member Leases (kwok pods behind them, so they are
members) and renews each every 2 s (a renewer process per 250 members, plain PUTs from
8 threads each) with a fresh health summary (lags and positions change, nothing stalls),
as N sidecars would. Nobody takes a partition, so the
group settles Degraded with every partition unowned; what is measured after it settled
is the operator's cost of the renewals: its cores (``/proc/<pid>/stat``) and planning
passes per second (its ``/metrics``) over ``--window`` seconds. It isolates the
operator's per-renewal path from the swarm, whose own member-Lease fan-out (O(members²))
does not fit this machine at 200 members. ``--operator-from`` runs another checkout's
operator (a before/after); ``KGROUP_OPERATOR_BIN`` another install's (e.g. a venv with
the ``operator`` extra only, as the image holds).

    .venv/bin/python bench/bench_renewals.py --members 200,1000 [--window 30]
        [--operator-from /path/to/checkout] [--profile /tmp/op.txt]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cost import free_port, operator_metric, own_cpu_seconds, rss_mb
from stage import Stage, machine

from kgroup import constants as C
from kgroup.core.objects import Obj
from kgroup_devcluster.tokens import api_client_from_kubeconfig

REPO = Path(__file__).resolve().parents[1]
QUIET_FOR = 20.0
"""After ``--settle``, the window starts once the group is Degraded (settled: every
partition unowned, its marks written) and no planning pass ran for this long, or after
QUIET_MAX seconds more."""
QUIET_MAX = 240.0


def member_body(ns: str, group: str, pod: str, tick: int, per_member: int) -> Obj:
    health = {"stalledCount": 0, "lag": tick % 50 * per_member,
              "partitions": {str(p): [(tick + p) % 50, f"{1000 * tick + p}-0"]
                             for p in range(per_member)}}
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": C.member_lease_name(group, pod), "namespace": ns,
            "labels": {C.LABEL_GROUP: group, C.LABEL_ROLE: C.ROLE_MEMBER,
                       C.LABEL_MEMBER: pod},
            "annotations": {C.ANNOTATION_SESSION: f"{pod}-s1", C.ANNOTATION_EPOCH: "0",
                            C.ANNOTATION_HEALTH: json.dumps(health, separators=(",", ":"),
                                                            sort_keys=True)}},
        "spec": {"holderIdentity": pod, "leaseDurationSeconds": 8},  # marker: resourceVersion
    }


def _renew(kubeconfig: str, ns: str, group: str, pods: list[str], rvs: dict[str, str],
           renew: float, per_member: int, first: int, of: int, writes: Any, late: Any,
           stop: Any) -> None:
    """One renewer process: its share of the members (every ``of``-th from ``first``), each
    renewed every ``renew`` s, spread over the interval as N pods are. A PUT of the body
    straight through urllib3 (the client's models cost more CPU than the write)."""
    api = api_client_from_kubeconfig(Path(kubeconfig))
    pool, host = api.rest_client.pool_manager, api.configuration.host
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    token = api.configuration.get_api_key_with_prefix("authorization")
    if token:
        headers["Authorization"] = token
    mine = pods[first::of]
    url = f"{host}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/"

    def one(pod: str, tick: int) -> None:
        body = member_body(ns, group, pod, tick, per_member)
        body["metadata"]["resourceVersion"] = rvs[pod]
        name = body["metadata"]["name"]
        try:
            r = pool.request("PUT", url + name, headers=headers,
                             body=json.dumps(body).encode(), timeout=10)
            if r.status != 200:  # a conflict: read the version again
                r = pool.request("GET", url + name, headers=headers, timeout=10)
                if r.status == 200:
                    rvs[pod] = json.loads(r.data)["metadata"]["resourceVersion"]
                return
        except Exception:  # the API server is busy: next round
            return
        rvs[pod] = json.loads(r.data)["metadata"]["resourceVersion"]
        with writes.get_lock():
            writes.value += 1

    threads = concurrent.futures.ThreadPoolExecutor(8)
    tick = 0
    while not stop.is_set():
        tick += 1
        start = time.monotonic()
        futures = []
        for i, pod in enumerate(mine):
            delay = start + (i * of + first) * renew / len(pods) - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            futures.append(threads.submit(one, pod, tick))
        concurrent.futures.wait(futures)
        if time.monotonic() - start > renew * 1.25:
            with late.get_lock():
                late.value += 1
    threads.shutdown(wait=False, cancel_futures=True)


class Renewer:
    """Renews every member Lease every ``renew`` seconds from ``processes`` processes."""

    def __init__(self, st: Stage, pods: list[str], renew: float, per_member: int,
                 processes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.writes_v, self.late_v, self._stop = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event()
        rvs: dict[str, str] = {}
        for pod in pods:
            out = st.coord.create_namespaced_lease(
                st.ns, member_body(st.ns, st.group, pod, 0, per_member), _preload_content=False)
            rvs[pod] = json.loads(out.data)["metadata"]["resourceVersion"]
        self._procs = [ctx.Process(target=_renew, daemon=True, args=(
            str(st.cluster.kubeconfig), st.ns, st.group, pods, rvs, renew, per_member, i,
            processes, self.writes_v, self.late_v, self._stop)) for i in range(processes)]
        for proc in self._procs:
            proc.start()

    @property
    def writes(self) -> int:
        return int(self.writes_v.value)

    @property
    def late(self) -> int:
        return int(self.late_v.value)

    def close(self) -> None:
        self._stop.set()
        for proc in self._procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()


def one(members: int, *, partitions: int, window: float, settle: float,
        operator_from: Path | None, profile: Path | None = None) -> Obj:
    st = Stage("bench-renew")
    result: Obj = {"members": members, "partitions": partitions,
                   "operator": str(operator_from) if operator_from
                   else os.environ.get("KGROUP_OPERATOR_BIN") or "this checkout"}
    renewer = None
    try:
        pods = [f"w-{i}" for i in range(members)]
        st.pods(pods)
        st.create_group(partitions=partitions, window=None, duration=None, renew=None,
                        drain=None)
        renewer = Renewer(st, pods, 2.0, max(1, partitions // members),
                          processes=-(-members // 250))
        port = free_port()
        op = st.start_operator(metrics_port=port, env=(
            {"PYTHONPATH": f"{operator_from}:{operator_from}/operator"} if operator_from
            else None))
        time.sleep(settle)  # let it create the partition Leases and settle (Degraded)
        quiet_since, last, waited = time.monotonic(), None, time.monotonic()
        while time.monotonic() - waited < QUIET_MAX:  # then until no pass for QUIET_FOR s
            now_passes = operator_metric(port, "kgroup_planning_passes_total")
            settled = st.status().get("phase") == "Degraded"  # every partition unowned
            if now_passes is None or now_passes != last or not settled:
                quiet_since, last = time.monotonic(), now_passes
            elif time.monotonic() - quiet_since >= QUIET_FOR:
                break
            time.sleep(1.0)
        result["settled_after_s"] = round(settle + time.monotonic() - waited, 1)
        status = st.status()
        result["phase"], result["member_count"] = status.get("phase"), status.get("memberCount")
        passes = "kgroup_planning_passes_total"
        c0, p0, t0 = own_cpu_seconds(op.pid), operator_metric(port, passes), time.monotonic()
        w0 = renewer.writes
        spy = None
        if profile is not None:  # py-spy samples the thread holding the GIL
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(op.pid),
                 "-d", str(int(window)), "-r", "100", "-g", "--nonblocking", "-f", "raw",
                 "-o", str(profile)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(window)  # the measuring window
        dt = time.monotonic() - t0
        c1, p1 = own_cpu_seconds(op.pid), operator_metric(port, passes)
        result.update({
            "window_s": round(dt, 1),
            "renewals_per_s": (renewer.writes - w0) / dt,
            "operator_cores": (c1 - c0) / dt,
            "operator_rss_mb": rss_mb(op.pid),
            "planning_passes_per_s": None if p0 is None or p1 is None else (p1 - p0) / dt,
            "renew_rounds_late": renewer.late,
            "member_count_at_end": st.status().get("memberCount"),
        })
        if spy is not None:
            spy.wait(30)
    finally:
        if renewer is not None:
            renewer.close()
        st.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", default="200")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--operator-from", type=Path, default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--profile", type=Path, default=None,
                    help="py-spy's collapsed stacks of the operator over the window, to this "
                         "file (<members> appended); costs the operator some CPU")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "renewals.json")
    args = ap.parse_args()
    command = ".venv/bin/python bench/bench_renewals.py " + " ".join(sys.argv[1:])
    rows = []
    for m in (int(x) for x in args.members.split(",")):
        start = [round(x, 2) for x in os.getloadavg()]
        row = one(m, partitions=args.partitions, window=args.window, settle=args.settle,
                  operator_from=args.operator_from,
                  profile=(args.profile.with_name(f"{args.profile.name}.{m}")
                           if args.profile else None))
        row["load_average_at_start"] = start
        row["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        rows.append(row)
        print(json.dumps(row), flush=True)
    runs: Obj = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs[args.label or command] = {"command": command, "machine": machine(), "sizes": rows}
    args.out.write_text(json.dumps(runs, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
